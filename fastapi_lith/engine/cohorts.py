"""Cohorts: one zstd frame compressed once for every stream that sends the same writes.

A tick sends one view's frame to every tab that watches it, and the tabs that showed the same
render before get the same patches. Compressed through a window of each tab's own, that is one
compression per tab of the same bytes against nearly the same history. A cohort is a zstd
frame that several streams started together with the same write: while each of them goes on
sending what the others send, the compressor's output is the same for all, so it is made once
and every member writes the same bytes.

A member that needs something else (a frame of its own, a frame it skipped, a keep-alive)
leaves: it ends the zstd frame in its own body with an empty last block (`EPILOGUE`, three
bytes: a frame flushed to a block's end may end there) and starts a new one. The streams that
leave in one tick for the same write start a cohort of their own together, so the number of
compressions a tick follows how many ways the tabs differ, not how many there are.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import zstandard

__all__ = ["EPILOGUE", "Cohort", "Key", "counts", "flushed", "join"]

# A zstd block header: last block, raw, 0 bytes. Frames here carry no checksum, so this ends one.
EPILOGUE = b"\x01\x00\x00"

# Writes a cohort keeps made, for members a write or two behind the first to ask; and how far
# along a cohort may still be joined (its first write is kept for that).
KEPT = 4

# The writes' keys: the frames' serials, each frame's event the same bytes for every stream.
Key = tuple[int, ...]


def flushed(chunker: Any, events: Iterable[bytes]) -> bytes:
    """`events` through a zstd chunker, flushed to a block's end: each decodes as it arrives,
    and the frame may end right after it (`EPILOGUE`)."""
    parts: list[bytes] = []
    for event in events:
        parts += chunker.compress(event)
    parts += chunker.flush()
    return b"".join(parts)


class Counts:
    """What cohorts did since the process started: the benchmarks print these."""

    __slots__ = ("made", "reused", "__weakref__")

    def __init__(self) -> None:
        self.made = self.reused = 0


counts = Counts()


class Cohort:
    """One zstd frame written for several streams: `write(position, key, events)` gives the
    bytes of its write at `position`, compressed by whichever member asks first."""

    __slots__ = ("params", "fits", "members", "_chunker", "_position", "_made", "_lock", "__weakref__")

    def __init__(self, params: Any, fits: int, chunk_size: int) -> None:
        self.params = params
        self.fits = fits  # the largest write this window holds enough of (the encoder's rule)
        self.members = 0
        compressor = zstandard.ZstdCompressor(compression_params=params)
        self._chunker: Any = compressor.chunker(chunk_size=chunk_size)
        self._position = 0
        self._made: dict[int, tuple[Key, bytes]] = {}
        self._lock = threading.Lock()

    @property
    def position(self) -> int:
        """How many writes it has made."""
        return self._position

    def write(self, position: int, key: Key, events: list[bytes]) -> bytes | None:
        """The bytes of write `position`, which a member sends after the `position` writes
        before; None when it was made of other frames (or is too old to be kept): the member
        must leave."""
        with self._lock:
            made = self._made.get(position)
            if made is not None:
                if made[0] != key:
                    return None
                counts.reused += 1
                return made[1]
            if position != self._position:
                return None
            out = flushed(self._chunker, events)
            if position > KEPT:  # the first write stays: a joiner starts with it
                self._made.pop(position - KEPT, None)
            self._made[position] = (key, out)
            self._position += 1
            counts.made += 1
            return out

    def leave(self) -> None:
        with _LOCK:
            self.members -= 1


_LOCK = threading.Lock()
# Cohorts by what their frame started with, while they may still be joined.
_starting: weakref.WeakValueDictionary[tuple[Any, Key], Cohort] = weakref.WeakValueDictionary()


def join(identity: Any, key: Key, events: list[bytes], params: Any, fits: int, chunk_size: int) -> tuple[Cohort, bytes]:
    """The cohort whose frame starts with the write `key` (`events`), with the parameters that
    `identity` names, and that write's bytes: the frame's header and its first block. A cohort
    of others that started with it a moment ago is joined; else a new one starts."""
    with _LOCK:
        cohort = _starting.get((identity, key))
        if cohort is None or cohort.position > KEPT:
            cohort = _starting[(identity, key)] = Cohort(params, fits, chunk_size)
        cohort.members += 1
    out = cohort.write(0, key, events)
    assert out is not None  # its first write is kept, and it is the write of `key`
    return cohort, out
