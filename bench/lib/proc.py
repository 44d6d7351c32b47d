"""What processes cost, read from /proc: CPU, the wait for a CPU, memory, per thread.

One reader for every scenario. A `Usage` is a snapshot of a process tree (a uvicorn parent
and its workers, a database server, or this process); two snapshots make a `Window`, whose
figures are per second of wall time, so "cores" reads directly:

    window = Window.open(pid)            # pid=None: this process
    ... measure ...
    w = window.close()                   # w.cores, w.waiting, w.others, w.rss_mib

`ThreadClocks` splits this process's CPU by thread role (event loop, writer, readers).

`waiting` is how long the tree's threads sat runnable without a CPU (schedstat), and `others`
how many cores the rest of the machine kept busy: on a shared machine these say how far a
figure can be trusted.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """The process and its children (uvicorn's supervisor and its workers), one level deep
    below each: enough for every server a scenario starts."""
    found = [pid]
    for p in (pid, *children(pid)):
        if p != pid:
            found.append(p)
            found += children(p)
    return list(dict.fromkeys(found))


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def listens(pid: int, port: int) -> bool:
    """Whether `pid` or a process of its tree holds the socket that listens on TCP `port`: a port
    that answers may be another server's, which took it between `free_port()` and this bind."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = [line.split() for line in Path(table).read_text().splitlines()[1:]]
        except OSError:
            continue
        inodes.update(r[9] for r in rows if r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port)
    sockets = {f"socket:[{inode}]" for inode in inodes}
    for member in tree(pid):
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{member}/fd/{fd}") in sockets:
                    return True
            except OSError:
                continue
    return False


def _stat_fields(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces


@dataclass
class Usage:
    """One snapshot of a process tree."""

    at: float
    cpu: float  # seconds of user + system time, every thread
    waiting: float  # seconds runnable but not running, every thread
    rss: int  # bytes resident now, summed
    hwm: int  # bytes resident at the peak, summed
    machine_busy: float  # seconds the whole machine was busy (all cores)

    @classmethod
    def of(cls, pid: int | None = None) -> Usage:
        pids = tree(pid) if pid is not None else [os.getpid()]
        cpu = waiting = 0.0
        rss = hwm = 0
        for p in pids:
            fields = _stat_fields(Path(f"/proc/{p}/stat"))
            if fields is None:
                continue
            # utime, stime, and the reaped children's cutime, cstime: fields 14-17 of stat (11-14
            # here). A tree's root counts its children that exited (a database's backends).
            cpu += (int(fields[11]) + int(fields[12])) / CLK_TCK
            if pid is not None and p == pid:
                cpu += (int(fields[13]) + int(fields[14])) / CLK_TCK
            rss_now, peak = memory(p)
            rss, hwm = rss + rss_now, hwm + peak
            try:
                tasks = list(Path(f"/proc/{p}/task").iterdir())
            except OSError:
                continue
            for task in tasks:
                try:
                    waiting += int((task / "schedstat").read_text().split()[1]) / 1e9
                except (OSError, IndexError, ValueError):
                    pass
        return cls(time.perf_counter(), cpu, waiting, rss, hwm, machine_busy())


def memory(pid: int | None = None) -> tuple[int, int]:
    """(VmRSS, VmHWM) of one process, in bytes."""
    rss = hwm = 0
    try:
        lines = Path(f"/proc/{pid or 'self'}/status").read_text().splitlines()
    except OSError:
        return 0, 0
    for line in lines:
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def rss(pid: int | None = None) -> int:
    """Bytes resident now (VmRSS), of one process."""
    return memory(pid)[0]


def machine_busy() -> float:
    """Seconds the machine's cores have been busy since boot, from /proc/stat (steal counted)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def thread_group(name: str) -> str:
    """A thread's role from its name: the library names its threads lith-writer, lith-reader..."""
    if name.startswith("lith-writer"):
        return "writer"
    if name.startswith("lith-reader"):
        return "readers"
    if name.startswith("lith-"):
        return "other lith"
    return "loop and others"


@dataclass
class Figures:
    """What a window cost, per second of wall time."""

    seconds: float
    cores: float  # CPU of the tree
    waiting: float  # cores' worth of its threads waiting for a CPU
    others: float  # cores the rest of the machine kept busy (this process excluded too)
    rss_mib: float


class Window:
    """CPU and memory of a process tree (`pid` None: this process) between `open` and `close`."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.own = os.times()
        self.start = Usage.of(pid)

    @classmethod
    def open(cls, pid: int | None = None) -> Window:
        return cls(pid)

    def close(self) -> Figures:
        end = Usage.of(self.pid)
        own = os.times()
        wall = end.at - self.start.at or float("nan")
        tree_cpu = end.cpu - self.start.cpu
        mine = (own.user + own.system) - (self.own.user + self.own.system)
        counted = tree_cpu + (mine if self.pid is not None else 0.0)
        busy = end.machine_busy - self.start.machine_busy
        return Figures(seconds=wall, cores=tree_cpu / wall, waiting=(end.waiting - self.start.waiting) / wall,
                       others=max(0.0, (busy - counted) / wall), rss_mib=end.rss / 2**20)


class ThreadClocks:
    """CPU of this process's threads by role, from their Python names (the library names its
    threads lith-writer-0, lith-reader-1, ...; the OS sees them all as the interpreter)."""

    def __init__(self) -> None:
        self.clocks: dict[str, int] = {}
        for t in threading.enumerate():
            if t.ident is not None and t.is_alive():
                try:
                    self.clocks[f"{t.name}#{t.ident}"] = time.pthread_getcpuclockid(t.ident)
                except OSError:
                    continue
        self.start = self.read()
        self.at = time.perf_counter()

    def read(self) -> dict[str, float]:
        out = {}
        for name, clock in self.clocks.items():
            try:
                out[name] = time.clock_gettime(clock)
            except OSError:
                continue
        return out

    def cores(self) -> dict[str, float]:
        """Cores per role since this was made (threads started since are not counted)."""
        end, wall = self.read(), time.perf_counter() - self.at
        groups: dict[str, float] = {}
        for name, seconds in end.items():
            role = "loop" if name.startswith("MainThread") else thread_group(name)
            groups[role] = groups.get(role, 0.0) + (seconds - self.start.get(name, seconds)) / wall
        return groups
