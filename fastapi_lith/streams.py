"""Streams: one per tab, holding only the newest frame of each view it watches.

A slow tab skips frames instead of queueing them, so it costs the hub nothing and shows the
newest state when it catches up. The hub offers frames; the tab's HTTP response takes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Frame:
    """One render of one view instance: its HTML and the Datastar event, encoded once."""

    key: str
    html: str
    event: bytes


class Watcher(Protocol):
    def caught_up(self, keys: Iterable[str]) -> None: ...


class Stream:
    """The frames one tab has not taken yet, newest per view instance."""

    def __init__(self, tab: str) -> None:
        self.tab = tab
        self.keys: tuple[str, ...] = ()
        self.skipped = 0
        self.taken = 0
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

    async def next(self) -> list[Frame]:
        """Wait for at least one frame, then take them all."""
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        return self.take()
