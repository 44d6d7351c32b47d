"""Streams: one per tab, holding only the newest frame of each view it watches.

A slow tab skips frames instead of queueing them, so it costs the hub nothing and shows the
newest state when it catches up. The hub offers frames; the tab's SSE response (`body`) takes
them, compresses them against everything the stream sent before, and flushes each at once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from datastar_py.sse import ServerSentEventGenerator

from .encoders import Encoder


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Frame:
    """One render of one view instance: its HTML and the Datastar event, encoded once."""

    key: str
    html: str
    event: bytes

    @classmethod
    def patch(cls, key: str, html: str, signals: dict[str, Any] | None = None) -> Frame:
        """A `datastar-patch-elements` event of `html`, then a signals patch if any."""
        event = ServerSentEventGenerator.patch_elements(html)
        if signals:
            event += ServerSentEventGenerator.patch_signals(signals)
        return cls(key, html, str(event).encode())


class Watcher(Protocol):
    def caught_up(self, keys: Iterable[str]) -> None: ...


class Stream:
    """The frames one tab has not taken yet, newest per view instance."""

    def __init__(self, tab: str) -> None:
        self.tab = tab
        self.keys: tuple[str, ...] = ()
        self.skipped = 0
        self.taken = 0
        self.ended = False
        self._pending: dict[str, Frame] = {}
        self._ready = asyncio.Event()
        self._hub: Watcher | None = None

    def offer(self, frame: Frame) -> bool:
        """Hold `frame` for the tab, replacing an unsent one of the same view (then True)."""
        replaced = frame.key in self._pending
        if replaced:
            self.skipped += 1
        self._pending[frame.key] = frame
        self._ready.set()
        return replaced

    def holds(self, key: str) -> bool:
        """Whether an unsent frame of `key` waits here: the hub does not render for a full queue."""
        return key in self._pending

    def take(self) -> list[Frame]:
        """Every pending frame, oldest view first; the hub may render for this tab again."""
        frames = self._pending
        if not frames:
            return []
        self._pending = {}
        self._ready.clear()
        self.taken += len(frames)
        if self._hub is not None:
            self._hub.caught_up(frames.keys())
        return list(frames.values())

    async def next(self, timeout: float | None = None) -> list[Frame]:
        """Wait for at least one frame, then take them all; [] on timeout or once ended."""
        if not self._pending and not self.ended:  # only a wait needs the timeout's machinery
            try:
                async with asyncio.timeout(timeout):
                    while not self._pending and not self.ended:
                        self._ready.clear()
                        await self._ready.wait()
            except TimeoutError:
                return []
        return self.take()

    def end(self) -> None:
        """Make the response finish its body and return (server shutdown)."""
        self.ended = True
        self._ready.set()


# Tab ids come from the page; they name per-tab views and travel in URLs and commands.
TAB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
KEEPALIVE = b": keep-alive\n\n"


async def body(
    stream: Stream,
    encoder: Encoder,
    *,
    keepalive: float = 15.0,
    hibernate_after: float = 30.0,
) -> AsyncIterator[bytes]:
    """The compressed SSE body of one tab: frames as they come, keep-alives, a clean end.

    A zstd stream idle for `hibernate_after` seconds ends its zstd frame and frees its
    compressor; the next event opens a new frame (browsers decode several in one body). A
    keep-alive goes through the encoder like any event, so the body stays one valid stream.
    """
    loop = asyncio.get_running_loop()
    last_event = last_write = loop.time()
    while not stream.ended:
        can_hibernate = encoder.can_hibernate and not encoder.hibernating
        wake = last_write + keepalive
        if can_hibernate:
            wake = min(wake, last_event + hibernate_after)
        frames = await stream.next(timeout=max(0.0, wake - loop.time()))
        now = loop.time()
        if frames:
            yield encoder.encode(b"".join(f.event for f in frames))
            last_event = last_write = now
            if encoder.needs_restart:  # a frame outgrew the brotli window: reconnect afresh
                break
        elif stream.ended:
            break
        elif can_hibernate and now >= last_event + hibernate_after:
            yield encoder.hibernate()
        elif now >= last_write + keepalive:
            asleep = encoder.hibernating
            out = encoder.encode(KEEPALIVE)
            yield out + encoder.hibernate() if asleep else out  # asleep: free it again at once
            last_write = now
    yield encoder.close()
