"""`Encoder`: what a stream asks of its body's compressor (the ones there are: `encoders.py`).

A stream sends the same view again and again with a small change, so each encoder keeps one
compression window for the whole response: a frame that repeats the previous one costs a few
bytes. Every event is flushed, so the browser decodes it the moment it arrives.

One encoder belongs to one stream. It is not thread-safe, but its calls may run in a worker
thread: zstandard, brotli and zlib all release the GIL while they compress.
"""

from __future__ import annotations

from .frames import Frame, sse_event

__all__ = ["Encoder"]


class Encoder:
    """Compresses one stream's events into one response body.

    `encode` returns bytes that decode to exactly the events given, in order, at once (they are
    fed to the compressor one by one, never joined into a copy); `close` ends the body so the
    client sees a clean end of stream rather than a truncated one.
    """

    name: str | None = None  # the `Content-Encoding` value; None for identity
    can_hibernate: bool = False
    needs_restart: bool = False  # brotli: a frame outgrew the window, see BrotliEncoder

    @property
    def hibernating(self) -> bool:
        """zstd: no compressor held (idle, nothing sent yet, or only writes small enough to go
        alone since); the others never hibernate."""
        return False

    def encode(self, *events: bytes) -> bytes:
        raise NotImplementedError

    def encode_frames(self, frames: list[Frame]) -> bytes:
        """`encode` of the frames' events: what the fan-out calls. zstd shares the work of the
        frames many streams send (`Frame.shared`) among them (cohorts.py)."""
        return self.encode(*map(sse_event, frames))

    def close(self) -> bytes:
        return b""

    def hibernate(self) -> bytes:
        """Free the compressor of an idle stream; only zstd can, the others return b""."""
        return b""

    def encode_asleep(self, *events: bytes) -> bytes:
        """`encode`, leaving a hibernating encoder asleep: an idle stream's keep-alive. Only zstd
        hibernates: the others encode as ever."""
        return self.encode(*events)

    def memory_size(self) -> int:
        """Approximate bytes the encoder keeps resident once its window has filled."""
        return 0
