"""`Flag`: asyncio.Event's semantics, and nothing kept while nobody waits."""

from __future__ import annotations

import asyncio

import pytest

from fastapi_lith.engine.flag import Flag


async def test_a_wait_returns_once_set_and_at_once_while_set() -> None:
    flag = Flag()
    waiting = asyncio.ensure_future(flag.wait())
    await asyncio.sleep(0)  # the waiter is parked on the flag
    assert not waiting.done() and not flag.is_set()
    flag.set()
    await asyncio.wait_for(waiting, 5)
    assert flag.is_set()
    await asyncio.wait_for(flag.wait(), 5)  # still set: no wait at all
    flag.clear()
    assert not flag.is_set()
    again = asyncio.ensure_future(flag.wait())
    await asyncio.sleep(0)
    assert not again.done()  # cleared: the next wait waits
    flag.set()
    await asyncio.wait_for(again, 5)


async def test_every_waiter_wakes_at_one_set() -> None:
    flag = Flag()
    waiters = [asyncio.ensure_future(flag.wait()) for _ in range(5)]
    await asyncio.sleep(0)
    flag.set()
    flag.set()  # a second set while set changes nothing
    await asyncio.wait_for(asyncio.gather(*waiters), 5)


async def test_a_wait_that_times_out_leaves_nothing_and_spares_the_others() -> None:
    flag = Flag()
    staying = asyncio.ensure_future(flag.wait())
    for _ in range(1000):  # as a stream's `next(timeout)` does while nothing comes
        try:
            async with asyncio.timeout(0):
                await flag.wait()
        except TimeoutError:
            pass
    assert flag._waiters is not None and len(flag._waiters) == 1  # noqa: SLF001 - the one still waiting
    flag.set()
    await asyncio.wait_for(staying, 5)
    assert flag._waiters is None  # noqa: SLF001


async def test_a_cancelled_waiter_does_not_stop_the_set_from_waking_the_rest() -> None:
    flag = Flag()
    cancelled, woken = asyncio.ensure_future(flag.wait()), asyncio.ensure_future(flag.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    flag.set()
    await asyncio.wait_for(woken, 5)
    assert cancelled.cancelled()


async def test_a_lone_wait_that_timed_out_leaves_the_flag_to_wait_on_again() -> None:
    """A stream with nothing to send times out its waits one after another, none beside it."""
    flag = Flag()
    for _ in range(2):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):
                await flag.wait()
    waiting = asyncio.ensure_future(flag.wait())
    await asyncio.sleep(0)
    flag.set()
    await asyncio.wait_for(waiting, 5)
    assert flag._waiters is None  # noqa: SLF001 - nothing kept
