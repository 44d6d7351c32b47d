"""What a browser does with a stream's body, for the encoder tests: decode as bytes arrive, and
the board's frames to encode."""

from __future__ import annotations

import functools
import gzip
import io
import zlib
from collections.abc import Callable

import brotli
import zstandard
from datastar_py.sse import ServerSentEventGenerator as SSE

from examples.kanban.synthetic import board_html, change_card, make_cards
from fastapi_lith.engine.encoders import Encoder


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

def board_frames(n: int) -> list[bytes]:
    """Datastar events of the 142 KB kanban board, one card changed from one to the next."""
    cards = make_cards()
    frames = []
    for step in range(n):
        frames.append(SSE.patch_elements(board_html(cards)).encode())
        cards = change_card(cards, step)
    return frames


@functools.cache
def board_frames_40() -> list[bytes]:
    """Forty frames of the 142 KB board, made once for every test module that sends them."""
    frames = board_frames(40)
    assert all(135_000 <= len(f) <= 150_000 for f in frames)
    return frames


def sizes_after_first(encoder: Encoder, frames: list[bytes]) -> list[int]:
    sizes = [len(encoder.encode(f)) for f in frames]
    encoder.close()
    return sizes[1:]
