"""`Flag`: `asyncio.Event`'s set, clear and wait, holding nothing while nobody waits.

Every open stream has one, and so does each view instance (every tab's own outcome is one), so
at ten thousand tabs they are twenty thousand. An `asyncio.Event` keeps a `collections.deque`
for its waiters from the start, a few hundred bytes even when empty (bench/memory.py finds
them per tab); a `Flag` keeps a list only while a coroutine waits on it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Flag"]


class Flag:
    """Set, clear, and wait until set: `asyncio.Event`'s semantics, on the running loop."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Wake every waiter; a later `wait` returns at once until `clear`."""
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        """Return once the flag is set (at once if it is). Cancelling the wait leaves it as it was."""
        if self._set:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = [waiter]
        else:
            self._waiters.append(waiter)
        try:
            await waiter
        finally:
            # Set meanwhile: set() took the list. Cancelled (a timeout): this waiter leaves it,
            # so a wait that times out again and again keeps nothing.
            waiters = self._waiters
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    self._waiters = None
