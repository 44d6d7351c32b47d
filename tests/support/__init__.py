"""What the tests share: the browser and PostgreSQL harnesses, the helper apps they serve and
their migrations, and the board the encoder tests render."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
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


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """Ask `check` (a coroutine function) until it gives something true; that, or a failure."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.05)
