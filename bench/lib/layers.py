"""The library's stream layers below its public routes: the one bench module that imports private ones.

The send path benchmark (bench/send.py) prices one SSE chunk layer by layer: a bare ASGI send,
Starlette, sse-starlette, then the library's `StreamResponse` and its tab body. Those two have
no public name, and must not: an app reaches them only through `lith.router`'s stream route,
where each chunk also costs a command, a commit, a tick and a render, which would bury the few
microseconds a layer adds. So they are imported here and nowhere else in bench/
(tests/bench/test_public.py allows this file alone), and a change to them breaks one file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from fastapi_lith import Frame, IdentityEncoder, Stream
from fastapi_lith.engine.frames import sse_event
from fastapi_lith.engine.streams import Subscription
from fastapi_lith.web.sse import StreamResponse

SEND_TIMEOUT = 10.0  # the library's default (Lith(send_timeout=))


def timed_response(body: Any) -> Any:
    """Any async body inside the library's `StreamResponse`: its sends watched for the send timeout."""
    return StreamResponse(body, stream=None, send_timeout=SEND_TIMEOUT, headers={})


class Feeder:
    """The hub's part: offers the next frame the moment the fan-out takes one, `n` in all."""

    def __init__(self, stream: Stream, n: int, frame: Frame) -> None:
        self.stream, self.left, self.frame = stream, n, frame

    def close(self, stream: Stream) -> None:
        pass

    def caught_up(self, keys: Iterable[str]) -> None:
        self.left -= 1
        if self.left > 0:
            self.stream.offer(self.frame)
        else:
            asyncio.get_running_loop().call_soon(self.stream.end)


def tab_response(n: int, size: int) -> Any:
    """A tab's stream body inside `StreamResponse`: `n` frames whose events are `size` bytes,
    each offered to a `Stream`, encoded (identity) by the fan-out and written by the body."""
    frame = Frame("k", "x" * max(1, 1 + size - len(sse_event(Frame("k", "x")))))
    stream = Stream("t")
    subscription = Subscription(Feeder(stream, n, frame), stream, ("k",))
    stream.watch(subscription)
    stream.offer(frame)
    return StreamResponse(stream.body(IdentityEncoder(), keepalive=15.0, hibernate_after=30.0),
                          stream=stream, send_timeout=SEND_TIMEOUT, headers={}, on_close=subscription.close)
