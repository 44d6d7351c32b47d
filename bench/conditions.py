"""The conditions a benchmark ran under, printed first so every figure can be read in context.

    from conditions import conditions, format_conditions, load_average
    print(format_conditions(conditions(loop="asyncio")))
    ...
    print("load average at the end:", load_average())

Machines here are shared and noisy: the load average before and after a run says how much the
figures can be trusted. Nothing here changes state (no git command that writes, no installs).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import sqlite3
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_PACKAGES = (
    "fastapi-lith",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "aiosqlite",
    "pydantic",
    "pydantic-core",
    "uvloop",
    "sse-starlette",
    "zstandard",
    "brotli",
    "htpy",
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_mhz() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return f"{float(line.split(':', 1)[1]):.0f} MHz"
    except (OSError, ValueError):
        pass
    return None


def hypervisor() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Hypervisor vendor:"):
            return line.split(":", 1)[1].strip()
    return None


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "n/a"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of the whole machine, from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class OtherLoad:
    """How many cores *other* processes kept busy during a window: the noise beside a figure.

        other = OtherLoad(); ...measure...; cores = other.stop()

    Machine-wide busy time from /proc/stat minus this process's CPU time (all its threads).
    """

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._machine = cpu_jiffies()
        self._own = os.times()
        self._wall = os.times().elapsed

    def stop(self) -> float:
        machine, own = cpu_jiffies(), os.times()
        if machine is None or self._machine is None:
            return float("nan")
        wall = own.elapsed - self._wall
        if wall <= 0:
            return float("nan")
        tick = os.sysconf("SC_CLK_TCK")
        busy = (machine[0] - self._machine[0]) / tick
        mine = (own.user + own.system) - (self._own.user + self._own.system)
        return max(0.0, (busy - mine) / wall)


def wait_for_quiet(max_seconds: float, threshold: float = 0.35, sample: float = 0.5) -> float:
    """Wait up to `max_seconds` until other processes use fewer than `threshold` cores.

    Returns the last sampled load of the others (cores). A shared machine cannot be made quiet,
    only waited for: the caller should still report the load it measured beside each figure.
    """
    import time

    deadline = time.monotonic() + max_seconds
    while True:
        probe = OtherLoad()
        time.sleep(sample)
        cores = probe.stop()
        if cores != cores or cores < threshold or time.monotonic() >= deadline:
            return cores


def memory() -> str | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return None


def filesystem(path: str | Path) -> str | None:
    """The filesystem type a path lives on (fsync costs differ wildly: ext4, tmpfs, overlay)."""
    try:
        out = subprocess.run(
            ["df", "-PT", str(path)], capture_output=True, text=True, timeout=5
        ).stdout.splitlines()
        fields = out[-1].split()
        return f"{fields[1]} ({fields[0]})"
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def versions(packages: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str]:
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def git_head() -> str | None:
    """The commit checked out (read-only: `git rev-parse`)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def source_digest(*relative: str) -> str:
    """A short hash of the files measured, since the working tree may differ from the commit."""
    h = hashlib.sha256()
    for rel in relative:
        try:
            h.update((ROOT / rel).read_bytes())
        except OSError:
            h.update(b"missing:" + rel.encode())
    return h.hexdigest()[:10]


def conditions(
    *,
    loop: str | None = None,
    packages: Iterable[str] = DEFAULT_PACKAGES,
    tmpdir: str | Path | None = None,
    sources: Iterable[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """Everything a reader needs to weigh a figure: machine, interpreter, SQLite, load, date."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    found: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}" + (f" @ {cpu_mhz()}" if cpu_mhz() else ""),
        "hypervisor": hypervisor(),
        "cores": f"{os.cpu_count()} logical, {usable} usable",
        "memory": memory(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": f"{sqlite3.sqlite_version} (module sqlite3, threadsafety {sqlite3.threadsafety})",
        "load average": load_average(),
        "event loop": loop,
        "libraries": ", ".join(f"{k} {v}" for k, v in versions(packages).items()),
        "git": git_head(),
    }
    sources = tuple(sources)
    if sources:
        found["sources"] = f"{', '.join(sources)} sha256 {source_digest(*sources)}"
    if tmpdir is not None:
        found["temp dir"] = f"on {filesystem(tmpdir)}"  # where, not which path: results name none
    found.update(extra)
    return {k: v for k, v in found.items() if v is not None}


def format_conditions(found: dict[str, Any], prefix: str = "") -> str:
    width = max(len(k) for k in found)
    return "\n".join(f"{prefix}{k + ':':<{width + 1}} {v}" for k, v in found.items())


def one_line(found: dict[str, Any]) -> str:
    """The conditions as one line, for a results file."""
    keys = ("date", "machine", "hypervisor", "cores", "os", "python", "sqlite", "load average",
            "event loop", "temp dir", "git", "sources")
    parts = [f"{k}: {found[k]}" for k in keys if k in found]
    return "; ".join(parts)


def print_conditions(**kwargs: Any) -> dict[str, Any]:
    found = conditions(**kwargs)
    print("Conditions")
    print(format_conditions(found, prefix="  "))
    print(flush=True)
    return found


if __name__ == "__main__":
    print_conditions(loop="asyncio")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0–100) of `values`; nan when empty."""
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]
