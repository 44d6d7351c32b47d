"""The load client: HTTP/1.1 and SSE over raw asyncio protocols, the lightest client Python has.

It shares the cores with the server it loads, so it does as little as it can: no HTTP library,
bodies de-chunked and decompressed by hand, events split on the blank line and handed to a
callback with the time their bytes arrived.

    stream = await open_stream(port, "/lith/stream?views=...&tab=t1", "zstd", on_event)
    poster = await Poster.connect(port)
    status = await poster.post("/cards/move", body)

`on_event(stream, event, at)` gets each event's bytes (keep-alive comments too, starting
with `:`); a stream the server ends calls `on_end(stream)` once, as Datastar would reconnect.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import zstandard

HEADERS = "Datastar-Request: true\r\nSec-Fetch-Site: same-origin\r\n"


def _event_end(data: bytes, start: int) -> int:
    """Where the event from `start` ends (its blank line), or -1: by each newline, which `find`
    looks for with memchr, where its search for the two bytes `\n\n` steps through a 150 KB
    event's every few bytes, about seventy times as long."""
    while (nl := data.find(b"\n", start)) >= 0:
        if data[nl + 1:nl + 2] == b"\n":
            return nl
        start = nl + 1
    return -1


class Decoder:
    """One body's Content-Encoding, undone as its chunks arrive."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.frames_ended = 0  # zstd frames finished: a stream hibernated (and one at its end)
        if encoding == "gzip":
            self.gz = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "zstd":
            self.dctx = zstandard.ZstdDecompressor()
            self.z = self.dctx.decompressobj(write_size=1 << 19)
        elif encoding == "br":
            self.br = brotli.Decompressor()

    def __call__(self, payload: bytes) -> bytes:
        if self.encoding == "zstd":
            out = self.z.decompress(payload)
            while self.z.eof:  # a hibernated stream starts a new zstd frame in the same body
                self.frames_ended += 1
                rest = self.z.unused_data
                self.z = self.dctx.decompressobj(write_size=1 << 19)
                if not rest:
                    break
                out += self.z.decompress(rest)
            return bytes(out)
        if self.encoding == "br":
            out = self.br.process(payload)
            while more := self.br.process(b""):  # process() can hold back part of a flushed block
                out += more
            return bytes(out)
        if self.encoding == "gzip":
            return self.gz.decompress(payload)
        return payload


OnEvent = Callable[["SseStream", bytes, float], None]


class SseStream(asyncio.Protocol):
    """One SSE response: status and headers checked, body de-chunked, decoded, split in events."""

    def __init__(self, tab: str, encoding: str, on_event: OnEvent) -> None:
        self.tab, self.encoding, self.on_event = tab, encoding, on_event
        self.decode = Decoder(encoding)
        self.buf = bytearray()
        self.text = b""  # decoded bytes after the last complete event
        self.headers_done = False
        self.need: int | None = None  # the size of the chunk being read
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_end: Callable[[SseStream], None] | None = None
        self.error: str | None = None
        self.status: int | None = None  # the response's, once its headers came
        self.finished = False  # the body's last chunk came: the server ended it cleanly
        self.on_bytes: Callable[[SseStream], None] | None = None  # after each read's chunks
        self.transport: asyncio.Transport | None = None
        self.body = self.chunks = self.decoded = self.events = self.keepalives = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"stream {self.tab} closed before its headers"))
        self.ended()

    def ended(self) -> None:
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(self)

    def fail(self, why: str) -> None:
        self.error = why
        if not self.opened.done():
            self.opened.set_exception(RuntimeError(f"stream {self.tab}: {why}"))
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self.buf
        buf += data
        pos = 0
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1").split("\r\n")
            status = self.status = int(head[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            self.headers_done, pos = True, end + 4
            if status != 200 or headers.get("transfer-encoding", "").lower() != "chunked":
                return self.fail(f"status {status}, headers {headers}")
            if headers.get("content-encoding", "identity") != self.encoding:
                return self.fail(f"asked for {self.encoding}, got {headers.get('content-encoding')!r}")
            self.opened.set_result(None)
        n = len(buf)
        try:
            while True:
                if self.need is None:
                    eol = buf.find(b"\r\n", pos)
                    if eol < 0:
                        break
                    size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
                    if size == 0:  # the server ended the body
                        pos = n
                        self.finished = True
                        self.ended()
                        break
                    pos, self.need = eol + 2, size
                if n - pos < self.need + 2:
                    break
                payload = bytes(buf[pos:pos + self.need])
                pos += self.need + 2
                self.need = None
                self.body += len(payload)
                self.chunks += 1
                self.split(self.decode(payload), now)
        except Exception as exc:  # noqa: BLE001 - a corrupt body is a finding: reported
            return self.fail(f"{type(exc).__name__}: {exc}")
        del buf[:pos]
        if self.on_bytes is not None:
            self.on_bytes(self)

    def split(self, out: bytes, now: float) -> None:
        if not out:
            return
        self.decoded += len(out)
        data = self.text + out if self.text else out
        start = 0
        while (end := _event_end(data, start)) >= 0:
            event = data[start:end]
            if event.startswith(b":"):
                self.keepalives += 1
            else:
                self.events += 1
            self.on_event(self, event, now)
            start = end + 2
        self.text = data[start:]

    def close(self) -> None:
        self.on_end = None
        if self.transport is not None:
            self.transport.close()


async def open_stream(
    port: int, path: str, encoding: str, on_event: OnEvent, tab: str = "", *, cookie: str = "",
    authorization: str = "",
) -> SseStream:
    """Connect and send the GET (with `cookie`, a signed-in browser's, or `authorization`, an
    operator's); the stream's `opened` resolves once its headers are checked."""
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: SseStream(tab, encoding, on_event), "127.0.0.1", port)
    assert stream.transport is not None
    signed_in = f"Cookie: {cookie}\r\n" if cookie else ""
    signed_in += f"Authorization: {authorization}\r\n" if authorization else ""
    stream.transport.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
        f"Accept-Encoding: {encoding}\r\nCache-Control: no-cache\r\n{HEADERS}{signed_in}\r\n".encode())
    return stream


class Poster(asyncio.Protocol):
    """One keep-alive connection for one producer's POSTs, one at a time; answers the status."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.buf = bytearray()
        self.answer: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None

    @classmethod
    async def connect(cls, port: int) -> Poster:
        _, poster = await asyncio.get_running_loop().create_connection(lambda: cls(port), "127.0.0.1", port)
        return poster

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("POST connection closed"))

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> asyncio.Future[int]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: {content_type}\r\n{HEADERS}"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        return self.answer

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value)
        if len(buf) < end + 4 + length:
            return
        del buf[:end + 4 + length]
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(int(head[0].split()[1]))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def run(coro: Any) -> Any:
    """The client's loop: uvloop, the fastest there is, so the client takes less of the cores."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
