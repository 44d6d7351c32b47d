"""Encoders: every event decodes at once, bodies end cleanly, repeats cost little, negotiation."""

from __future__ import annotations

import re
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
from tests.support.decoders import (
    DECODERS,
    BrotliDecoder,
    board_frames,
    board_frames_40,
    decode_body,
    sizes_after_first,
)

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
    return board_frames_40()  # the 142 KB board


def test_brotli_one_card_changed_costs_under_200_bytes(frames: list[bytes]) -> None:
    assert max(sizes_after_first(BrotliEncoder(), frames)) < 200


def test_gzip_one_card_changed_costs_under_10_kb(frames: list[bytes]) -> None:
    assert max(sizes_after_first(GzipEncoder(), frames)) < 10 * 1024


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
