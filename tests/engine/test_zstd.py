"""zstd: windows sized from the writes, small writes alone, hibernation, and its presets."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
import zstandard
from datastar_py.sse import ServerSentEventGenerator as SSE

from fastapi_lith.engine.zstd import ALONE_BELOW, ZstdEncoder
from fastapi_lith.exceptions import EncoderClosed
from tests.support.decoders import ZstdDecoder, board_frames_40, decode_body, sizes_after_first


@pytest.fixture(scope="module")
def frames() -> list[bytes]:
    return board_frames_40()  # the 142 KB board


def test_zstd_one_card_changed_costs_under_2000_bytes(frames: list[bytes]) -> None:
    assert statistics.median(sizes_after_first(ZstdEncoder(window_log=19), frames)) < 2_000


def test_zstd_dense_sends_a_third_of_the_bytes_or_less(frames: list[bytes]) -> None:
    default = sum(sizes_after_first(ZstdEncoder(), frames))
    dense = sizes_after_first(ZstdEncoder.dense(), frames)
    assert sum(dense) * 3 < default
    assert statistics.median(dense) < 200


def test_zstd_window_stays_within_what_browsers_accept(frames: list[bytes]) -> None:
    body = ZstdEncoder(window_log=19).encode(frames[0])
    assert zstandard.get_frame_parameters(body).window_size == 2**19
    low = ZstdEncoder.low_memory().encode(frames[0])
    assert zstandard.get_frame_parameters(low).window_size == 2**18
    ZstdEncoder(window_log=23)
    with pytest.raises(ValueError):
        ZstdEncoder(window_log=24)  # browsers refuse a window over 8 MiB


def test_zstd_window_follows_the_first_write(frames: list[bytes]) -> None:
    """Room for several writes of the first one's size: far enough back for a big board, small
    for a small page, never past what browsers accept."""

    def window(*first: bytes) -> int:
        encoder = ZstdEncoder()
        body = encoder.encode(*first)
        size: int = zstandard.get_frame_parameters(body).window_size
        assert encoder.memory_size() <= 1.3 * 1024 * 1024 or size > 2**20
        return size

    assert 140_000 < len(frames[0]) < 150_000
    assert window(frames[0]) == 2**20
    assert window(frames[0], b"data: outcome\n\n") == 2**20  # one write of two events
    assert window(b"x" * 10_000) == 2**16
    assert window(b"x" * 10_000, b"x" * 10_000) == 2**17  # the write's size, not its first event's
    assert window(b"x" * ALONE_BELOW) == 2**12  # the smallest write that opens a window
    assert window(b"x" * 3_000_000) == 2**23
    small = ZstdEncoder()
    small.encode(b"x" * 10_000)
    assert small.memory_size() <= 0.3 * 1024 * 1024
    # A woken stream keeps its window for writes that fit it.
    small.hibernate()
    body = small.encode(b"x" * ALONE_BELOW)
    assert zstandard.get_frame_parameters(body).window_size == 2**16
    decoder = ZstdDecoder()
    decoder.feed(body)
    decoder.feed(small.encode(b"y" * 2**14))  # a quarter of the 2^16 window: still fits, same frame
    assert decoder.frames_ended == 0
    decoder.feed(small.encode(b"z" * (2**14 + 1)))  # one byte more: a new frame, its window sized from it
    assert decoder.frames_ended == 1 and small.params.window_log == 17
    largest, decoder = ZstdEncoder(), ZstdDecoder()
    decoder.feed(largest.encode(b"x" * 3_000_000))
    decoder.feed(largest.encode(b"y" * 3_000_000))  # past a quarter of the largest window: no larger one
    assert decoder.frames_ended == 0 and largest.params.window_log == 23


def test_a_write_that_outgrows_a_sized_zstd_window_starts_a_frame_sized_from_it(frames: list[bytes]) -> None:
    """A view that starts small and grows (an empty list filling up) gets a window for what it
    sends now, in a new zstd frame of the same body, instead of one too short to repeat it."""
    encoder = ZstdEncoder()
    decoder = ZstdDecoder()
    items = "".join(f"<li>item {i}</li>" for i in range(80))
    small = f"event: datastar-patch-elements\ndata: elements <ul id='list'>{items}</ul>\n\n".encode()
    first = encoder.encode(small)
    assert zstandard.get_frame_parameters(first).window_size == 2**13
    assert decoder.feed(first) == small
    grown = encoder.encode(frames[0])
    assert decoder.feed(grown) == frames[0] and decoder.frames_ended == 1  # the small frame ended
    assert encoder.params.window_log == 20
    again = encoder.encode(frames[1])  # the next board repeats the last one: a few hundred bytes
    assert decoder.feed(again) == frames[1] and len(again) < 2_000
    assert encoder.encode(small) and encoder.params.window_log == 20  # it never shrinks
    fixed = ZstdEncoder(window_log=12)  # a window the app chose stays
    fixed.encode(small)
    fixed.encode(frames[0])
    assert fixed.params.window_log == 12 and not fixed.hibernating


def test_a_small_write_to_a_zstd_stream_with_no_window_goes_alone_and_is_compressed_once(frames: list[bytes]) -> None:
    """A counter's change sent to thousands of tabs: one zstd frame made once, the same bytes in
    every body, and no tab holds a compressor for it. A write large enough opens a window as
    ever, and small writes then go through it for a few bytes each."""
    event = SSE.patch_elements("<div id='count'>41</div>").encode()
    a, b = ZstdEncoder(), ZstdEncoder()
    alone = a.encode(event)
    assert b.encode(event) is alone  # compressed once for both
    assert a.hibernating and a.memory_size() == 0 and a.params is None
    decoder = ZstdDecoder()
    assert decoder.feed(alone) == event and decoder.frames_ended == 1
    lead = b"retry: 2500\n"
    assert decoder.feed(a.encode(lead, event)) == lead + event and decoder.frames_ended == 2
    under = b"x" * (ALONE_BELOW - 1)
    assert decoder.feed(a.encode(under)) == under and decoder.frames_ended == 3  # alone, just under

    assert decoder.feed(a.encode(frames[0])) == frames[0]  # a board opens a window
    assert not a.hibernating and a.memory_size() > 0
    through = a.encode(event)
    assert decoder.feed(through) == event and len(through) < len(alone) and decoder.frames_ended == 3
    assert decoder.feed(a.hibernate()) == b"" and decoder.frames_ended == 4
    assert decoder.feed(a.encode(event)) == event and a.hibernating  # alone again once asleep

    assert decoder.feed(a.close()) == b"" and decoder.clean_end
    assert b.close() == b""  # its body already ends a frame
    with pytest.raises(EncoderClosed):
        b.encode(event)


def test_zstd_hibernation_ends_the_frame_frees_memory_and_the_stream_goes_on(
    frames: list[bytes],
) -> None:
    encoder = ZstdEncoder()
    decoder = ZstdDecoder()
    assert encoder.can_hibernate
    assert encoder.hibernate() == b""  # nothing to end before the first event
    sent = frames[:4] + [b": keep-alive\n\n", frames[4]]
    body = []

    for event in sent[:3]:
        body.append(chunk := encoder.encode(event))
        assert decoder.feed(chunk) == event
    live = encoder.memory_size()
    assert 0 < live <= 1.3 * 1024 * 1024

    body.append(tail := encoder.hibernate())
    assert decoder.feed(tail) == b""
    assert decoder.frames_ended == 1
    assert encoder.hibernating and encoder.memory_size() == 0
    assert encoder.hibernate() == b""  # twice is harmless

    for event in sent[3:]:
        body.append(chunk := encoder.encode(event))
        assert decoder.feed(chunk) == event  # a new frame, decoded at once
    assert not encoder.hibernating and encoder.memory_size() == live

    body.append(tail := encoder.close())
    assert decoder.feed(tail) == b""
    assert decoder.frames_ended == 2 and decoder.clean_end
    assert decode_body("zstd", b"".join(body)) == b"".join(sent)


def test_a_hibernated_zstd_stream_closes_cleanly(frames: list[bytes]) -> None:
    encoder = ZstdEncoder()
    body = encoder.encode(frames[0]) + encoder.hibernate() + encoder.close()
    assert decode_body("zstd", body) == frames[0]


def test_an_asleep_zstd_encoders_keepalives_are_frames_of_their_own_and_leave_it_asleep(frames: list[bytes]) -> None:
    encoder = ZstdEncoder()
    decoder = ZstdDecoder()
    keepalive = b": keep-alive\n\n"
    assert decoder.feed(encoder.encode_asleep(keepalive)) == keepalive  # asleep before any frame
    assert encoder.hibernating and decoder.frames_ended == 1
    assert decoder.feed(encoder.encode(frames[0]) + encoder.hibernate()) == frames[0]
    for _ in range(2):
        assert decoder.feed(encoder.encode_asleep(b"retry: 1500\n\n", keepalive)) == b"retry: 1500\n\n" + keepalive
        assert encoder.hibernating and encoder.memory_size() == 0
    assert decoder.frames_ended == 4
    assert decoder.feed(encoder.encode(frames[1]) + encoder.close()) == frames[1]  # a new frame of its own
    assert decoder.clean_end


@pytest.mark.parametrize(
    ("make", "kib", "strategy"),
    [
        (ZstdEncoder, 256 + 128 + 32, zstandard.STRATEGY_FAST),  # a 60 KB first write: a 2^18 window
        (ZstdEncoder.low_memory, 256 + 128 + 32, zstandard.STRATEGY_FAST),  # "about 0.4 MiB"
        (ZstdEncoder.dense, 512 + 128 + 32 + 64, zstandard.STRATEGY_BTLAZY2),  # same window, a chain
    ],
)
def test_zstd_presets_hold_the_memory_they_promise(make: Any, kib: int, strategy: int) -> None:
    encoder = make()
    assert encoder.memory_size() == 0
    event = b"data: " + b"card moved; " * 5000 + b"\n\n"
    first = encoder.encode(event)
    assert encoder.memory_size() == kib * 1024
    assert encoder.params.strategy == strategy
    assert zstandard.ZstdDecompressor().decompressobj().decompress(first) == event
    again = encoder.encode(event)
    assert len(again) < 100  # a repeat costs a few bytes inside the window


def test_zstd_preset_parameters() -> None:
    low, dense = ZstdEncoder.low_memory().params, ZstdEncoder.dense().params
    sized = ZstdEncoder()
    assert sized.params is None  # sized by the first write
    sized.encode(b"data: x\n\n")
    assert sized.params is None  # a small write goes alone: no window yet
    sized.encode(b"x" * ALONE_BELOW)
    default = sized.params
    assert (low.window_log, low.hash_log) == (18, 13)
    assert (default.window_log, default.hash_log) == (12, 8)  # a small first window: a small table
    assert (dense.window_log, dense.hash_log, dense.chain_log, dense.search_log, dense.min_match) == (19, 13, 14, 1, 6)


@pytest.mark.parametrize(
    ("make", "settings"),
    [
        (ZstdEncoder, {"window_log": 18, "hash_log": 13}),  # sized from the 62 KB first write
        (ZstdEncoder.low_memory, {"window_log": 18, "hash_log": 13}),
        (ZstdEncoder.dense, {"window_log": 19, "strategy": zstandard.STRATEGY_BTLAZY2, "hash_log": 13,
                             "chain_log": 14, "search_log": 1, "min_match": 6}),
    ],
)
def test_zstd_presets_compress_as_level_1_with_their_settings(make: Any, settings: dict[str, int]) -> None:
    event = b"data: " + b"".join(b"card %d in lane %d; " % (i, i % 4) for i in range(3000)) + b"\n\n"
    params = zstandard.ZstdCompressionParameters.from_level(1, **settings)
    reference = zstandard.ZstdCompressor(compression_params=params).compressobj()
    expected = reference.compress(event) + reference.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    assert make().encode(event) == expected


def test_the_zstd_window_holds_four_writes_of_the_first_size_exactly() -> None:
    from fastapi_lith.engine.zstd import _zstd_window_log

    assert _zstd_window_log(2**18) == 20  # four writes of 256 KiB fill 1 MiB: no more is needed
    assert _zstd_window_log(2**18 + 1) == 21
    assert (_zstd_window_log(1), _zstd_window_log(2**30)) == (10, 23)

