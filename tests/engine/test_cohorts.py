"""Cohorts: zstd streams that send the same frames share one compression, and each body still
decodes to exactly its own events, write by write, whatever each stream does meanwhile."""

from __future__ import annotations

import asyncio
import random
import threading
import weakref
from typing import Any

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.kanban.synthetic import board_html, change_card, make_cards
from fastapi_lith.engine import cohorts
from fastapi_lith.engine.fanout import Fanout
from fastapi_lith.engine.frames import Frame, sse_event
from fastapi_lith.engine.streams import KEEPALIVE, Stream
from fastapi_lith.engine.zstd import ALONE_BELOW, ZstdEncoder
from tests.support.decoders import ZstdDecoder


def boards(n: int) -> list[str]:
    """The board of 60 cards, one card changed from one to the next."""
    cards = make_cards(60, seed=3)
    out = []
    for step in range(n):
        out.append(board_html(cards))
        cards = change_card(cards, step)
    return out


BOARDS = boards(12)


def shared(html: str, key: str = "board") -> Frame:
    frame = Frame(key, html)
    frame.shared = True
    return frame


def own(tab: int, n: int) -> Frame:
    return Frame(f"outcome/{tab}", f'<p id="outcome-{tab}">move {n} of tab {tab} saved</p>')


def expected(frames: list[Frame]) -> bytes:
    """What a write sends: a stream's own frames first, then the frames others send too."""
    return b"".join(sse_event(f) for f in frames if not f.shared) + b"".join(sse_event(f) for f in frames if f.shared)


def test_streams_that_send_the_same_frames_share_one_compression() -> None:
    encoders = [ZstdEncoder() for _ in range(50)]
    bodies = [ZstdDecoder() for _ in encoders]
    made = cohorts.counts.made
    for html in BOARDS[:6]:
        frame = shared(html)
        outs = [encoder.encode_frames([frame]) for encoder in encoders]
        assert all(out is outs[0] for out in outs)  # the same bytes object, written 50 times
        assert all(body.feed(out) == sse_event(frame) for body, out in zip(bodies, outs, strict=True))
    assert cohorts.counts.made - made == 6  # once a write, not once a stream
    alone = ZstdEncoder()
    alone.encode(sse_event(shared(BOARDS[0])))
    # One window for all fifty (a slower level's, with a larger table), each counting a fiftieth.
    shares = [encoder.memory_size() for encoder in encoders]
    while_leaving = []
    for encoder, body in zip(encoders[1:], bodies[1:], strict=True):
        body.feed(encoder.hibernate())
        while_leaving.append(encoders[0].memory_size())
    window = encoders[0].memory_size()  # the last member holds it all
    assert set(shares) == {window // 50} and 0 < window < 3 * alone.memory_size()
    assert while_leaving == [window // members for members in range(49, 0, -1)]
    bodies[1].feed(encoders[1].encode_frames([frame]))  # a leaver starts a cohort of its own
    assert encoders[0].memory_size() == window
    for encoder, body in zip(encoders, bodies, strict=True):
        body.feed(encoder.close())
        assert body.clean_end


def test_a_stream_with_a_frame_of_its_own_sends_it_first_and_the_leavers_of_a_write_share_the_next() -> None:
    encoders = [ZstdEncoder() for _ in range(10)]
    bodies = [ZstdDecoder() for _ in encoders]
    first = shared(BOARDS[0])
    for encoder, body in zip(encoders, bodies, strict=True):
        body.feed(encoder.encode_frames([first]))
    second = shared(BOARDS[1])
    made = cohorts.counts.made
    outs = []
    for tab, (encoder, body) in enumerate(zip(encoders, bodies, strict=True)):
        frames = [own(tab, 1), second] if tab < 4 else [second]
        out = encoder.encode_frames(frames)
        assert body.feed(out) == expected(frames)
        outs.append(out)
    # The six that stayed share a write; the four that left share a new cohort's first write.
    assert cohorts.counts.made - made == 2
    assert len({out[-200:] for out in outs[:4]}) == 1 and len({id(out) for out in outs[4:]}) == 1
    third = shared(BOARDS[2])
    made = cohorts.counts.made
    for encoder, body in zip(encoders, bodies, strict=True):
        assert body.feed(encoder.encode_frames([third])) == sse_event(third)
    assert cohorts.counts.made - made == 2  # two cohorts now, each compressed once


def test_a_cohorts_writes_are_compressed_harder_than_a_streams_own_and_only_the_last_few_kept() -> None:
    """Compressed once for every member, a cohort's write can afford zstd's level 6: fewer bytes
    than a stream's own window at level 1 sends for the same frames."""
    own, member, other = ZstdEncoder(), ZstdEncoder(), ZstdEncoder()
    own_bytes = cohort_bytes = 0
    for html in BOARDS[:8]:
        frame = shared(html)
        own_bytes += len(own.encode(sse_event(frame)))
        cohort_bytes += len(member.encode_frames([frame]))
        other.encode_frames([frame])
    assert cohort_bytes < 0.9 * own_bytes
    cohort = member._cohort  # noqa: SLF001 - its writes kept for members a write or two behind
    assert cohort is not None and cohort is other._cohort and cohort.position == 8  # noqa: SLF001
    assert sorted(cohort._made) == [0, *range(8 - cohorts.KEPT, 8)]  # noqa: SLF001 - the first, and the last few


def test_a_cohort_compresses_at_zstd_level_6_with_the_parameters_it_names() -> None:
    member = ZstdEncoder()
    frame = shared(BOARDS[0])
    out = member.encode_frames([frame])
    cohort = member._cohort  # noqa: SLF001
    assert cohort is not None
    params = cohort.params
    assert params.strategy == zstandard.ZstdCompressionParameters.from_level(6).strategy
    chunker: Any = zstandard.ZstdCompressor(compression_params=params).chunker(chunk_size=1024)
    assert out == b"".join([*chunker.compress(sse_event(frame)), *chunker.flush()])


def test_a_member_given_other_frames_than_the_cohorts_next_write_leaves() -> None:
    """Two members at the same write, one sent the tick's frame, the other a frame it alone
    takes (its patches start from a render it showed before): each body shows its own."""
    first, second = ZstdEncoder(), ZstdEncoder()
    bodies = ZstdDecoder(), ZstdDecoder()
    start = shared(BOARDS[0])
    for encoder, body in zip((first, second), bodies, strict=True):
        body.feed(encoder.encode_frames([start]))
    tick, behind = shared(BOARDS[1]), shared(BOARDS[2])
    assert bodies[0].feed(first.encode_frames([tick])) == sse_event(tick)
    assert bodies[1].feed(second.encode_frames([behind])) == sse_event(behind)
    assert first._cohort is not second._cohort  # noqa: SLF001


def test_streams_with_other_settings_never_share_a_cohort() -> None:
    frame = shared(BOARDS[0])
    kinds = [ZstdEncoder(), ZstdEncoder(), ZstdEncoder(level=9), ZstdEncoder(window_log=19), ZstdEncoder.dense()]
    for encoder in kinds:
        encoder.encode_frames([frame])
    found = [encoder._cohort for encoder in kinds]  # noqa: SLF001
    assert found[0] is found[1]
    assert len({id(c) for c in found}) == 4


def test_a_member_that_sat_out_more_writes_than_are_kept_leaves_and_still_decodes() -> None:
    ahead, behind = ZstdEncoder(), ZstdEncoder()
    bodies = ZstdDecoder(), ZstdDecoder()
    first = shared(BOARDS[0])
    for encoder, body in zip((ahead, behind), bodies, strict=True):
        body.feed(encoder.encode_frames([first]))
    frames = [shared(html) for html in BOARDS[1 : cohorts.KEPT + 3]]
    for frame in frames:
        bodies[0].feed(ahead.encode_frames([frame]))
    # It never took those writes; had it been given the cohort's next one, it would decode
    # against a history it does not have.
    last = frames[-1]
    assert bodies[1].feed(behind.encode_frames([last])) == sse_event(last)
    assert behind._cohort is not ahead._cohort  # noqa: SLF001


def test_a_small_write_goes_alone_and_a_larger_board_starts_a_cohort_sized_for_it() -> None:
    encoder = ZstdEncoder()
    body = ZstdDecoder()
    small = shared('<p id="count">1</p>')
    assert len(sse_event(small)) < ALONE_BELOW
    assert body.feed(encoder.encode_frames([small])) == sse_event(small)
    assert encoder.hibernating  # a frame of its own: no window held
    board = shared(BOARDS[0][:20_000])
    assert body.feed(encoder.encode_frames([board])) == sse_event(board)
    fits = encoder.memory_size()
    larger = shared(BOARDS[1] * 3)
    assert body.feed(encoder.encode_frames([larger])) == sse_event(larger)
    assert encoder.memory_size() > fits
    body.feed(encoder.close())
    assert body.clean_end


# What a stream may do at a tick: take the tick's frame as the others do, with a frame of its own
# too, a frame nobody else takes (it skipped one: its patches start from an older render), a
# keep-alive, a write through the plain `encode`, hibernate, or nothing.
ACTIONS = ["take", "own", "own two", "other", "keepalive", "plain", "plain board", "hibernate", "nothing"]
SETTINGS: list[dict[str, Any]] = [{}, {"window_log": 17}, {"hash_log": None}]


@settings(max_examples=60, deadline=None)
@given(ticks=st.lists(st.lists(st.sampled_from(ACTIONS), min_size=4, max_size=4), min_size=1, max_size=10),
       boards=st.lists(st.sampled_from(range(len(BOARDS))), min_size=10, max_size=10),
       setting=st.sampled_from(SETTINGS))
def test_every_body_decodes_to_its_own_events_write_by_write(
    ticks: list[list[str]], boards: list[int], setting: dict[str, Any]
) -> None:
    encoders = [ZstdEncoder(**setting) for _ in range(4)]
    bodies = [ZstdDecoder() for _ in encoders]
    for n, actions in enumerate(ticks):
        frame = shared(BOARDS[boards[n]])
        for tab, (action, encoder, body) in enumerate(zip(actions, encoders, bodies, strict=True)):
            if action == "nothing":
                continue
            if action == "hibernate":
                assert body.feed(encoder.hibernate()) == b""
                assert encoder.hibernating
                continue
            if action in ("keepalive", "plain", "plain board"):
                event = {"keepalive": KEEPALIVE, "plain": sse_event(own(tab, n)), "plain board": sse_event(frame)}[action]
                write = encoder.encode_asleep if action == "keepalive" else encoder.encode
                assert body.feed(write(event)) == event
                continue
            frames = {
                "take": [frame],
                "own": [own(tab, n), frame],
                "own two": [own(tab, n), frame, own(tab + 10, n)],
                "other": [shared(BOARDS[(boards[n] + 1) % len(BOARDS)])],
            }[action]
            assert body.feed(encoder.encode_frames(frames)) == expected(frames)
    for encoder, body in zip(encoders, bodies, strict=True):
        assert body.feed(encoder.close()) == b""
        assert body.clean_end


def test_workers_share_cohorts_and_every_body_decodes() -> None:
    """Two threads encode the streams of one cohort at once, as the fan-out's workers do."""
    rng = random.Random(7)
    encoders = [ZstdEncoder() for _ in range(40)]
    bodies = [ZstdDecoder() for _ in encoders]
    errors: list[BaseException] = []
    for n, html in enumerate(BOARDS):
        frame = shared(html)
        jobs = [(tab, [own(tab, n), frame] if rng.random() < 0.2 else [frame]) for tab in range(40)]
        outs: dict[int, bytes] = {}

        def work(part: list[tuple[int, list[Frame]]], outs: dict[int, bytes]) -> None:
            try:
                for tab, frames in part:
                    outs[tab] = encoders[tab].encode_frames(frames)
            except BaseException as exc:  # noqa: BLE001 - the test fails with it below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(jobs[i::2], outs)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        for tab, frames in jobs:
            assert bodies[tab].feed(outs[tab]) == expected(frames)


@pytest.mark.parametrize("members", [1, 3])
def test_a_cohort_is_freed_with_its_last_member(members: int) -> None:
    encoders = [ZstdEncoder() for _ in range(members)]
    frame = shared(BOARDS[4])
    for encoder in encoders:
        encoder.encode_frames([frame])
    cohort: Any = encoders[0]._cohort  # noqa: SLF001 - what the weak reference should not keep
    assert cohort is not None and cohort.members == members
    ref = weakref.ref(cohort)
    del cohort
    for encoder in encoders:
        assert encoder.hibernate() == cohorts.EPILOGUE
    assert ref() is None


async def test_a_broadcast_through_the_fanout_compresses_the_board_once_a_tick() -> None:
    """Streams fed by the fan-out as the hub feeds them: each tick's frame offered to all."""
    fanout = Fanout(workers=2)
    streams = [Stream(f"t{i}") for i in range(60)]
    bodies = [ZstdDecoder() for _ in streams]
    texts = [b""] * len(streams)

    async def read(i: int) -> None:
        async for chunk in streams[i].body(ZstdEncoder(), fanout=fanout):
            texts[i] += bodies[i].feed(chunk)

    tasks = [asyncio.create_task(read(i)) for i in range(len(streams))]
    try:
        made = cohorts.counts.made
        for n, html in enumerate(BOARDS[:5]):
            frame = shared(html)
            for stream in streams:
                stream.offer(frame)
            event = sse_event(frame)
            deadline = asyncio.get_running_loop().time() + 20
            while not all(text.endswith(event) for text in texts):
                assert asyncio.get_running_loop().time() < deadline, f"frame {n}"
                await asyncio.sleep(0.005)
        assert cohorts.counts.made - made == 5
    finally:
        for stream in streams:
            stream.end()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        fanout.close()
    assert all(body.clean_end for body in bodies)
