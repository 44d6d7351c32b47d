"""The conditions a figure was measured under, printed first so it can be read in context.

Machines here are shared and noisy: the load average before and after a run says how far the
figures can be trusted. Nothing here changes state (no git command that writes, no installs).
"""

from __future__ import annotations

import datetime
import os
import platform
import sqlite3
import subprocess
import time
from importlib import metadata
from pathlib import Path

from .checkout import LIBRARY

PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "sqlalchemy", "pydantic", "zstandard",
            "brotli", "htpy", "psycopg")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "?"


def commit(root: Path = LIBRARY) -> str:
    """The library's commit, marked `+changes` when its files differ from it (read-only git)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "fastapi_lith", "examples"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (head or "?") + (" +changes" if dirty else "")


def versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def speed(additions: int = 1_000_000, tries: int = 3) -> str:
    """How fast this machine runs Python now: the best of `tries` loops of `additions` additions.
    The same build measures differently from hour to hour here; this tells a slow hour from a
    slow build when two runs on different hours are compared."""
    best = min(_loop(additions) for _ in range(tries))
    return f"{additions:,} additions in a Python loop in {best * 1000:.0f} ms (best of {tries})"


def _loop(additions: int) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(additions):
        total += i
    return time.perf_counter() - started


def conditions() -> dict[str, str]:
    """Everything a reader needs to weigh a figure: machine, load, interpreter, versions, commit."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()}, {platform.system()} {platform.release()}",
        "load average": load_average(),
        "speed": speed(),
        "python": f"{platform.python_implementation()} {platform.python_version()}, SQLite {sqlite3.sqlite_version}",
        "libraries": versions(),
        "commit": commit(),
    }


def conditions_line() -> str:
    return "; ".join(f"{k}: {v}" for k, v in conditions().items())


def caption(command: str) -> str:
    """A plot's caption: the command that drew it and the conditions it ran under, in brief."""
    c = conditions()
    load = f"load average {c['load average']}, {c['python']}, commit {c['commit']}"
    return f"{command}\n{c['date']}, {c['machine']}\n{load}"
