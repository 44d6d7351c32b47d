"""Streams over a real uvicorn: each encoding decodes event by event, costs, hibernation, ends."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import httpx
import pytest
import zstandard
from prometheus_client.parser import text_string_to_metric_families

from fastapi_lith.engine.encoders import IdentityEncoder
from fastapi_lith.engine.frames import Frame, sse_event
from fastapi_lith.engine.zstd import ALONE_BELOW
from tests.support import SUPPORT
from tests.support.browser import Server

TESTS = SUPPORT  # the helper apps' folder


class Decoder:
    """Decode a compressed SSE body incrementally, as a browser does."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.frames_ended = 0  # zstd frames that ended (hibernation, close)
        self._new()

    def _new(self) -> None:
        if self.encoding == "zstd":
            self._obj: Any = zstandard.ZstdDecompressor().decompressobj()
        elif self.encoding == "br":
            self._obj = brotli.Decompressor()
        elif self.encoding == "gzip":
            self._obj = zlib.decompressobj(31)

    def feed(self, data: bytes) -> bytes:
        if self.encoding == "identity":
            return data
        if self.encoding == "br":
            out = self._obj.process(data)
            while more := self._obj.process(b""):  # brotli may hold back part of a flushed block
                out += more
            return out
        if self.encoding == "gzip":
            return self._obj.decompress(data)
        out = b""
        while data:
            out += self._obj.decompress(data)
            if not self._obj.eof:
                break
            self.frames_ended += 1
            data = self._obj.unused_data
            self._new()
        return out


class Reader:
    """One open stream: events as they decode, and the raw bytes each one cost."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.decoder = Decoder(response.headers.get("content-encoding", "identity"))
        self._raw = response.iter_raw()
        self._text = ""
        self.raw_bytes = 0

    def next_event(self) -> tuple[str, int]:
        """The next whole event and the compressed bytes read since the previous one."""
        start = self.raw_bytes
        while "\n\n" not in self._text:
            chunk = next(self._raw)
            self.raw_bytes += len(chunk)
            self._text += self.decoder.feed(chunk).decode()
        event, self._text = self._text.split("\n\n", 1)
        return event, self.raw_bytes - start

    def rest(self) -> bytes:
        """Everything until the server ends the body."""
        out = b""
        for chunk in self._raw:
            self.raw_bytes += len(chunk)
            out += self.decoder.feed(chunk)
        return out


def open_stream(server: Server, encoding: str, query: str = "views=board&tab=t1") -> Iterator[Reader]:
    headers = {"Accept-Encoding": encoding}
    with httpx.stream("GET", f"{server.url}/lith/stream?{query}", headers=headers, timeout=10) as response:
        assert response.status_code == 200, response.read()
        yield Reader(response)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("streams") / "board.db"
    server = Server("streamapp:app", cwd=TESTS, env={"STREAM_DB": str(db)})
    server.start()
    yield server
    server.close()


def rename(server: Server, card: int, title: str) -> None:
    assert httpx.post(f"{server.url}/rename", json={"card": card, "title": title}).status_code == 204


def metric(server: Server, name: str, **labels: str) -> float:
    """One sample of the app's metrics, as a scrape sees it now."""
    text = httpx.get(f"{server.url}/lith/metrics").text
    return next(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name and s.labels == labels
    )


ENCODINGS = ["identity", "gzip", "br", "zstd"]


def test_each_encoding_decodes_event_by_event_into_the_same_events(server: Server) -> None:
    readers, contexts = {}, []
    for encoding in ENCODINGS:
        context = open_stream(server, encoding)
        contexts.append(context)
        readers[encoding] = next(context)
        headers = readers[encoding].response.headers
        assert headers.get("content-encoding") == (None if encoding == "identity" else encoding)
        assert headers["vary"] == "Accept-Encoding"
        assert headers["content-type"].startswith("text/event-stream")
    first = {e: r.next_event()[0] for e, r in readers.items()}
    # Each stream's first event opens with its own `retry:` (web/sse.py draws one per stream).
    assert all(re.match(r"retry: \d+\n", event) for event in first.values())
    first = {e: event.split("\n", 1)[1] for e, event in first.items()}
    assert len(set(first.values())) == 1
    assert first["identity"].startswith("event: datastar-patch-elements\ndata: elements <main id=\"board\">")
    assert 130_000 < len(first["identity"]) < 160_000
    for i in range(5):
        rename(server, 7 + i, f"Renamed {i}")
        events = {e: r.next_event()[0] for e, r in readers.items()}
        assert len(set(events.values())) == 1, "every encoding decodes to the identity event"
        assert f"Renamed {i}" in events["identity"]
    for context in contexts:
        context.close()


@pytest.mark.parametrize(("encoding", "limit"), [("zstd", 2_000), ("br", 200), ("gzip", 10_000)])
def test_one_card_change_after_the_first_frame_is_small(server: Server, encoding: str, limit: int) -> None:
    context = open_stream(server, encoding, f"views=board&tab={encoding}")
    reader = next(context)
    first, _ = reader.next_event()
    sizes = []
    for i in range(4):
        rename(server, 100 + i, f"{encoding} change {i}")
        event, cost = reader.next_event()
        assert f"{encoding} change {i}" in event
        sizes.append(cost)
    context.close()
    assert len(first) > 130_000
    assert max(sizes) < limit, sizes


def test_a_moved_card_goes_out_as_patches_of_the_board_the_tab_shows(server: Server) -> None:
    """The first event is the whole board; a move, as the frame after it, is a remove and an
    insert by id (engine/patches.py), a few hundred bytes where the board is 140 KB."""
    context = open_stream(server, "identity", "views=board&tab=patched")
    reader = next(context)
    first, _ = reader.next_event()
    assert '<main id="board">' in first and len(first) > 130_000
    assert httpx.post(f"{server.url}/move", json={"card": 20, "to": 3}).status_code == 204
    removed, _ = reader.next_event()
    inserted, _ = reader.next_event()
    context.close()
    assert removed == "event: datastar-patch-elements\ndata: mode remove\ndata: selector #card-20"
    assert inserted.startswith("event: datastar-patch-elements\ndata: mode after\ndata: selector #card-")
    assert '<article id="card-20" class="card">' in inserted and len(inserted) < 1_000


def test_a_zstd_stream_sizes_its_window_from_its_first_write(server: Server) -> None:
    headers = {"Accept-Encoding": "zstd"}
    with httpx.stream("GET", f"{server.url}/lith/stream?views=board&tab=win", headers=headers, timeout=10) as r:
        first = next(r.iter_raw())
    # The first write is the ~142 KB board: room for four of it is a 1 MiB window.
    assert zstandard.get_frame_parameters(first).window_size == 2**20


def test_bad_query_parameters_get_400(server: Server) -> None:
    for query, message in [
        ("views=board", "tab"),
        ("views=board&tab=has space", "tab"),
        ("views=board&tab=" + "x" * 65, "tab"),
        ("tab=t1", "views"),
        ("views=nope&tab=t1", "no view matches"),
    ]:
        response = httpx.get(f"{server.url}/lith/stream?{query}")
        assert response.status_code == 400, query
        assert response.headers["content-type"].startswith("text/plain")
        assert message in response.text


def test_disconnects_free_their_streams(server: Server) -> None:
    def stats() -> dict[str, int]:
        return httpx.get(f"{server.url}/stats").json()

    with httpx.Client(timeout=10) as client:
        for i in range(50):  # warm up allocators before measuring memory
            with client.stream("GET", f"{server.url}/lith/stream?views=board&tab=w{i}", headers={"Accept-Encoding": "zstd"}) as r:
                next(r.iter_raw())
        before = stats()
        for i in range(1000):
            with client.stream("GET", f"{server.url}/lith/stream?views=board&tab=c{i}", headers={"Accept-Encoding": "zstd"}) as r:
                next(r.iter_raw())
    deadline = time.monotonic() + 30
    while (after := stats())["streams"]:
        assert time.monotonic() < deadline, f"{after['streams']} streams outlived their connections"
        time.sleep(0.05)
    assert after["instances"] == 0
    assert after["rss_kib"] - before["rss_kib"] < 20 * 1024, (before, after)


def test_an_open_stream_runs_in_its_request_task_and_one_waiter(server: Server) -> None:
    """Per stream: uvicorn's task for the request and the waiter for its disconnect, no task
    group of listeners (a task and its events are most of what an idle tab costs)."""
    def stats() -> dict[str, int]:
        return httpx.get(f"{server.url}/stats").json()

    before = stats()
    contexts = [open_stream(server, "identity", f"views=board&tab=tasks{i}") for i in range(20)]
    readers = [next(context) for context in contexts]
    for reader in readers:
        reader.next_event()
    during = stats()
    for context in contexts:
        context.close()
    opened = during["streams"] - before["streams"]
    assert opened == 20, (before, during)
    assert during["tasks"] - before["tasks"] <= 2 * opened, (before, during)


@pytest.fixture
def quick_server(server_factory: Any, tmp_path: Path) -> Server:
    return server_factory(
        "streamapp:app",
        cwd=TESTS,
        env={"STREAM_DB": str(tmp_path / "b.db"), "STREAM_HIBERNATE": "0.3", "STREAM_KEEPALIVE": "0.2"},
    )


def test_hibernated_zstd_stream_resumes_and_keepalives_decode(quick_server: Server) -> None:
    context = open_stream(quick_server, "zstd")
    reader = next(context)
    reader.next_event()
    assert reader.next_event()[0] == ": keep-alive"
    deadline = time.monotonic() + 30
    while reader.decoder.frames_ended == 0:  # the idle stream ended its zstd frame
        assert time.monotonic() < deadline
        assert reader.next_event()[0] == ": keep-alive"
    assert metric(quick_server, "lith_streams_open", state="hibernated", encoding="zstd") == 1
    assert metric(quick_server, "lith_stream_encoder_bytes") == 0  # its compressor freed
    rename(quick_server, 3, "after hibernation")
    while "after hibernation" not in (event := reader.next_event()[0]):
        assert event == ": keep-alive"
    assert reader.decoder.frames_ended >= 1
    context.close()


def test_a_client_that_stops_reading_is_ended_alone(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(
        "streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db"), "STREAM_SEND_TIMEOUT": "0.5"}
    )
    stuck = socket.create_connection(("127.0.0.1", server.port))
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.sendall(b"GET /lith/stream?views=board&tab=stuck HTTP/1.1\r\nHost: x\r\n\r\n")  # never reads
    context = open_stream(server, "identity", "views=board&tab=healthy")
    healthy = next(context)
    healthy.next_event()
    # A guard against a hang, not a measure: filling the kernel's buffers (megabytes on
    # loopback) takes dozens of renders, each one a round trip through the server.
    deadline = time.monotonic() + 120
    i = 0
    while httpx.get(f"{server.url}/stats").json()["streams"] > 1:
        assert time.monotonic() < deadline, "the stuck stream was never ended"
        rename(server, 11, f"tick {i} " + "w" * 60_000)  # a card's patch of 60 KB a frame fills it
        assert f"tick {i}" in healthy.next_event()[0]  # the healthy tab is not held up
        i += 1
    rename(server, 11, "after")
    assert "after" in healthy.next_event()[0]
    assert metric(server, "lith_stream_send_timeouts_total") == 1
    stuck.close()
    context.close()


def test_shutdown_ends_streams_cleanly(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory("streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db")})
    contexts = [open_stream(server, e, f"views=board&tab={e}{i}") for e in ENCODINGS for i in range(3)]
    readers = [next(context) for context in contexts]
    for reader in readers:
        reader.next_event()
    rename(server, 5, "in flight")  # frames on their way while the server stops
    server.proc.send_signal(15)  # SIGTERM, as a deploy does
    for reader in readers:
        reader.rest()  # returns when the server ends the body
    for reader in readers:  # every compressed body was closed, not cut off
        decoder = reader.decoder
        if decoder.encoding == "zstd":
            assert decoder.frames_ended == 1
        elif decoder.encoding == "br":
            assert decoder._obj.is_finished()
        elif decoder.encoding == "gzip":
            assert decoder._obj.eof and not decoder._obj.unused_data
    assert server.proc.wait(5) in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    for context in contexts:
        context.close()


# -- in Debian's Chromium: the page morphs each frame, whatever the encoding ---------------

@pytest.mark.parametrize("encoding", ["zstd", "br", "gzip"])
def test_page_morphs_frames_in_chromium(server_factory: Any, new_page: Any, tmp_path: Path, encoding: str) -> None:
    from playwright.sync_api import expect

    env = {"STREAM_DB": str(tmp_path / "b.db")}
    if encoding != "zstd":  # Chromium offers br only over HTTPS, except to localhost: force it
        env["STREAM_ENCODING"] = encoding
    server = server_factory("streamapp:app", cwd=TESTS, env=env)
    page = new_page()
    encodings: list[str] = []
    page.on("response", lambda r: "/lith/stream" in r.url and encodings.append(r.headers.get("content-encoding", "")))
    page.goto(server.url)
    expect(page.locator("#card-5 h3")).to_have_text(card_title(server, 5))
    for i in range(3):
        rename(server, 5, f"Morphed by {encoding} {i}")
        expect(page.locator("#card-5 h3")).to_have_text(f"Morphed by {encoding} {i}", timeout=5_000)
    assert encodings == [encoding]


def test_hibernated_zstd_stream_keeps_updating_the_page(server_factory: Any, new_page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    server = server_factory(
        "streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db"), "STREAM_HIBERNATE": "0.2"}
    )
    page = new_page()
    page.goto(server.url)
    expect(page.locator("#card-9")).to_be_attached()
    for i in range(3):
        deadline = time.monotonic() + 20
        while httpx.get(f"{server.url}/stats").json()["hibernating"] != 1:  # the zstd frame ended
            assert time.monotonic() < deadline, "the idle stream never hibernated"
            time.sleep(0.05)
        rename(server, 9, f"Awake {i}")
        expect(page.locator("#card-9 h3")).to_have_text(f"Awake {i}", timeout=5_000)


def card_title(server: Server, card: int) -> str:
    page = httpx.get(server.url).text
    start = page.index(f'<article id="card-{card}" class="card"><h3>') + len(f'<article id="card-{card}" class="card"><h3>')
    return page[start : page.index("</h3>", start)]


def test_page_reconnects_after_a_deploy_and_after_a_dropped_connection(
    server_factory: Any, new_page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    server = server_factory("streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db")})
    page = new_page()
    page.goto(server.url)
    expect(page.locator("#card-4")).to_be_attached()
    server.restart()  # a deploy: SIGTERM ends the stream cleanly, a new process takes over
    rename(server, 4, "after deploy")
    expect(page.locator("#card-4 h3")).to_have_text("after deploy", timeout=10_000)
    server.proc.kill()  # the connection drops without a clean end
    server.proc.wait()
    server.start()
    rename(server, 4, "after drop")
    expect(page.locator("#card-4 h3")).to_have_text("after drop", timeout=15_000)


# -- the body in process: what ends it, hibernation, keep-alives ------------------------------


async def collect(stream: Any, encoder: Any, until: Any = None, **settings: float) -> list[bytes]:
    """Run `body` until it ends (or `until(chunks)` holds, then end the stream); its chunks."""
    import asyncio

    chunks: list[bytes] = []

    async def run() -> None:
        async for chunk in stream.body(encoder, **settings):
            chunks.append(chunk)
            if until is not None and until(chunks):
                stream.end()

    await asyncio.wait_for(run(), 10)
    return chunks


async def test_a_frame_that_outgrows_the_brotli_window_ends_the_body() -> None:
    from fastapi_lith.engine.encoders import BrotliEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import Stream

    stream = Stream("t1")
    small, big = Frame("v", "<p id='v'>small</p>"), Frame("v", "<p id='v'>" + "y" * 300_000 + "</p>")
    stream.offer(small)
    encoder = BrotliEncoder()
    chunks: list[bytes] = []

    def offer_big_after_first(got: list[bytes]) -> bool:
        if len(got) == 1:
            stream.offer(big)
        return False  # never ended by the test: the body must end itself

    chunks = await collect(stream, encoder, offer_big_after_first)
    assert stream.ended  # by the body itself: the test never ends it
    assert encoder.needs_restart
    decoder = brotli.Decompressor()
    assert decoder.process(b"".join(chunks)) == sse_event(small) + sse_event(big)
    assert decoder.is_finished()  # the body closed its brotli stream, not cut it off


async def test_an_idle_zstd_body_hibernates_then_resumes_in_a_new_frame() -> None:
    import asyncio

    from fastapi_lith.engine.encoders import ZstdEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    stream = Stream("t1")
    first, second = Frame("v", "<p id='v'>one</p>"), Frame("v", "<p id='v'>two</p>")
    stream.offer(first)
    encoder = ZstdEncoder()
    decoder = Decoder("zstd")
    text = b""

    def progress(chunks: list[bytes]) -> bool:
        nonlocal text
        text += decoder.feed(chunks[-1])
        if decoder.frames_ended == 1 and sse_event(second) not in text:
            assert encoder.hibernating  # the compressor was freed with the frame it ended
            asyncio.get_running_loop().call_soon(stream.offer, second)
        return sse_event(second) in text

    await collect(stream, encoder, progress, keepalive=60, hibernate_after=0.05)
    assert text == sse_event(first) + sse_event(second)  # no keep-alive: events came before one was due
    assert decoder.frames_ended == 2  # one for the hibernation, one for the close
    assert KEEPALIVE not in text


async def test_keepalives_decode_and_an_asleep_encoder_is_freed_again_at_once() -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder, ZstdEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    stream = Stream("t1")
    stream.offer(Frame("v", "<p id='v'>one</p>"))
    encoder = ZstdEncoder()
    decoder = Decoder("zstd")
    text = b""
    asleep_after_keepalive = []

    def progress(chunks: list[bytes]) -> bool:
        nonlocal text
        text += decoder.feed(chunks[-1])
        if text.endswith(KEEPALIVE):
            asleep_after_keepalive.append(encoder.hibernating)
        return text.count(KEEPALIVE) >= 3

    await collect(stream, encoder, progress, keepalive=0.05, hibernate_after=0.02)
    assert asleep_after_keepalive and all(asleep_after_keepalive)  # each keep-alive ended its frame
    assert text.startswith(b"event: datastar-patch-elements\n")
    assert text.count(KEEPALIVE) >= 3

    plain = Stream("t2")
    plain.offer(Frame("v", "<p id='v'>one</p>"))
    chunks = await collect(plain, IdentityEncoder(), lambda c: c[-1] == KEEPALIVE, keepalive=0.05)
    assert chunks[1] == KEEPALIVE and chunks[-1] == b""  # identity never hibernates


async def test_an_ended_stream_closes_its_body_cleanly() -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from fastapi_lith.engine.streams import Stream

    stream = Stream("t1")
    stream.end()
    chunks = await collect(stream, ZstdEncoder())
    assert zstandard.ZstdDecompressor().decompressobj().decompress(b"".join(chunks)) == b""
    assert len(chunks) == 1  # only the close: a valid, empty zstd body


async def test_frames_waiting_together_go_out_in_one_write() -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import Stream

    stream = Stream("t1")
    one, two = Frame("a", "<p id='a'>1</p>"), Frame("b", "<p id='b'>2</p>")
    stream.offer(one)
    stream.offer(two)
    chunks = await collect(stream, IdentityEncoder(), lambda c: True)
    assert chunks == [sse_event(one) + sse_event(two), b""]


async def test_a_long_view_goes_whole_once_then_as_patches_from_the_render_the_stream_sent() -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder
    from fastapi_lith.engine.streams import Stream
    from tests.engine.test_patches import board

    lanes = {lane: list(range(lane * 20, lane * 20 + 20)) for lane in range(4)}
    renders = [Frame.rendered("board", board(lanes))]
    for lane in range(3):  # a card moves to the next lane, three times
        lanes[lane + 1].insert(0, lanes[lane].pop())
        renders.append(Frame.rendered("board", board(lanes)))
    first, second, third, fourth = renders
    small = Frame.rendered("count", '<p id="count">1</p>')
    stream = Stream("t1")
    stream.offer(first)
    stream.offer(small)

    def until(chunks: list[bytes]) -> bool:
        if len(chunks) == 1:
            stream.offer(second)
        elif len(chunks) == 2:
            stream.offer(third)
            stream.offer(fourth)  # the third is never sent: the page shows the second
        return len(chunks) == 3

    chunks = await collect(stream, IdentityEncoder(), until)
    assert chunks[0] == sse_event(first) + sse_event(small)
    assert chunks[1] == sse_event(second.since(first)) and chunks[1].startswith(b"event: datastar-patch-elements\ndata: mode remove")
    assert len(chunks[1]) < 3_000 < len(second.html)
    assert chunks[2] == sse_event(fourth.since(second)) != sse_event(fourth.since(third))


async def test_a_stream_counts_what_it_took_and_every_byte_its_body_wrote() -> None:
    import asyncio

    from fastapi_lith.engine.encoders import ZstdEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream, StreamCounts

    stream = Stream("t1")
    stream.offer(Frame("v", "<p id='v'>old</p>"))
    pad = "." * ALONE_BELOW  # frames large enough to open a zstd window, which then hibernates
    first = Frame("v", f"<p id='v'>one{pad}</p>")
    stream.offer(first)  # supersedes the old one
    assert stream.skipped == 1
    second = Frame("v", f"<p id='v'>second{pad}</p>")
    decoder = Decoder("zstd")
    text = b""
    asleep_at: int | None = None

    def progress(chunks: list[bytes]) -> bool:
        # A frame, keep-alives, a hibernation, a keep-alive while asleep, a frame, the end:
        # every kind of write the body makes, each after others.
        nonlocal text, asleep_at
        text += decoder.feed(chunks[-1])
        if decoder.frames_ended == 1 and asleep_at is None:
            asleep_at = text.count(KEEPALIVE)
        if asleep_at is not None and text.count(KEEPALIVE) > asleep_at and sse_event(second) not in text:
            asyncio.get_running_loop().call_soon(stream.offer, second)
        return sse_event(second) in text

    chunks = await collect(stream, ZstdEncoder(), progress, keepalive=0.02, hibernate_after=0.05)
    assert text.startswith(sse_event(first)) and text.endswith(sse_event(second))
    assert stream.sent_bytes == sum(map(len, chunks)) and len(chunks) >= 5
    assert (stream.taken, stream.html_bytes) == (2, len(first.html) + len(second.html))
    stream.offer(Frame("w", "<p id='w'>taken by hand</p>"))
    assert len(stream.take()) == 1 and stream.html_bytes == len(first.html) + len(second.html) + 27
    assert stream.send_timeouts == 0
    stream.send_timeouts = 1  # as the response marks a client that stopped reading
    counts = StreamCounts()
    counts.add(stream)
    counts.add(stream)  # what two ended streams did, added up
    assert (counts.frames, counts.superseded, counts.html_bytes, counts.sent_bytes, counts.send_timeouts) == (
        6, 2, 2 * stream.html_bytes, 2 * stream.sent_bytes, 2)


async def test_the_retry_field_opens_the_first_event_once_through_the_encoder() -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder, ZstdEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    stream = Stream("t1")
    one = Frame("a", "<p id='a'>1</p>")
    stream.offer(one)
    decoder = Decoder("zstd")
    text = b""

    def progress(chunks: list[bytes]) -> bool:
        nonlocal text
        text += decoder.feed(chunks[-1])
        if text.count(KEEPALIVE) == 1:
            stream.offer(Frame("a", "<p id='a'>2</p>"))
        return text.count(b"event:") >= 2

    await collect(stream, ZstdEncoder(), progress, keepalive=0.05, retry=2345)
    assert text.startswith(b"retry: 2345\n" + sse_event(one))
    assert text.count(b"retry:") == 1

    # A stream whose first write is a keep-alive sends it there.
    idle = Stream("t2")
    chunks = await collect(idle, IdentityEncoder(), lambda c: True, keepalive=0.01, retry=1500)
    assert chunks[0] == b"retry: 1500\n" + KEEPALIVE


class HeldInTheWorker(IdentityEncoder):
    """Identity, whose encode on a worker waits for `release`; used by two at once, it fails."""

    def __init__(self) -> None:
        self.entered, self.release, self.in_use = threading.Event(), threading.Event(), threading.Lock()

    def encode(self, *events: bytes) -> bytes:
        assert self.in_use.acquire(blocking=False), "the encoder is used by two at once"
        try:
            if threading.current_thread() is not threading.main_thread():
                self.entered.set()
                assert self.release.wait(10)
            return super().encode(*events)
        finally:
            self.in_use.release()


async def test_no_keep_alive_touches_the_encoder_while_a_worker_encodes_a_frame() -> None:
    """The keep-alive's deadline passes while a fan-out worker holds the encoder: the body
    waits for the worker's bytes and sends them, and only then its keep-alives. (zstd's
    compressor, used from the loop meanwhile, raised; brotli's and zlib's are no safer.)"""
    from fastapi_lith.engine.fanout import INLINE_BELOW, Fanout
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    big = Frame("v", "<p id='v'>" + "x" * INLINE_BELOW + "</p>")  # large enough for a worker
    stream, encoder, fanout = Stream("t1"), HeldInTheWorker(), Fanout(1)
    stream.offer(big)
    body = stream.body(encoder, keepalive=0.02, hibernate_after=60, fanout=fanout)
    first = asyncio.ensure_future(body.__anext__())
    try:
        entered = await asyncio.to_thread(encoder.entered.wait, 10)
        assert entered, (  # what the body and the fan-out were doing, if a worker never began
            f"body done: {first.done()}, its error: {first.exception() if first.done() else None!r}, "
            f"hops: {fanout.hops}, encodes: {fanout.encodes}, encoding: {stream.encoding}, "
            f"encoder in use: {encoder.in_use.locked()}, threads: {[t.name for t in threading.enumerate()]}")
        await asyncio.sleep(0.1)  # five keep-alive intervals pass with the worker holding the encoder
        assert not first.done()
        encoder.release.set()
        assert await asyncio.wait_for(first, 10) == sse_event(big)
        assert await asyncio.wait_for(body.__anext__(), 10) == KEEPALIVE
    finally:
        encoder.release.set()
        await body.aclose()
        fanout.close()


async def test_a_stream_ended_while_a_worker_encodes_writes_that_frame_and_ends() -> None:
    """The server stops while a worker encodes a tab's frame: the frame comes back, is written,
    and the body ends, whether the response writes at once or the body writes it."""
    from fastapi_lith.engine.fanout import INLINE_BELOW, Fanout
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import Stream

    big = Frame("v", "<p id='v'>" + "x" * INLINE_BELOW + "</p>")
    stream, encoder, fanout = Stream("t1"), HeldInTheWorker(), Fanout(1)
    written: list[bytes] = []
    stream.write_at_once = lambda chunk: written.append(chunk)  # a write that never has to wait
    body = stream.body(encoder, keepalive=60, hibernate_after=60, fanout=fanout)
    rest = asyncio.ensure_future(body.__anext__())  # the body waits for bytes
    try:
        stream.offer(big)
        assert await asyncio.to_thread(encoder.entered.wait, 10)
        stream.end()  # the hub at the server's stop signal
        encoder.release.set()
        chunks = [await asyncio.wait_for(rest, 10)]
        chunks += [chunk async for chunk in body]  # the body ends, not waiting for a keep-alive
        assert b"".join(written + chunks) == sse_event(big)
    finally:
        encoder.release.set()
        await body.aclose()
        fanout.close()


async def test_a_frame_written_at_once_after_its_encode_outlasted_a_keep_alive_keeps_the_keep_alives() -> None:
    """The keep-alive's timer fires while a worker encodes (nothing is due meanwhile, so none is
    set again); the frame then goes out at once, and the body sets its timer again from there."""
    from fastapi_lith.engine.fanout import INLINE_BELOW, Fanout
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    big = Frame("v", "<p id='v'>" + "x" * INLINE_BELOW + "</p>")
    stream, encoder, fanout = Stream("t1"), HeldInTheWorker(), Fanout(1)
    written: list[bytes] = []
    stream.write_at_once = lambda chunk: written.append(chunk)
    body = stream.body(encoder, keepalive=0.05, hibernate_after=60, fanout=fanout)
    nxt = asyncio.ensure_future(body.__anext__())
    try:
        await asyncio.sleep(0)  # the body waits for bytes
        stream.offer(big)
        assert await asyncio.to_thread(encoder.entered.wait, 10)
        await asyncio.sleep(0.2)  # the keep-alive's timer fires meanwhile
        encoder.release.set()
        assert await asyncio.wait_for(nxt, 10) == KEEPALIVE
        assert written == [sse_event(big)]
    finally:
        encoder.release.set()
        await body.aclose()
        fanout.close()


async def test_an_awake_stream_sends_keepalives_without_hibernating() -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import KEEPALIVE, Stream

    stream = Stream("t1")
    first = Frame("v", "<p id='v'>one" + "." * ALONE_BELOW + "</p>")  # it opens a zstd window
    stream.offer(first)
    encoder = ZstdEncoder()
    decoder = Decoder("zstd")
    text = b""
    asleep: list[bool] = []

    def progress(chunks: list[bytes]) -> bool:
        nonlocal text
        text += decoder.feed(chunks[-1])
        asleep.append(encoder.hibernating)
        return text.count(KEEPALIVE) >= 2

    await collect(stream, encoder, progress, keepalive=0.05, hibernate_after=60)
    assert text == sse_event(first) + KEEPALIVE + KEEPALIVE
    assert asleep[:3] == [False, False, False]  # idle for less than hibernate_after: one zstd frame
    assert decoder.frames_ended == 1  # the close


def test_shutdown_commits_a_command_in_flight_and_answers_it(server_factory: Any, tmp_path: Path) -> None:
    import sqlite3
    import threading

    server = server_factory("streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db")})
    context = open_stream(server, "identity")
    reader = next(context)
    reader.next_event()
    answers: list[httpx.Response] = []
    cmd = {"card": 12, "title": "held through shutdown", "folder": str(tmp_path)}
    posting = threading.Thread(target=lambda: answers.append(httpx.post(f"{server.url}/hold", json=cmd, timeout=60)))
    posting.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():  # the writer is applying the command
        assert time.monotonic() < deadline and posting.is_alive()
        time.sleep(0.01)
    server.proc.send_signal(15)  # SIGTERM while the command is in flight
    reader.rest()  # the stream ends at once; the command is still held
    (tmp_path / "go").touch()
    posting.join(60)
    assert [a.status_code for a in answers] == [204]  # the caller hears it landed
    assert server.proc.wait(30) in (0, -15)
    with sqlite3.connect(tmp_path / "b.db") as conn:
        assert conn.execute("SELECT title FROM cards WHERE id = 12").fetchone() == ("held through shutdown",)
    context.close()


def test_a_frame_with_signals_patches_both_and_a_stream_counts_what_it_took() -> None:
    from fastapi_lith.engine.frames import Frame
    from fastapi_lith.engine.streams import Stream

    frame = Frame("lith-error", '<div id="lith-error">no</div>', {"done": 3})
    event = sse_event(frame).decode()
    assert event.startswith("event: datastar-patch-elements\n")
    assert "event: datastar-patch-signals\n" in event and '"done":3' in event.replace(" ", "")
    stream = Stream("t1")
    assert stream.keys == () and stream.take() == [] and stream.taken == 0
    stream.offer(frame)
    stream.offer(Frame("other", "<p id='other'></p>"))
    assert len(stream.take()) == 2
    stream.offer(frame)
    assert stream.take() == [frame] and stream.taken == 3


# -- the stream route in process: its 400s, its headers, its life and its end ------------------


def stream_request(query: str) -> Any:
    from starlette.requests import Request

    return Request({"type": "http", "method": "GET", "scheme": "http", "path": "/stream",
                    "query_string": query.encode(), "headers": [(b"host", b"app.test")]})


class Exchange:
    """Runs a response as a server would: `send` collects the body, `receive` reports a
    disconnect once asked to; `stall` makes every later send wait forever (a client that stopped
    reading)."""

    def __init__(self, response: Any, encoding: str) -> None:
        import asyncio

        self.decoder = Decoder(encoding)
        self.text = ""
        self.messages: list[dict] = []
        self.stall = False
        self.gone = asyncio.Event()
        self.changed = asyncio.Event()
        scope = {"type": "http", "method": "GET", "path": "/stream", "headers": []}
        self.task = asyncio.ensure_future(response(scope, self.receive, self.send))

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        import asyncio

        if self.stall and message["type"] == "http.response.body":
            await asyncio.Event().wait()
        self.messages.append(message)
        self.text += self.decoder.feed(message.get("body", b"")).decode()
        self.changed.set()

    async def until(self, text: str) -> None:
        import asyncio

        async def seen() -> None:
            while text not in self.text:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(seen(), 10)


async def board_exchange(lith: Any, tab: str = "t1") -> tuple[Any, Exchange]:
    """An identity stream of `board/1` run as a server would, once its first frame is out."""
    from fastapi_lith.engine.encoders import IdentityEncoder

    response = await lith.open_stream(stream_request(f"views=board/1&tab={tab}"), IdentityEncoder())
    exchange = Exchange(response, "identity")
    await exchange.until('<p id="board-1">0</p>')
    return response, exchange


async def test_the_stream_route_refuses_a_bad_query_with_a_plain_400(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    async with lith.lifespan(ticks=False):
        for query, message in [
            ("views=board/1", "tab must be 1 to 64 letters, digits, '-' or '_'"),
            ("views=board/1&tab=a%20b", "tab must be 1 to 64 letters, digits, '-' or '_'"),
            ("tab=t1", "views is required: ?views=key1,key2&tab=…"),
            ("views=,&tab=t1", "views is required: ?views=key1,key2&tab=…"),
            ("views=board/1,nope&tab=t1", "no view matches 'nope'"),
        ]:
            response = await lith.open_stream(stream_request(query), ZstdEncoder())
            assert (response.status_code, response.body.decode()) == (400, message), query
        assert not lith.hub.streams and not lith.hub.instances  # a refused stream holds nothing


async def test_a_stream_sends_its_views_then_their_changes_and_closes_on_disconnect(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import Add, make_lith

    lith, _ = make_lith(tmp_path)
    lith.hibernate_after = 0.3
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1,quiet&views=board/2&tab=t1"), ZstdEncoder())
        assert response.headers["content-encoding"] == "zstd" and response.headers["vary"] == "Accept-Encoding"
        exchange = Exchange(response, "zstd")
        await exchange.until('<p id="board-2">0</p>')
        assert '<p id="board-1">0</p>' in exchange.text and "nothing happens here" in exchange.text
        # No raw ping before it: the first event opens with the stream's `retry:` field alone.
        assert re.match(r"retry: \d+\nevent: datastar-patch-elements", exchange.text)
        await lith.writer.do(Add(n=5))
        await exchange.until('<p id="board-1">5</p>')
        [stream] = lith.hub.streams
        assert stream.taken == 4  # three first frames, then one change
        assert lith.hub.push("t1", Frame("lith-error", '<div id="lith-error">pushed</div>')) == 1
        await exchange.until('<div id="lith-error">pushed</div>')  # pushes find the tab by its id
        async with asyncio.timeout(10):  # idle past the app's hibernate_after: the zstd frame ends
            while not exchange.decoder.frames_ended:
                exchange.changed.clear()
                await exchange.changed.wait()
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)
        assert not lith.hub.streams and not lith.hub.instances  # the tab's views are dropped


async def test_server_shutdown_ends_a_stream_cleanly_and_frees_it(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    lith.keepalive = 0.3
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), IdentityEncoder())
        assert "content-encoding" not in response.headers
        exchange = Exchange(response, "identity")
        await exchange.until('<p id="board-1">0</p>')
        # Idle, the body sends the app's keep-alives (through the encoder), never a raw ping.
        await exchange.until(": keep-alive\n\n" * 4)
        assert "ping" not in exchange.text
        lith.hub.end_streams()  # what the hub does when uvicorn is told to stop
        await asyncio.wait_for(exchange.task, 10)
        assert exchange.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert not lith.hub.streams


async def test_a_stream_that_opens_after_the_stop_signal_ends_at_once(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        lith.hub.end_streams()  # what the hub does when uvicorn is told to stop
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), ZstdEncoder())
        exchange = Exchange(response, "zstd")
        await asyncio.wait_for(exchange.task, 10)
        assert exchange.decoder.frames_ended == 1  # a clean end: the page reconnects elsewhere
        assert not lith.hub.streams
    async with lith.lifespan():  # the next start serves streams again
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), ZstdEncoder())
        exchange = Exchange(response, "zstd")
        await exchange.until('<p id="board-1">0</p>')
        assert not exchange.task.done()
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)


async def test_a_client_that_stops_reading_is_ended_after_the_send_timeout(tmp_path: Path) -> None:
    from sse_starlette.sse import SendTimeoutError

    from tests.engine.test_hub import Add, make_lith

    lith, _ = make_lith(tmp_path)
    lith.send_timeout = 0.2
    async with lith.lifespan():
        response, exchange = await board_exchange(lith)
        exchange.stall = True
        await lith.writer.do(Add())
        with pytest.raises(SendTimeoutError):  # the server then drops the connection
            await asyncio.wait_for(exchange.task, 10)  # ended, not waiting on the client forever
        assert not lith.hub.streams
        assert response.stream is not None and response.stream.send_timeouts == 1  # counted, once
        # The body's own cleanup ran before the error went on, not whenever a collection comes.
        assert response.body_iterator.ag_frame is None  # type: ignore[attr-defined]


async def test_a_head_of_the_stream_answers_its_headers_and_leaves_nothing_watching(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), ZstdEncoder())
        assert len(lith.hub.streams) == 1  # opened for the request, as for a GET
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.disconnect"}

        await asyncio.wait_for(response({"type": "http", "method": "HEAD", "path": "/stream", "headers": []}, receive, send), 10)
        assert sent[0]["status"] == 200 and (b"content-encoding", b"zstd") in sent[0]["headers"]
        assert b"".join(m.get("body", b"") for m in sent[1:]) == b""
        assert not lith.hub.streams and not lith.hub.instances  # nothing left watching the board


async def test_a_stream_idle_past_the_send_timeout_is_not_ended(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The send timeout is for a send that cannot finish: a stream with nothing to send for
    longer than it, between frames, stays open and sends the next, and its watchdog, finding
    no send in progress, says nothing."""
    from tests.engine.test_hub import Add, make_lith

    lith, _ = make_lith(tmp_path)
    lith.send_timeout = 0.2
    lith.keepalive = 1.0  # the first thing sent after several send timeouts' worth of quiet
    async with lith.lifespan():
        response, exchange = await board_exchange(lith)
        await exchange.until(": keep-alive")
        await lith.writer.do(Add())
        await exchange.until('<p id="board-1">1</p>')
        assert not exchange.task.done()
        assert [s.send_timeouts for s in lith.hub.streams] == [0]
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)
    assert response.stream is not None and response.stream.send_timeouts == 0  # a disconnect is no timeout
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_stream_cancelled_from_outside_is_no_send_timeout(tmp_path: Path) -> None:
    """uvicorn cancels what is still running at its graceful-shutdown deadline: the cancel goes
    on as itself, and only the watchdog's own cancel counts as a send timeout."""
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    lith.send_timeout = 60
    async with lith.lifespan():
        response, exchange = await board_exchange(lith)
        exchange.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await exchange.task
        assert response.stream is not None and response.stream.send_timeouts == 0
        assert not lith.hub.streams


async def test_each_stream_draws_its_reconnect_delay_from_1_s_to_reconnect_within(tmp_path: Path) -> None:
    """A deploy ends every stream at once: the pages come back spread over the window."""
    from tests.engine.test_hub import make_lith

    lith, _ = make_lith(tmp_path)
    retries = []
    async with lith.lifespan():
        for n in range(60):
            response, exchange = await board_exchange(lith, tab=f"t{n}")
            retries.append(int(re.match(r"retry: (\d+)\n", exchange.text)[1]))  # type: ignore[index]
            exchange.gone.set()
            await asyncio.wait_for(exchange.task, 10)
    assert all(1000 <= r <= 5000 for r in retries), retries
    # Over the whole window: none of 60 draws in its first (or its last) quarter is a chance of
    # 2 * 0.75^60, about one in 15 million.
    assert min(retries) < 2000 and max(retries) > 4000, retries


async def test_next_returns_nothing_once_its_timeout_passes() -> None:
    from fastapi_lith.engine.streams import Stream

    stream = Stream("t1")
    assert await asyncio.wait_for(stream.next(timeout=0.05), 10) == []
