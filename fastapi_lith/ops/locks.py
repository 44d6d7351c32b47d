"""Who holds a database open: the kernel's record of SQLite's locks, and `/proc`.

A restore or a shell migration under a running app would pull the file from under its
connections, so both ask `holders(path)` first. The lock query needs `fcntl` (Unix); it is
imported where it is used, so `import fastapi_lith` works where it does not exist and only
this check says it cannot run there.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from types import ModuleType

from ..exceptions import BackupError

# SQLite's lock bytes (https://www.sqlite.org/fileformat.html#the_lock_byte_page and
# https://www.sqlite.org/walformat.html#the_wal_index_file_format): PENDING, RESERVED and the
# 510 SHARED bytes of the database file start at 0x40000000; the -shm file has 8 WAL locks at
# byte 120 and the dead-man switch (DMS) at byte 128, on which every connection that has the
# WAL index open holds a shared lock for as long as it is open.
_DB_LOCKS = (0x40000000, 512)
_SHM_LOCKS = (120, 9)



def _fcntl() -> ModuleType:
    try:
        import fcntl
    except ImportError:
        raise BackupError(
            "checking whether another process holds the database needs POSIX locks (fcntl), "
            f"which this platform ({sys.platform}) does not have: stop the app and restore or "
            "migrate on a Unix system"
        ) from None
    return fcntl


def holders(db_path: str | Path) -> list[str]:
    """Who holds the database open, as readable strings; empty when nobody does.

    A running app holds POSIX read locks on SQLite's lock bytes: in WAL mode every open
    connection keeps a shared lock on the database file and on the `-shm` file's dead-man
    switch for as long as it is open, even while idle. (`BEGIN EXCLUSIVE` is no test: in WAL
    mode it takes only the write lock, which an idle app does not hold, so it succeeds
    against a running app.) `F_GETLK` asks the kernel whether a lock conflicts without taking
    one, and names the process. On Linux the open files in `/proc/*/fd` are checked too.

    POSIX locks belong to a process, and closing any descriptor of a file drops every lock the
    process holds on it: so this refuses to run in a process that has the database open itself.
    """
    target = Path(db_path)
    if not target.exists():
        return []
    _fcntl()  # without it, say so before looking at anything
    paths = [target, Path(f"{target}-wal"), Path(f"{target}-shm")]
    real = {os.path.realpath(p) for p in paths}
    if _open_here(real):
        raise BackupError(f"this process has {target} open: run the check from another process")
    found: dict[int | None, list[str]] = {}
    for path, (start, length) in ((target, _DB_LOCKS), (paths[2], _SHM_LOCKS)):
        locked, pid = _lock_holder(path, start, length)
        if locked:
            found.setdefault(pid, []).append(f"a lock on {path.name}")
    for pid in _pids_with_open(real):
        found.setdefault(pid, []).append("an open file")
    return [f"{_describe(pid)} holds {', '.join(what)}" for pid, what in found.items()]


def _lock_holder(path: Path, start: int, length: int) -> tuple[bool, int | None]:
    """Whether another process holds a lock in the byte range, and its pid when known."""
    fcntl = _fcntl()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    try:
        if sys.platform == "darwin":  # struct flock: l_start, l_len, l_pid, l_type, l_whence
            # pragma: no mutate start (macOS runs it; no test here can: tests/MUTATION.md)
            query = struct.pack("qqihh", start, length, 0, fcntl.F_WRLCK, os.SEEK_SET)
            _, _, pid, kind, _ = struct.unpack("qqihh", fcntl.fcntl(fd, fcntl.F_GETLK, query))
            # pragma: no mutate end
        else:  # Linux: l_type, l_whence, l_start, l_len, l_pid
            # An OFD query also sees the locks of this process's own connections.
            cmd = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
            query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
            kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, cmd, query))
    finally:
        os.close(fd)
    if kind == fcntl.F_UNLCK:
        return False, None
    return True, (pid if pid > 0 else None)  # a pid of another PID namespace reads as 0


def _open_here(real: set[str]) -> bool:
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False  # pragma: no mutate (a system without /proc: macOS)
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in real:
                return True
        except OSError:
            continue
    return False


def _pids_with_open(real: set[str]) -> list[int]:
    """Processes (that we may look at) with one of `real` open, from /proc (Linux only)."""
    me = os.getpid()
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in real:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def _describe(pid: int | None) -> str:
    if pid is None:
        return "a process"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    except OSError:
        cmd = ""
    return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")
