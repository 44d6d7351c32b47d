"""Threads that run blocking database work for the event loop: the writer's one, the readers'.

Lighter than `run_in_executor`: a call is one `SimpleQueue.put` and its answer one
`call_soon_threadsafe`, 46 µs a round trip against 75 µs through an executor here; the writer
makes hundreds a second and the hub as many. (Threads of one process: the processes that serve
one database, `--workers N`, are another thing; see docs/workers.md.)
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
# One call as it waits for a thread: where to answer, the future to set, the function, its arguments.
Call = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]]


class Threads:
    """A few threads that take calls from the event loop, one hop each way per call."""

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, fut, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                loop.call_soon_threadsafe(_fail, fut, exc)
            else:
                loop.call_soon_threadsafe(_succeed, fut, result)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of the threads; an exception it raises is raised here."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any, settled: bool = False) -> asyncio.Future[T]:
        """Queue `fn(*args)`; the future holds its outcome.

        With `settled`, the future cannot be cancelled: a task cancelled while awaiting it
        gets its `CancelledError` only once the outcome is in (see `Writer._run`).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = _Settled(loop=loop) if settled else loop.create_future()
        self._queue.put((loop, fut, fn, args))
        return fut

    def close(self) -> None:
        """Finish the queued calls, then end the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()


class _Settled(asyncio.Future):  # type: ignore[type-arg]
    """A future that refuses `cancel()`: a task awaiting it is cancelled after it completes."""

    def cancel(self, msg: Any = None) -> bool:
        return False


def _succeed(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.cancelled():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.cancelled():
        fut.set_exception(exc)
