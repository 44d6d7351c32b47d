"""The stream encoders, by the name a request negotiates (which one it gets: `accept.py`).

zstd lives in zstd.py, what every encoder does in encoder.py; brotli, gzip and identity here.
"""

from __future__ import annotations

import zlib
from typing import Any

import brotli

__all__ = [
    "ENCODINGS",
    "BrotliEncoder",
    "Encoder",
    "GzipEncoder",
    "IdentityEncoder",
    "ZstdEncoder",
    "make_encoder",
    "negotiate",
]

from .. import settings as _settings
from ..exceptions import EncoderClosed, SettingError
from .accept import ENCODINGS, negotiate
from .encoder import Encoder
from .zstd import ZstdEncoder


class IdentityEncoder(Encoder):
    """No compression: events pass through untouched."""

    def encode(self, *events: bytes) -> bytes:
        return events[0] if len(events) == 1 else b"".join(events)


def _brotli_lgwin(size: int) -> int:
    """The smallest window that holds `size` bytes plus a sixteenth, within brotli's 16..24."""
    return min(max(16, (size + size // 16 - 1).bit_length()), 24)


# Resident bytes per stream besides the window, by quality (qualities between share the
# figure below them): RSS measured with brotli 1.2 at lgwin 18, less the window. Qualities 0
# and 1 keep no window of their own.
_BROTLI_TABLES = {
    0: 160_000,
    2: 560_000,
    4: 880_000,
    5: 1_680_000,
    6: 2_950_000,
    9: 13_600_000,
    10: 4_100_000,
}


class BrotliEncoder(Encoder):
    """brotli with one window for the whole stream and a flush per event.

    brotli cannot grow its window mid-stream, and Chromium ignores a second brotli stream in
    the same body, so the compressor is created on the first event with a window sized from it
    (or from `size_hint`, if larger): the smallest power of two holding it plus a sixteenth.
    A later event too large for that window is still encoded correctly, only compressed worse,
    and sets `needs_restart`: the stream should end its response after sending it, so Datastar
    reconnects and the new stream sizes its window from the larger frame. Pass the largest
    frame a stream expects as `size_hint` (or encode the first frames in one call), or a stream
    that starts with a small event would restart on every reconnect.

    Each event is fed in pieces of `flush_every` bytes with a flush after each. Pieces larger
    than brotli's input block (16 KiB up to quality 3, 64 KiB from 4) let a card moved on a
    142 KB board cost kilobytes instead of about a hundred bytes; smaller ones cost more bytes
    (bench/RESULTS.md). None picks the block size for the quality; 0 disables the flushes.
    """

    name = "br"

    def __init__(
        self, quality: int = 4, flush_every: int | None = None, size_hint: int = 0
    ) -> None:
        if not 0 <= quality <= 11:
            raise SettingError("quality must be in 0..11")
        self.quality = quality
        self.flush_every = (
            (16 * 1024 if quality <= 3 else 64 * 1024) if flush_every is None else flush_every
        )
        self.size_hint = size_hint
        self.lgwin: int | None = None  # set by the first event
        self.needs_restart = False
        self._compressor: Any = None
        self._closed = False

    def encode(self, *events: bytes) -> bytes:
        if self._closed:
            raise EncoderClosed("encoder is closed")
        size = sum(map(len, events))
        if self._compressor is None:
            self.lgwin = _brotli_lgwin(max(size, self.size_hint))
            self._compressor = brotli.Compressor(quality=self.quality, lgwin=self.lgwin)
        elif _brotli_lgwin(size) > (self.lgwin or 24):
            self.needs_restart = True
        compressor = self._compressor
        step = self.flush_every
        if not step or size <= step:
            parts = [compressor.process(event) for event in events]
            parts.append(compressor.flush())
            return b"".join(parts)
        # A flush after every `step` bytes of the whole write, as if the events were one.
        parts = []
        room = step
        for event in events:
            view = memoryview(event)
            start = 0
            while start < len(event):
                piece = view[start : start + room]
                parts.append(compressor.process(piece))
                start += len(piece)
                room -= len(piece)
                if not room:
                    parts.append(compressor.flush())
                    room = step
        if room != step:
            parts.append(compressor.flush())
        return b"".join(parts)

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        if self._compressor is None:
            # An empty brotli stream, so even a stream that sent nothing has a valid body.
            empty: bytes = brotli.Compressor(quality=self.quality, lgwin=16).finish()
            return empty
        tail: bytes = self._compressor.finish()
        self._compressor = None
        return tail

    def memory_size(self) -> int:
        if self._compressor is None or self.lgwin is None:
            return 0
        tables = _BROTLI_TABLES[max(q for q in _BROTLI_TABLES if q <= self.quality)]
        return tables if self.quality <= 1 else tables + (1 << self.lgwin)


class GzipEncoder(Encoder):
    """gzip with a sync flush per event; its 32 KiB window rarely reaches the last frame."""

    name = "gzip"

    def __init__(self, level: int = 6) -> None:
        self.level = level
        self._compressor: Any = zlib.compressobj(level, zlib.DEFLATED, 31)
        self._closed = False

    def encode(self, *events: bytes) -> bytes:
        if self._closed:
            raise EncoderClosed("encoder is closed")
        parts = [self._compressor.compress(event) for event in events]
        parts.append(self._compressor.flush(zlib.Z_SYNC_FLUSH))
        return b"".join(parts)

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        tail: bytes = self._compressor.flush(zlib.Z_FINISH)
        return tail

    def memory_size(self) -> int:
        if self._closed:
            return 0
        # zlib's documented figure for deflate: (1 << (windowBits + 2)) + (1 << (memLevel + 9)).
        return (1 << 17) + (1 << 17)


_ENCODERS: dict[str, type[Encoder]] = {
    "zstd": ZstdEncoder,
    "br": BrotliEncoder,
    "gzip": GzipEncoder,
    "identity": IdentityEncoder,
}


def make_encoder(name: str, **settings: Any) -> Encoder:
    """The encoder for a negotiated name, e.g. `make_encoder("br", quality=5)`."""
    try:
        cls = _ENCODERS[name]
    except KeyError:
        raise SettingError(f"unknown encoding {name!r}, expected one of {ENCODINGS}") from None
    return cls(**settings)


def encoder_settings(
    *, zstd_window_log: int | None, brotli_quality: int, gzip_level: int
) -> dict[str, dict[str, Any]]:
    """Each encoding's `make_encoder` arguments from an app's settings, checked when the app is
    built (`SettingError`) rather than at its first stream. A None window sizes each zstd
    stream's window from its first write."""
    if zstd_window_log is not None:
        _settings.number("zstd_window_log", zstd_window_log, low=10, high=ZstdEncoder.MAX_WINDOW_LOG, integer=True)
    _settings.number("brotli_quality", brotli_quality, low=0, high=11, integer=True)
    _settings.number("gzip_level", gzip_level, low=0, high=9, integer=True)
    return {"zstd": {"window_log": zstd_window_log}, "br": {"quality": brotli_quality}, "gzip": {"level": gzip_level}}
