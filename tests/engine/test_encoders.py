"""Encoders: every event decodes at once, bodies end cleanly, repeats cost little, negotiation."""

from __future__ import annotations

import gzip
import io
import re
import statistics
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import pytest
import zstandard
from datastar_py.sse import ServerSentEventGenerator as SSE

from examples.kanban.synthetic import board_html, change_card, make_cards
from fastapi_lith import SettingError
from fastapi_lith.engine.encoders import (
    BrotliEncoder,
    Encoder,
    GzipEncoder,
    IdentityEncoder,
    ZstdEncoder,
    make_encoder,
    negotiate,
)
from fastapi_lith.engine.zstd import ALONE_BELOW
from fastapi_lith.exceptions import EncoderClosed

# --------------------------------------------------------------------------- decoders


class ZstdDecoder:
    """What a browser does: decode as bytes arrive, frame after frame in one body."""

    def __init__(self) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self.frames_ended = 0

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            out.append(self._d.decompress(data))
            if not self._d.eof:
                break
            self.frames_ended += 1
            data = self._d.unused_data
            self._d = zstandard.ZstdDecompressor().decompressobj()
        return b"".join(out)

    @property
    def clean_end(self) -> bool:
        return self.frames_ended > 0 and not self._d.unused_data


class BrotliDecoder:
    def __init__(self) -> None:
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        out = [self._d.process(data)]
        while not self._d.is_finished():  # process() can hold back part of a flushed frame
            more = self._d.process(b"")
            if not more:
                break
            out.append(more)
        return b"".join(out)

    @property
    def clean_end(self) -> bool:
        return bool(self._d.is_finished())


class GzipDecoder:
    def __init__(self) -> None:
        self._d = zlib.decompressobj(31)

    def feed(self, data: bytes) -> bytes:
        return self._d.decompress(data)

    @property
    def clean_end(self) -> bool:
        return self._d.eof and not self._d.unused_data


class IdentityDecoder:
    clean_end = True

    def feed(self, data: bytes) -> bytes:
        return data


def decode_body(name: str | None, body: bytes) -> bytes:
    """The whole body in one go, as a client that buffers would read it."""
    if name == "zstd":
        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(body), read_across_frames=True
        )
        return reader.read()
    if name == "br":
        return brotli.decompress(body)  # type: ignore[no-any-return]
    if name == "gzip":
        return gzip.decompress(body)
    return body


Decoder = ZstdDecoder | BrotliDecoder | GzipDecoder | IdentityDecoder
DECODERS: dict[str | None, Callable[[], Decoder]] = {
    "zstd": ZstdDecoder,
    "br": BrotliDecoder,
    "gzip": GzipDecoder,
    None: IdentityDecoder,
}

ENCODERS: dict[str, Callable[[], Encoder]] = {
    "zstd": ZstdEncoder,
    "zstd low_memory": ZstdEncoder.low_memory,
    "zstd dense": ZstdEncoder.dense,
    "br": BrotliEncoder,
    "br q3": lambda: BrotliEncoder(quality=3),
    "br no flushes": lambda: BrotliEncoder(flush_every=0),
    "gzip": GzipEncoder,
    "identity": IdentityEncoder,
}


# --------------------------------------------------------------------------- events


def board_frames(n: int) -> list[bytes]:
    """Datastar events of the 142 KB kanban board, one card changed from one to the next."""
    cards = make_cards()
    frames = []
    for step in range(n):
        frames.append(SSE.patch_elements(board_html(cards)).encode())
        cards = change_card(cards, step)
    return frames


def varied_events() -> list[bytes]:
    cards = make_cards(30, seed=5)
    events = [
        SSE.patch_elements('<p id="counter">0</p>'),
        SSE.patch_elements(board_html(cards)),
        SSE.patch_elements('<p id="counter">1</p>'),
        SSE.patch_signals({"draft": "héllo ✓ 日本", "count": 3}),
        SSE.patch_elements(board_html(change_card(cards, 1))),
        SSE.remove_elements("#card-3"),
        SSE.patch_elements('<div id="toast" class="ok">Saved — ✓</div>', event_id="7"),
    ]
    encoded = [e.encode() for e in events]
    encoded.insert(3, b": keep-alive\n\n")
    # Larger than brotli's 64 KiB flush step and zstd's 128 KiB block, twice over.
    encoded.append(board_frames(1)[0] + SSE.patch_elements('<p id="counter">2</p>').encode())
    return encoded


def sse_event_of_size(size: int) -> bytes:
    head = b"event: datastar-patch-elements\ndata: elements <div id=\"pad\">"
    tail = b"</div>\n\n"
    return head + b"x" * (size - len(head) - len(tail)) + tail


# --------------------------------------------------------------------------- every encoder


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_each_event_decodes_as_soon_as_it_is_encoded(kind: str) -> None:
    encoder = ENCODERS[kind]()
    decoder = DECODERS[encoder.name]()
    body = []
    for event in varied_events():
        chunk = encoder.encode(event)
        body.append(chunk)
        assert decoder.feed(chunk) == event
    tail = encoder.close()
    body.append(tail)
    assert decoder.feed(tail) == b""
    assert decoder.clean_end
    assert decode_body(encoder.name, b"".join(body)) == b"".join(varied_events())


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_a_stream_that_sent_nothing_still_has_a_valid_body(kind: str) -> None:
    encoder = ENCODERS[kind]()
    body = encoder.close()
    decoder = DECODERS[encoder.name]()
    assert decoder.feed(body) == b""
    assert decoder.clean_end
    assert encoder.close() == b""  # closing twice adds nothing


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_encoding_after_close_fails_loudly(kind: str) -> None:
    encoder = ENCODERS[kind]()
    encoder.encode(b"data: x\n\n")
    encoder.close()
    if kind == "identity":
        return  # nothing to end: identity has no state
    with pytest.raises(RuntimeError):
        encoder.encode(b"data: y\n\n")


@pytest.mark.parametrize(
    ("name", "content_encoding"),
    [("zstd", "zstd"), ("br", "br"), ("gzip", "gzip"), ("identity", None)],
)
def test_make_encoder_gives_the_encoder_for_a_negotiated_name(
    name: str, content_encoding: str | None
) -> None:
    assert make_encoder(name).name == content_encoding
    with pytest.raises(ValueError, match="unknown encoding"):
        make_encoder("deflate")


def test_make_encoder_passes_settings() -> None:
    encoder = make_encoder("br", quality=5, size_hint=200_000)
    assert isinstance(encoder, BrotliEncoder)
    assert encoder.quality == 5
    encoder.encode(b"data: small\n\n")
    assert encoder.lgwin == 18  # the window was sized from the hint, not the small first event
    encoder.encode(b"x" * 190_000)
    assert not encoder.needs_restart
    gzip = make_encoder("gzip", level=1)
    assert isinstance(gzip, GzipEncoder)
    event = b"data: " + b"".join(b"card %d moved to lane %d; " % (i, i % 4) for i in range(2000))
    reference = {level: zlib.compressobj(level, zlib.DEFLATED, 31) for level in (1, 6)}
    expected = {level: c.compress(event) + c.flush(zlib.Z_SYNC_FLUSH) for level, c in reference.items()}
    assert expected[1] != expected[6]  # the level shows in the bytes
    assert gzip.encode(event) == expected[1]


# --------------------------------------------------------------------------- size on the board


@pytest.fixture(scope="module")
def frames() -> list[bytes]:
    frames = board_frames(40)
    assert all(135_000 <= len(f) <= 150_000 for f in frames)  # the 142 KB board
    return frames


def sizes_after_first(encoder: Encoder, frames: list[bytes]) -> list[int]:
    sizes = [len(encoder.encode(f)) for f in frames]
    encoder.close()
    return sizes[1:]


def test_zstd_one_card_changed_costs_under_2000_bytes(frames: list[bytes]) -> None:
    assert statistics.median(sizes_after_first(ZstdEncoder(window_log=19), frames)) < 2_000


def test_zstd_dense_sends_a_third_of_the_bytes_or_less(frames: list[bytes]) -> None:
    default = sum(sizes_after_first(ZstdEncoder(), frames))
    dense = sizes_after_first(ZstdEncoder.dense(), frames)
    assert sum(dense) * 3 < default
    assert statistics.median(dense) < 200


def test_brotli_one_card_changed_costs_under_200_bytes(frames: list[bytes]) -> None:
    assert max(sizes_after_first(BrotliEncoder(), frames)) < 200


def test_gzip_one_card_changed_costs_under_10_kb(frames: list[bytes]) -> None:
    assert max(sizes_after_first(GzipEncoder(), frames)) < 10 * 1024


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


def test_events_are_encoded_in_one_write_without_joining(frames: list[bytes]) -> None:
    """Several events in one call decode to the events in order, at once, for every coding;
    brotli flushes as often as it would for the joined bytes, so its bytes stay as small."""
    events = [frames[0][:70_000], frames[0][70_000:], b"data: outcome\n\n"]
    for kind in ENCODERS:
        encoder = ENCODERS[kind]()
        decoder = DECODERS[encoder.name]()
        assert decoder.feed(encoder.encode(*events)) == b"".join(events)
        assert decoder.feed(encoder.encode(frames[1], b"data: two\n\n")) == frames[1] + b"data: two\n\n"
    joined, pieces = BrotliEncoder(), BrotliEncoder()
    a = [joined.encode(b"".join(events)), joined.encode(frames[1])]
    b = [pieces.encode(*events), pieces.encode(frames[1])]
    assert [len(x) for x in a] == [len(x) for x in b]


# --------------------------------------------------------------------------- hibernation


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


@pytest.mark.parametrize("kind", ["zstd", "br", "gzip", "identity"])
def test_an_awake_encoders_keepalive_goes_on_in_its_window(kind: str) -> None:
    encoder = ENCODERS[kind]()
    decoder = DECODERS[encoder.name]()
    event = b"data: " + b"1" * ALONE_BELOW + b"\n\n"  # large enough to open a zstd window
    first = encoder.encode(event)
    keepalive = encoder.encode_asleep(b": keep-alive\n\n")
    assert not encoder.hibernating
    assert decoder.feed(first + keepalive + encoder.close()) == event + b": keep-alive\n\n"
    assert decoder.clean_end


@pytest.mark.parametrize("kind", ["br", "gzip", "identity"])
def test_other_encoders_never_hibernate(kind: str) -> None:
    encoder = ENCODERS[kind]()
    decoder = DECODERS[encoder.name]()
    assert not encoder.can_hibernate
    first = encoder.encode(b"data: one\n\n")
    assert encoder.hibernate() == b""
    second = encoder.encode(b"data: two\n\n")
    assert decoder.feed(first + second + encoder.close()) == b"data: one\n\ndata: two\n\n"
    assert decoder.clean_end


# --------------------------------------------------------------------------- brotli's window


@pytest.mark.parametrize(
    ("first", "lgwin"),
    [(100, 16), (61_681, 16), (61_682, 17), (100_000, 17), (123_362, 17), (123_363, 18),
     (150_000, 18), (20_000_000, 24)],
)
def test_brotli_window_is_sized_from_the_first_event(first: int, lgwin: int) -> None:
    # the smallest power of two holding the event plus a sixteenth, in 16..24
    encoder = BrotliEncoder()
    assert encoder.lgwin is None and encoder.memory_size() == 0  # nothing allocated yet
    event = sse_event_of_size(first)
    out = encoder.encode(event)
    assert encoder.lgwin == lgwin
    assert encoder.memory_size() > 0
    if first < 1_000_000:
        assert BrotliDecoder().feed(out) == event


def test_brotli_asks_for_a_restart_after_a_frame_larger_than_its_window() -> None:
    encoder = BrotliEncoder()
    decoder = BrotliDecoder()
    first, same, larger = (sse_event_of_size(n) for n in (100_000, 123_000, 200_000))
    assert decoder.feed(encoder.encode(first)) == first
    assert decoder.feed(encoder.encode(same)) == same
    assert not encoder.needs_restart
    assert decoder.feed(encoder.encode(larger)) == larger  # still correct, only larger
    assert encoder.needs_restart
    assert encoder.lgwin == 17  # the window cannot grow mid-stream
    assert decoder.feed(encoder.close()) == b""
    assert decoder.clean_end


def test_brotli_size_hint_avoids_a_restart_when_the_first_event_is_small(
    frames: list[bytes],
) -> None:
    encoder = BrotliEncoder(size_hint=len(frames[0]))
    encoder.encode(SSE.patch_elements('<p id="counter">0</p>').encode())
    encoder.encode(frames[0])
    assert encoder.lgwin == 18
    assert not encoder.needs_restart


def test_brotli_at_the_largest_window_never_asks_for_a_restart() -> None:
    encoder = BrotliEncoder(quality=1, flush_every=0)
    encoder.encode(sse_event_of_size(16_000_000))
    encoder.encode(sse_event_of_size(17_000_000))  # a new stream could not do better
    assert encoder.lgwin == 24
    assert not encoder.needs_restart


# --------------------------------------------------------------------------- negotiation


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "identity"),
        ("", "identity"),
        ("   ", "identity"),
        ("gzip, deflate, br, zstd", "zstd"),  # Chromium to localhost
        ("gzip, deflate, br", "br"),
        ("gzip, deflate", "gzip"),
        ("deflate", "identity"),
        ("x-gzip", "gzip"),
        (" ZSTD ;Q=0.5 ,Br ; q=0.5", "zstd"),  # case and whitespace
        ("gzip;q=0.5, br;q=0.5", "br"),  # a tie: our order decides
        ("br;q=1.0, gzip;q=0.8, zstd;q=0.5", "br"),  # the client's q-values rank first
        ("zstd;q=0, br", "br"),
        ("zstd;q=0, br;q=0, gzip;q=0", "identity"),
        ("gzip;q=0.001", "gzip"),  # named codings rank above an identity nobody named
        ("identity;q=0", None),
        ("identity;q=0, gzip", "gzip"),
        ("identity;q=0.5, gzip;q=0.4", "identity"),
        ("*", "zstd"),
        ("*;q=0", None),
        ("*;q=0, identity", "identity"),
        ("*;q=0, gzip", "gzip"),
        ("br;q=0.8, *;q=0.1", "br"),
        ("gzip;q=abc", "identity"),  # a malformed entry is ignored
        ("gzip;q=2", "identity"),
        (",,gzip;level=1,", "gzip"),  # empty entries and other parameters
    ],
)
def test_negotiate(header: str | None, expected: str | None) -> None:
    assert negotiate(header) == expected


def test_negotiate_among_what_the_app_offers() -> None:
    offered = ("gzip", "identity")
    assert negotiate("gzip, deflate, br, zstd", offered) == "gzip"
    assert negotiate("zstd, br", offered) == "identity"
    assert negotiate("zstd, br, identity;q=0", offered) is None
    assert negotiate("", ("zstd",)) is None


def test_memory_sizes_of_the_windowless_and_the_closed() -> None:
    gzip = GzipEncoder()
    assert gzip.memory_size() == 256 * 1024  # zlib's figure for a 32 KiB window at memLevel 8
    gzip.close()
    assert gzip.memory_size() == 0
    assert IdentityEncoder().memory_size() == 0
    assert IdentityEncoder().close() == b"" and IdentityEncoder().hibernate() == b""


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


@pytest.mark.parametrize(("quality", "tables"), [(1, 160_000), (4, 880_000 + 65_536), (10, 4_100_000 + 65_536)])
def test_brotli_memory_size_by_quality_and_after_close(quality: int, tables: int) -> None:
    encoder = BrotliEncoder(quality=quality)
    encoder.encode(b"data: small\n\n")
    assert encoder.lgwin == 16 and encoder.memory_size() == tables
    encoder.close()
    assert encoder.memory_size() == 0 and encoder.close() == b""


def test_malformed_and_out_of_range_q_values_drop_only_their_entry() -> None:
    assert negotiate("gzip;q==0.5") == "identity"  # malformed: as if gzip were not offered
    assert negotiate("zstd;q=5, gzip") == "gzip"  # out of range: the next entry still counts
    assert negotiate("zstd;q=abc, br;q=0.5") == "br"


def test_encoder_arguments_are_checked_and_closed_encoders_refuse_events() -> None:
    ZstdEncoder(window_log=zstandard.WINDOWLOG_MIN)
    ZstdEncoder(window_log=23)
    for bad in (zstandard.WINDOWLOG_MIN - 1, 24):
        with pytest.raises(ValueError, match=rf"^window_log must be in {zstandard.WINDOWLOG_MIN}\.\.23$"):
            ZstdEncoder(window_log=bad)
    assert BrotliEncoder(quality=0).quality == 0 and BrotliEncoder(quality=11).quality == 11
    for bad in (-1, 12):
        with pytest.raises(ValueError, match=r"^quality must be in 0\.\.11$"):
            BrotliEncoder(quality=bad)
    assert BrotliEncoder().quality == 4
    assert BrotliEncoder(quality=3).flush_every == 16 * 1024
    assert BrotliEncoder(quality=4).flush_every == 64 * 1024
    assert BrotliEncoder(flush_every=0).flush_every == 0
    for encoder in (ZstdEncoder(), BrotliEncoder(), GzipEncoder()):
        encoder.close()
        with pytest.raises(RuntimeError, match="^encoder is closed$"):
            encoder.encode(b"data: late\n\n")


def test_brotli_announces_the_window_it_sized() -> None:
    # RFC 7932: a stream whose first bit is 0 declares a 64 KiB (lgwin 16) window.
    encoder = BrotliEncoder()
    out = encoder.encode(b"data: small\n\n")
    assert encoder.lgwin == 16 and out[0] & 1 == 0
    big = BrotliEncoder()
    assert big.encode(b"x" * 150_000)[0] & 1 == 1 and big.lgwin == 18


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


@pytest.mark.parametrize("quality", [0, 4, 9])
def test_brotli_compresses_at_the_quality_it_was_given(quality: int) -> None:
    event = b"data: " + b"".join(b"card %d in lane %d; " % (i, i % 4) for i in range(300)) + b"\n\n"
    reference = brotli.Compressor(quality=quality, lgwin=16)
    expected = reference.process(event) + reference.flush()
    assert BrotliEncoder(quality=quality).encode(event) == expected


def test_brotli_quality_2_keeps_its_window_and_gzip_keeps_its_level() -> None:
    encoder = BrotliEncoder(quality=2)
    encoder.encode(b"data: small\n\n")
    assert encoder.memory_size() == 560_000 + 65_536
    assert GzipEncoder(level=1).level == 1


def test_the_zstd_window_holds_four_writes_of_the_first_size_exactly() -> None:
    from fastapi_lith.engine.zstd import _zstd_window_log

    assert _zstd_window_log(2**18) == 20  # four writes of 256 KiB fill 1 MiB: no more is needed
    assert _zstd_window_log(2**18 + 1) == 21
    assert (_zstd_window_log(1), _zstd_window_log(2**30)) == (10, 23)


def test_gzip_defaults_to_zlibs_own_level() -> None:
    from fastapi_lith.engine.encoders import GzipEncoder

    assert GzipEncoder().level == 6  # zlib's own default


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("zstd_window_log", 9, "an integer from 10 to 23, not 9"),
        ("zstd_window_log", 24, "an integer from 10 to 23, not 24"),
        ("zstd_window_log", 18.0, "an integer, not 18.0"),
        ("brotli_quality", -1, "an integer from 0 to 11, not -1"),
        ("brotli_quality", 12, "an integer from 0 to 11, not 12"),
        ("brotli_quality", 4.0, "an integer, not 4.0"),
        ("gzip_level", -1, "an integer from 0 to 9, not -1"),
        ("gzip_level", 10, "an integer from 0 to 9, not 10"),
        ("gzip_level", 6.0, "an integer, not 6.0"),
    ],
)
def test_an_apps_compression_settings_are_checked_by_name_within_their_bounds(name: str, bad: Any, message: str) -> None:
    from fastapi_lith.engine.encoders import encoder_settings

    lowest = {"zstd_window_log": 10, "brotli_quality": 0, "gzip_level": 0}
    highest = {"zstd_window_log": 23, "brotli_quality": 11, "gzip_level": 9}
    for bounds in (lowest, highest):
        assert encoder_settings(**bounds) == {
            "zstd": {"window_log": bounds["zstd_window_log"]},
            "br": {"quality": bounds["brotli_quality"]},
            "gzip": {"level": bounds["gzip_level"]},
        }
    assert encoder_settings(**{**lowest, "zstd_window_log": None})["zstd"] == {"window_log": None}  # sized per stream
    with pytest.raises(SettingError, match=f"^{name} must be {re.escape(message)}$"):
        encoder_settings(**{**lowest, name: bad})
