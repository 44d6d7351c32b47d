"""zstd for SSE bodies: one window per stream or per cohort, frames of their own, hibernation.

zstd is the encoder browsers are sent first (accept.py): the cheapest per frame, and the only
one whose body may hold several frames, which is what lets a stream free its compressor while
idle, send a small write as a frame made once for every tab, and share a cohort's frame with
the tabs that take the same writes (cohorts.py).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, ClassVar

import zstandard

from ..exceptions import EncoderClosed, SettingError
from . import cohorts as _cohorts
from .encoder import Encoder
from .frames import Frame, html_size, sse_event

__all__ = ["ALONE_BELOW", "ZstdEncoder"]

# How many writes of the first one's size a sized window holds. The fast strategy finds text
# again only while the write where it was last coded as literals is inside the window: with
# room for about two writes a moved card costs kilobytes, with four to seven a few hundred
# bytes (bench/RESULTS.md).
ZSTD_FRAMES = 4
# Bytes of compressed output a zstd stream buffers at a time: a frame's larger output comes in
# several pieces, joined. A counter's stream holds about 7 KiB less than with 128 KiB.
ZSTD_CHUNK = 1024


def _zstd_window_log(size: int) -> int:
    """A window that holds `ZSTD_FRAMES` writes of `size` bytes, within 2^10..2^23."""
    return min(max(zstandard.WINDOWLOG_MIN, (ZSTD_FRAMES * size - 1).bit_length()), ZstdEncoder.MAX_WINDOW_LOG)


def _zstd_fits(window_log: int) -> int:
    """The largest write a window sized from the writes holds `ZSTD_FRAMES` of; any write for
    the largest window, which cannot grow."""
    return sys.maxsize if window_log == ZstdEncoder.MAX_WINDOW_LOG else (1 << window_log) // ZSTD_FRAMES


# A cohort's writes (cohorts.py) are compressed once for all its members, so they can afford
# zstd's level 6 (lazy matching) and a larger table: about a fifth fewer bytes a frame on the
# board at 800 moves/s for the same CPU a frame, and less time waiting for a CPU (RESULTS.md).
COHORT_LEVEL = 6
COHORT_HASH_LOG = 17

# A write under this many bytes to a zstd stream that holds no window goes as a zstd frame of
# its own. A status line or a counter costs a hundred bytes or so that way, against a dozen
# through a window, and its stream keeps no compressor: tens of KiB a tab at thousands of tabs,
# and one compress per change for all of them instead of one per tab.
ALONE_BELOW = 1024

_ONE_SHOT = threading.local()  # a compressor per thread: the loop's, and each fan-out worker's


def _compress(data: bytes) -> bytes:
    """`data` as one whole zstd frame, its parameters fitted to its size by zstd."""
    compressor = getattr(_ONE_SHOT, "compressor", None)
    if compressor is None:
        compressor = _ONE_SHOT.compressor = zstandard.ZstdCompressor(level=1)
    frame: bytes = compressor.compress(data)
    return frame


# The events a frame is made once for: a keep-alive, and a shared view's change, the same bytes
# object (frames.sse_event) for every tab that watches it, so its hash is computed once too.
_zstd_frame = functools.lru_cache(maxsize=64)(_compress)


def _alone(events: tuple[bytes, ...]) -> bytes:
    """`events` as one zstd frame of their own: one event made once for every stream that sends
    it, several (a tab's own write) compressed for this write alone."""
    return _zstd_frame(events[0]) if len(events) == 1 else _compress(b"".join(events))


class ZstdEncoder(Encoder):
    """zstd with one window over the whole stream and a flushed block per event.

    `hibernate` ends the current zstd frame and frees the compressor: the next event starts a
    new frame in the same body, which browsers decode (they do not for brotli). The new frame
    starts with an empty window, so its first event costs about what a fresh stream's does.

    The window is sized from the write that opens it unless `window_log` is given: room for
    `ZSTD_FRAMES` writes of that size, between 2^10 and 2^23, so a big board gets a window that
    reaches back far enough and a 10 KB page keeps a seventh of a board's memory. A later
    write too large for that window ends the zstd frame and starts one sized from it, in the
    same body: a view that grows costs one fresh frame, not a window too short from then on.
    A write under `ALONE_BELOW` bytes while no window is open (a small view's change, a tab's
    outcome) opens none: it goes as a frame of its own, and one sent to many streams is
    compressed once for all. Frames that other streams take too go through a cohort's frame
    instead of this stream's own window (`encode_frames`, cohorts.py), at level 6 or `level` if
    higher. `level`, `window_log` and `hash_log` pick zstd's parameters; any other field of
    `zstandard.ZstdCompressionParameters` (chain_log, strategy, ...) can be given by name.
    """

    name = "zstd"
    can_hibernate = True
    # Browsers refuse a window over 8 MiB.
    MAX_WINDOW_LOG: ClassVar[int] = 23

    def __init__(
        self,
        level: int = 1,
        window_log: int | None = None,
        hash_log: int | None = 13,
        **params: int,
    ) -> None:
        if window_log is not None and not zstandard.WINDOWLOG_MIN <= window_log <= self.MAX_WINDOW_LOG:
            raise SettingError(
                f"window_log must be in {zstandard.WINDOWLOG_MIN}..{self.MAX_WINDOW_LOG}"
            )
        # Level 1 is the fastest level that still entropy-codes literals: levels -1 to -5 saved
        # at most 15% CPU for 6-34% more bytes per frame and 8-41% larger first frames. Its
        # fast strategy keeps one table, 4 * 2**hash_log bytes: 13 (32 KiB) sends the same
        # bytes on a 142 KB board as level 1's own 14 or 16, with 2^19 and 2^20 windows alike
        # (bench/RESULTS.md). None leaves zstd's choice for the level.
        self.level = level
        self.window_log = window_log
        self.hash_log = hash_log
        # What the parameters are made of, its own window's and its cohorts' (which it shares
        # only with streams whose settings are the same).
        extra = tuple(sorted(params.items()))
        self._identity = (level, hash_log, extra)
        self._cohort_identity = (
            max(level, COHORT_LEVEL), None if hash_log is None else max(hash_log, COHORT_HASH_LOG), extra
        )
        self.params: Any = None if window_log is None else self._params(window_log)
        # The largest write the sized window holds `ZSTD_FRAMES` of (None: a fixed window).
        self._fits: int | None = 0 if window_log is None else None
        self._stream: Any = None  # a ZstdCompressionChunker while a frame of its own is open
        # Or the cohort whose frame it is in (`encode_frames`), and how many writes it sent there.
        self._cohort: _cohorts.Cohort | None = None
        self._position = 0
        self._sent = False
        self._closed = False

    def _params(self, window_log: int) -> Any:
        return _zstd_params(self._identity, window_log)

    @classmethod
    def low_memory(cls) -> ZstdEncoder:
        """About 0.4 MiB per stream: for pages whose frames stay under ~64 KB.

        The window holds 2^18 bytes whatever the first write, so keep a frame under a quarter
        of it (64 KB) for repeats to cost a few bytes; a 142 KB board costs kilobytes here.
        """
        return cls(level=1, window_log=18, hash_log=13)

    @classmethod
    def dense(cls) -> ZstdEncoder:
        """A sixth of the bytes per frame for three to four times the CPU: for slow links.

        The fast strategy does not index the positions inside a long match, so once the frame
        where a card first appeared leaves the window its text is found no more, and a moved
        card costs kilobytes. The binary-tree strategy indexes every position, at the same
        window and memory (bench/RESULTS.md).
        """
        return cls(
            level=1,
            window_log=19,
            strategy=zstandard.STRATEGY_BTLAZY2,
            hash_log=13,
            chain_log=14,
            search_log=1,
            min_match=6,
        )

    @property
    def hibernating(self) -> bool:
        return self._stream is None and self._cohort is None

    def encode(self, *events: bytes) -> bytes:
        if self._closed:
            raise EncoderClosed("encoder is closed")
        head = self._leave()
        size = len(events[0]) if len(events) == 1 else sum(map(len, events))
        if self._stream is None and size < ALONE_BELOW:
            self._sent = True
            return head + _alone(events)
        if self._fits is not None and size > self._fits:  # sized by the writes: grow it for this one
            head += self.hibernate()
            window_log = _zstd_window_log(size)
            self.params = self._params(window_log)
            self._fits = _zstd_fits(window_log)
        if self._stream is None:
            # A chunker, not a compressobj: its output buffer is ZSTD_CHUNK bytes, where a
            # compressobj's is 128 KiB.
            compressor = zstandard.ZstdCompressor(compression_params=self.params)
            self._stream = compressor.chunker(chunk_size=ZSTD_CHUNK)
        self._sent = True
        return head + _cohorts.flushed(self._stream, events)

    def encode_frames(self, frames: list[Frame]) -> bytes:
        """The frames' events, those that other streams send too (`Frame.shared`) through a
        cohort's frame (cohorts.py), compressed once for all of them; this stream's own frames
        go first, as a zstd frame of their own, and take it out of its cohort."""
        if self._cohort is None and self._stream is None and len(frames) == 1:
            event = sse_event(frames[0])
            if len(event) < ALONE_BELOW:  # a broadcast's small change: alone, made once (`_alone`)
                return self.encode(event)
        shared = [frame for frame in frames if frame.shared]
        if not shared or self._closed:
            return self.encode(*map(sse_event, frames))
        events = [sse_event(frame) for frame in shared]
        key = tuple(frame.serial for frame in shared)
        size = sum(map(len, events))
        # A cohort's window is sized from the whole renders, so it holds several of them
        # however small their patches are.
        needs = max(size, html_size(shared))
        cohort = self._cohort
        if cohort is not None and len(shared) == len(frames) and needs <= cohort.fits:
            out = cohort.write(self._position, key, events)
            if out is not None:
                self._position += 1
                return out
        head = self.hibernate()  # ends its own frame, or leaves its cohort's
        if len(shared) < len(frames):
            head += _compress(b"".join(sse_event(frame) for frame in frames if not frame.shared))
        self._sent = True
        if size < ALONE_BELOW:
            return head + _alone(tuple(events))
        window_log = self.window_log or _zstd_window_log(needs)
        fits = sys.maxsize if self.window_log else _zstd_fits(window_log)
        identity = (self._cohort_identity, window_log)
        params = _zstd_params(*identity)
        self._cohort, out = _cohorts.join(identity, key, events, params, fits, ZSTD_CHUNK)
        self._position = 1
        return head + out

    def encode_asleep(self, *events: bytes) -> bytes:
        if self._stream is not None or self._cohort is not None or self._closed:
            return super().encode_asleep(*events)
        # A zstd frame of its own: an idle stream's keep-alive builds no compressor for it.
        return _alone(events)

    def _leave(self) -> bytes:
        """Out of its cohort, if in one: the three bytes that end the cohort's frame here."""
        cohort = self._cohort
        if cohort is None:
            return b""
        self._cohort = None
        cohort.leave()
        return _cohorts.EPILOGUE

    def hibernate(self) -> bytes:
        if self._stream is None:
            return self._leave()
        tail = b"".join(self._stream.finish())
        self._stream = None
        return tail

    def close(self) -> bytes:
        if self._closed:
            return b""
        if self._sent:
            tail = self.hibernate()
        else:
            # An empty frame, so even a stream that sent nothing has a valid zstd body.
            tail = zstandard.ZstdCompressor(
                compression_params=self.params or self._params(zstandard.WINDOWLOG_MIN)
            ).compress(b"")
        self._closed = True
        return tail

    def memory_size(self) -> int:
        """Its own window's; a cohort's shared among its members."""
        if self._cohort is not None:
            return _zstd_memory(self._cohort.params) // max(1, self._cohort.members)
        if self._stream is None:
            return 0
        return _zstd_memory(self.params)


@functools.lru_cache(maxsize=64)
def _zstd_params(identity: tuple[Any, ...], window_log: int) -> Any:
    """The parameters of an encoder's settings (`ZstdEncoder._identity`) for one window: made
    once, where a stream that joins a cohort at every change would make them each time."""
    level, hash_log, extra = identity
    params = dict(extra)
    if hash_log is not None:
        # A small window needs no larger table than a quarter of it: a 10 KB page keeps its
        # stream under 0.3 MiB.
        params["hash_log"] = min(hash_log, window_log - 4)
    made = zstandard.ZstdCompressionParameters.from_level(level, window_log=window_log, **params)
    if made.strategy != zstandard.STRATEGY_FAST and "chain_log" not in params and made.chain_log > window_log - 2:
        # A slower level's chain table, likewise: a quarter of the window (what level 6 keeps
        # for a 1 MiB one) rather than its megabyte for any window.
        made = zstandard.ZstdCompressionParameters.from_level(
            level, window_log=window_log, chain_log=window_log - 2, **params
        )
    return made


def _zstd_memory(p: Any) -> int:
    """Approximate resident bytes of a zstd compressor with parameters `p`: a window plus a
    block of input (128 KiB) to keep its history, and its tables."""
    window = 1 << p.window_log
    size: int = window + min(window, 128 * 1024) + 4 * (1 << p.hash_log)
    if p.strategy != zstandard.STRATEGY_FAST:
        size += 4 * (1 << p.chain_log)
    return size
