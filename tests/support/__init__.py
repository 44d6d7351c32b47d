"""What the tests share: the browser and PostgreSQL harnesses, the helper apps they serve and
their migrations, and the board the encoder tests render."""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent
"""This folder: uvicorn serves a helper app (`streamapp:app`, ...) with it as the working directory."""
REPO = SUPPORT.parent.parent
"""The checkout: the examples, docs and deploy files the tests run."""
CHILD_HANG_LIMIT = 120
"""Seconds before a test whose child process imports the package counts as hung: in mutmut's
copy every module carries all its mutants, and that import alone can pass `make mutate`'s
limit for a hang (tests/MUTATION.md)."""


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child process that imports the package.

    mutmut's stats run records the functions each test calls in its own process only: a child
    that inherited `MUTANT_UNDER_TEST=stats` would look for mutmut's settings in its working
    directory, and fail. Any other value (a mutant's name) is kept, so the child runs it too."""
    if env.get("MUTANT_UNDER_TEST") == "stats":
        return {k: v for k, v in env.items() if k != "MUTANT_UNDER_TEST"}
    return env


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """Ask `check` (a coroutine function) until it gives something true; that, or a failure."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


def holds(condition: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """A plain `condition` as `until` asks it: checked on the loop, between its polls."""

    async def check() -> object:
        return condition()

    return check


def line_with(lines: Iterator[str], text: str, timeout: float = 60.0) -> str:
    """The next line of a stream's body that holds `text`; each wait is bounded by the stream's
    keep-alives (and the client's read timeout), the whole by `timeout`."""
    deadline = time.monotonic() + timeout
    for line in lines:
        if text in line:
            return line
        assert time.monotonic() < deadline, f"no line with {text!r}"
    raise AssertionError(f"the stream ended before a line with {text!r}")


def to_the_end(lines: Iterator[str], timeout: float = 60.0) -> None:
    """Read a stream's body until the server ends it."""
    deadline = time.monotonic() + timeout
    for _ in lines:
        assert time.monotonic() < deadline, "the stream did not end"


def fill_disk(disk: Path) -> Path:
    """Write a file until the disk refuses another byte."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while chunk:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                chunk = chunk[: len(chunk) // 2]
    return filler
_CRASH = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")  # everything stays in the -wal
conn.execute(sys.argv[2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def crash_after(db_path: Path, sql: str) -> None:
    """Commit `sql` to the WAL database `db_path` in a process then killed with SIGKILL: its
    `-wal` and `-shm` stay as a crash leaves them, the commit never checkpointed."""
    done = subprocess.run([sys.executable, "-c", _CRASH, str(db_path), sql], timeout=30)
    assert done.returncode == -signal.SIGKILL
    assert Path(f"{db_path}-wal").stat().st_size > 0
