"""`Frame`: one render of one view instance, and its Datastar SSE event (datastar-py only)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from datastar_py.sse import ServerSentEventGenerator


class Frame:
    """One render of one view instance: its HTML, and the signals to set with it, if any.

    Frames know nothing of a transport: `sse_event(frame)` encodes one for SSE, once however
    many streams send it, where the stream's bytes are made.
    """

    __slots__ = ("key", "html", "signals", "_sse", "__weakref__")

    def __init__(self, key: str, html: str, signals: Mapping[str, Any] | None = None) -> None:
        self.key = key
        self.html = html
        self.signals = signals
        self._sse: bytes | None = None

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
                text: str = ServerSentEventGenerator.patch_elements(frame.html)
                if frame.signals:
                    text += ServerSentEventGenerator.patch_signals(dict(frame.signals))
                event = frame._sse = str(text).encode()  # noqa: SLF001
    return event


_FORMATTING = threading.Lock()


def sse_fields(fields: bytes) -> Frame:
    """A frame whose event is `fields` as they are, such as a stream's `retry: 2500` line: put
    before a stream's first frame, it joins that event and goes through the stream's encoder
    with it. It belongs to no view (its key is empty)."""
    frame = Frame("", "")
    frame._sse = fields  # noqa: SLF001
    return frame
