"""Memory that ending and hibernating streams free, handed back to the operating system.

A zstd compressor is tens of KiB of C heap. Thousands of tabs open, each allocating one between
the Python objects of its request; once they go idle and hibernate, glibc keeps the freed
blocks, stranded between live objects, and the process's RSS does not fall: a hibernated tab
kept a few KiB more than a tab that never compressed (bench/memory.py). `malloc_trim(0)` gives
the whole free pages inside the heap back to the system.

A trim walks the heap's free blocks with every allocation in the process waiting, so one runs
`RELEASE_AFTER` seconds after a stream freed its compressor, for every stream that freed one
meanwhile, and never more often. Where the C library has no `malloc_trim` (musl, macOS)
nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import weakref
from collections.abc import Callable

__all__ = ["RELEASE_AFTER", "freed", "releases"]

# Seconds from the first free to the trim that returns it, and the least time between trims.
RELEASE_AFTER = 5.0


def _find_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
    return trim


_trim = _find_trim()
# The trim each loop has due: a stream of that loop freeing meanwhile is returned by it.
_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.TimerHandle] = weakref.WeakKeyDictionary()
releases = 0  # trims run in this process


def freed(loop: asyncio.AbstractEventLoop) -> None:
    """A stream freed its compressor: return the memory to the system within `RELEASE_AFTER` s."""
    if _trim is not None and loop not in _pending:
        _pending[loop] = loop.call_later(RELEASE_AFTER, _release, loop, _trim)


def _release(loop: asyncio.AbstractEventLoop, trim: Callable[[int], int]) -> None:
    global releases
    del _pending[loop]  # a free from now on needs a trim of its own
    trim(0)
    releases += 1
