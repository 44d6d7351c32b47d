"""`Frame`: one render of one view instance, and its Datastar SSE event (datastar-py only).

A long render is sent whole only to a tab that shows nothing of its view yet; a tab that shows
an earlier render gets the patches from that one (`Frame.since`, patches.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from datastar_py.sse import ServerSentEventGenerator

from .patches import Index, index, patch_events

# Frames this long or longer are indexed by their keyed elements when rendered, so a tab that
# shows the previous one is sent patches (patches.py); shorter ones cost less sent whole.
PATCH_FROM = 4096
# Patches of one frame kept per frame it follows: the tabs a few frames behind.
_PATCHES_KEPT = 4
_SERIALS = itertools.count()


class Frame:
    """One render of one view instance: its HTML, and the signals to set with it, if any.

    Frames know nothing of a transport: `sse_event(frame)` encodes one for SSE, once however
    many streams send it, where the stream's bytes are made. A frame of patches is a frame
    too: the same key and HTML, and the render it starts from, whose events it formats.
    """

    __slots__ = ("key", "html", "signals", "index", "serial", "shared", "_sse", "_base", "_patches", "__weakref__")

    def __init__(
        self, key: str, html: str, signals: Mapping[str, Any] | None = None, *, index: Index | None = None
    ) -> None:
        self.key = key
        self.html = html
        self.signals = signals
        self.index = index  # its keyed elements: set for a view's long frame (`rendered`)
        self.serial = next(_SERIALS)
        # Offered to several streams (the hub sets it): zstd compresses it once for those that
        # sent the same before (cohorts.py).
        self.shared = False
        self._sse: bytes | None = None
        self._base: Index | None = None  # set on a frame of patches: the render they start from
        self._patches: dict[int, Frame] | None = None

    @classmethod
    def rendered(cls, key: str, html: str, previous: Frame | None = None) -> Frame:
        """A view's render: indexed when long, which happens on the reader thread that rendered
        it, so the tabs that show the previous render can be sent what changed (`since`). The
        `previous` render's index spares reading again what is the same in both."""
        if len(html) < PATCH_FROM:
            return cls(key, html)
        return cls(key, html, index=index(html, previous.index if previous is not None else None))

    def since(self, shown: Frame) -> Frame:
        """What to send a tab that shows `shown`, a frame of the same view: a frame of patches,
        its events made once by the first worker to need them (`sse_event`), or this frame
        when it is not indexed. Made on the loop, so it does nothing but look up and allocate.
        """
        if self.index is None or shown.index is None or shown is self:
            return self
        patches = self._patches
        if patches is None:
            patches = self._patches = {}
        frame = patches.get(shown.serial)
        if frame is None:
            if len(patches) >= _PATCHES_KEPT:
                del patches[next(iter(patches))]
            frame = patches[shown.serial] = Frame(self.key, self.html, index=self.index)
            frame.shared = self.shared
            frame._base = shown.index
        return frame

    def __repr__(self) -> str:
        return f"Frame({self.key!r}, {len(self.html)} chars, signals={self.signals!r})"


def html_size(frames: Iterable[Frame]) -> int:
    """Characters of HTML in `frames`: what a stream counts as taken, and what decides where the
    fan-out encodes them. Nearly always one frame: that one's length, with no generator."""
    if isinstance(frames, (list, tuple)) and len(frames) == 1:
        return len(frames[0].html)
    return sum(len(f.html) for f in frames)


def sse_event(frame: Frame) -> bytes:
    """The Datastar event of `frame`: a `datastar-patch-elements`, then a signals patch if any.

    Cached on the frame: a tick's frame goes to every watcher of its view, and is formatted once,
    by whichever fan-out worker needs it first (the lock is taken only until it is cached).
    """
    # The cache is a slot of the frame that only this module's function fills and reads.
    event = frame._sse  # noqa: SLF001
    if event is None:
        with _FORMATTING:
            event = frame._sse  # noqa: SLF001
            if event is None:
                base, new = frame._base, frame.index  # noqa: SLF001
                patches = patch_events(base, new) if base is not None and new is not None else None
                # Patches are mostly HTML the stream sent before, which its compressor finds
                # in its window at a fraction of the whole render's cost: only longer ones lose.
                if patches is not None and len(patches) < len(frame.html):
                    text: str = patches
                else:
                    text = ServerSentEventGenerator.patch_elements(frame.html)
                if frame.signals:
                    text += ServerSentEventGenerator.patch_signals(dict(frame.signals))
                event = frame._sse = str(text).encode()  # noqa: SLF001
                frame._base = None  # noqa: SLF001 - the render patched from may go: its bytes are made
    return event


_FORMATTING = threading.Lock()


def sse_fields(fields: bytes) -> Frame:
    """A frame whose event is `fields` as they are, such as a stream's `retry: 2500` line: put
    before a stream's first frame, it joins that event and goes through the stream's encoder
    with it. It belongs to no view (its key is empty)."""
    frame = Frame("", "")
    frame._sse = fields  # noqa: SLF001
    return frame
