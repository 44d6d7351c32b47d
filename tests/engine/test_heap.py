"""Memory that hibernating and ending streams free goes back to the system (engine/heap.py)."""

from __future__ import annotations

import asyncio
import ctypes.util
import logging

import pytest

from fastapi_lith.engine import heap
from fastapi_lith.engine.encoders import ZstdEncoder
from fastapi_lith.engine.frames import Frame
from fastapi_lith.engine.streams import Stream
from tests.support import until

pytestmark = pytest.mark.skipif(heap._trim is None, reason="this C library has no malloc_trim")

TABS = 400


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.fixture
def quick_release(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(heap, "RELEASE_AFTER", 0.05)
    return 0.05


def test_the_c_librarys_trim_is_found_on_linux() -> None:
    assert ctypes.util.find_library("c") is not None
    assert heap._trim is not None


@pytest.mark.parametrize("how", ["hibernated", "ended"])
async def test_what_idle_or_ended_streams_freed_goes_back_to_the_system(quick_release: float, how: str) -> None:
    streams = [Stream(f"t{i}") for i in range(TABS)]
    encoders = [ZstdEncoder() for _ in streams]
    first_frames = 0
    base = rss()

    async def tab(stream: Stream, encoder: ZstdEncoder) -> None:
        nonlocal first_frames
        hibernate_after = 0.5 if how == "hibernated" else 60
        async for _chunk in stream.body(encoder, keepalive=60, hibernate_after=hibernate_after):
            first_frames += 1 if not encoder.hibernating else 0

    for i, stream in enumerate(streams):
        stream.offer(Frame("v", f"<p id='v'>{f'tab {i} ' * 200}</p>"))  # large enough to open a window
    bodies = [asyncio.create_task(tab(s, e)) for s, e in zip(streams, encoders, strict=True)]
    # Python objects that outlive the compressors, between them in the heap: a tab's request.
    pinned = [bytearray(1024) for _ in streams]
    try:
        async def all_awake() -> bool:
            return first_frames >= TABS

        await until(all_awake)
        awake = rss()
        released = heap.releases
        if how == "ended":
            for stream in streams:
                stream.end()

        async def all_freed_and_released() -> bool:
            freed = all(e.hibernating for e in encoders) if how == "hibernated" else all(b.done() for b in bodies)
            return freed and heap.releases > released

        await until(all_freed_and_released)
        # Kept by glibc, the compressors' blocks would hold the RSS where it was while awake.
        assert rss() - base < (awake - base) / 2
    finally:
        for stream in streams:
            stream.end()
        await asyncio.gather(*bodies)
    assert len(pinned) == TABS


async def test_a_burst_of_frees_is_returned_by_one_trim_and_a_later_free_by_another(
    quick_release: float, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    before = heap.releases
    for _ in range(100):
        heap.freed(loop)
    # Timers run in the order of their times: each trim the frees asked for runs before this.
    settled = loop.create_future()
    loop.call_later(2 * quick_release, settled.set_result, None)
    await settled
    assert heap.releases == before + 1

    heap.freed(loop)

    async def released_again() -> bool:
        return heap.releases == before + 2

    await until(released_again)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no trim's callback failed
