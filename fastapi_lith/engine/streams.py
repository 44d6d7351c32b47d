"""Streams: one per tab, holding only the newest frame of each view it watches.

A slow tab skips frames instead of queueing them, so it costs the hub nothing and shows the
newest state when it catches up. The hub offers frames; the fan-out compresses them on worker
threads against everything the stream sent before, once the previous bytes are written; the
tab's SSE response (`stream.body`) writes the ready bytes, each flushed so it decodes at once.

Who calls what of a stream, and nothing else:

- the hub: `watch`, `keys`, `offer`, `holds`, `end`, `tab` to find a tab's streams, and
  `principal` to find whose streams `revoke` ends;
- the fan-out: `start_encode` and `encoded`, once `body` gave the stream its encoder;
- the response: `body`, and `write_at_once` while it writes the body;
- a reader without HTTP (virtual tabs, benchmarks): `take` and `next`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Protocol

from . import fanout as _fanout
from . import heap as _heap
from .encoders import Encoder
from .flag import Flag
from .frames import Frame, html_size, sse_event, sse_fields


class Publisher(Protocol):
    """What a subscription belongs to: the hub in an app (a benchmark's feeder stands in)."""

    def caught_up(self, keys: Iterable[str]) -> None: ...

    def close(self, stream: Stream) -> None: ...


class Subscription:
    """One stream's watch on view instances: `hub.open` makes it, `close()` ends it.

    The one name for this role in the engine, the SSE response and the tests. A subscription is
    what `open` gives and `close` ends, and it outlives no stream; "watcher" stays the hub's word
    for the other side, a stream watching an instance (`Instance.watchers`). The stream tells its
    subscription whenever it took frames, so the hub may render those views for it again.
    """

    __slots__ = ("publisher", "stream", "keys")

    def __init__(self, publisher: Publisher, stream: Stream, keys: tuple[str, ...]) -> None:
        self.publisher = publisher
        self.stream = stream
        self.keys = keys

    def caught_up(self, keys: Iterable[str]) -> None:
        """The stream took frames of `keys`: views held back for it may render again."""
        self.publisher.caught_up(keys)

    def close(self) -> None:
        self.publisher.close(self.stream)


KEEPALIVE = b": keep-alive\n\n"

# A response's way to write bytes from outside its task (the fan-out's callbacks): None once they
# are written, or what the body must await to finish the write when it could not be done at once.
WriteAtOnce = Callable[[bytes], Awaitable[None] | None]

# Who a stream was opened for, as the web layer established it: an opaque id to the engine,
# compared for equality only (a `{principal}` view's key, `hub.revoke`). None is nobody.
Principal = str | int | None


class StreamCounts:
    """What streams did, summed: the hub adds each stream that ends, a sample adds the open ones."""

    __slots__ = ("frames", "html_bytes", "send_timeouts", "sent_bytes", "superseded")

    def __init__(self) -> None:
        self.frames = self.superseded = self.html_bytes = self.sent_bytes = self.send_timeouts = 0

    def add(self, stream: Stream) -> None:
        self.frames += stream.taken
        self.superseded += stream.skipped
        self.html_bytes += stream.html_bytes
        self.sent_bytes += stream.sent_bytes
        self.send_timeouts += stream.send_timeouts


class Stream:
    """The frames one tab has not taken yet, newest per view instance."""

    def __init__(self, tab: str, principal: Principal = None) -> None:
        self.tab = tab
        self.principal = principal
        self.revoked = False  # ended by `hub.revoke`: an open in progress is refused
        self.skipped = 0
        self.taken = 0
        self.ended = False
        self.encodes = 0  # writes encoded by the fan-out for this stream
        self.html_bytes = 0  # characters of the frames taken, before compression
        self.sent_bytes = 0  # bytes the body wrote
        self.send_timeouts = 0  # set by the response when the client stopped reading
        self.encoding = False  # the encoder is in a worker's hands
        self.hibernated = False  # idle past hibernate_after: its encoder holds no compressor
        self._pending: dict[str, Frame] = {}
        self._ready = Flag()
        self._subscription: Subscription | None = None  # set by `watch`, from the hub's `open`
        # Set by `body`: the fan-out encodes pending frames, the body writes the bytes.
        self._encoder: Encoder | None = None
        self._fanout: _fanout.Fanout | None = None
        self._requested = False  # in the fan-out's next batch
        self._busy = False  # bytes being encoded, ready or being written: encode nothing more
        self._out: bytes | Awaitable[None] | BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None  # wakes the body for keep-alives
        self._lead: Frame | None = None  # set by `body`: the `retry:` field, before the first event
        self._shown: dict[str, Frame] | None = None  # the indexed frames sent last, by view
        # Set by the response while it writes the body: encoded bytes go out from the fan-out's
        # callback while the body waits, instead of waking the body's task to write them.
        self.write_at_once: WriteAtOnce | None = None
        self._waiting = False  # the body waits for bytes: nothing of it is being written
        self._last_event = self._last_write = 0.0  # loop times: hibernation and keep-alives count from them
        self._keepalive = self._hibernate_after = math.inf  # set by `body`

    @property
    def encoder(self) -> Encoder | None:
        """The body's compressor, None until the body starts (or without HTTP)."""
        return self._encoder

    @property
    def keys(self) -> tuple[str, ...]:
        """The view instances this stream watches."""
        return self._subscription.keys if self._subscription is not None else ()

    def watch(self, subscription: Subscription | None) -> None:
        """Tell `subscription` whenever frames are taken (None: nobody, the stream was closed)."""
        self._subscription = subscription

    def offer(self, frame: Frame) -> bool:
        """Hold `frame` for the tab, replacing an unsent one of the same view (then True)."""
        replaced = frame.key in self._pending
        if replaced:
            self.skipped += 1
        self._pending[frame.key] = frame
        if self._fanout is None:
            self._ready.set()
        elif not (self._busy or self._requested or self.ended):
            self._requested = True
            self._fanout.request(self)
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
        self.html_bytes += html_size(frames.values())
        if self._subscription is not None:
            self._subscription.caught_up(frames.keys())
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

    # -- with the fan-out: frames go to a worker, ready bytes come back to the body ------------

    def start_encode(self) -> tuple[Stream, Encoder, list[Frame]] | None:
        """The fan-out takes the pending frames for a worker: this stream, its encoder and the
        frames, or None when there is nothing to do now (bytes in flight, ended, no body)."""
        self._requested = False
        frames = self._pending
        if self._busy or self.ended or not frames or self._encoder is None:
            return None
        self._pending = {}
        taken = list(frames.values())
        self.taken += len(taken)
        self.html_bytes += html_size(taken)
        self._busy = self.encoding = True
        if self._subscription is not None:
            self._subscription.caught_up(frames.keys())
        for frame in taken:  # a broadcast's one small frame: one look, nothing made
            if frame.index is not None:
                taken = [self._since_shown(frame) for frame in taken]
                break
        lead, self._lead = self._lead, None
        return self, self._encoder, [lead, *taken] if lead is not None else taken

    def _since_shown(self, frame: Frame) -> Frame:
        """`frame`, or its patches from the frame of its view this stream sent last: the page
        shows that one, whatever the encoder did since (a hibernated stream's page keeps it)."""
        if frame.index is None:
            return frame
        shown = self._shown
        if shown is None:
            shown = self._shown = {}
        last = shown.get(frame.key)
        shown[frame.key] = frame
        return frame if last is None else frame.since(last)

    def encoded(self, out: bytes | BaseException) -> None:
        """The fan-out's result, on the loop: the bytes to write, or the error that ends the body.

        While the body waits, the bytes go out at once through `write_at_once`: a broadcast to
        thousands of tabs then costs each a write, not a wake-up of its response's task through
        every middleware's frame and back.
        """
        self.encoding = False
        self.encodes += 1
        write = self.write_at_once
        # Once ended, the body is on its way out: it writes these bytes itself, then closes.
        if write is not None and self._waiting and not self.ended and isinstance(out, bytes):
            try:
                rest = write(out)
            except Exception as exc:  # noqa: BLE001 - raised in the body, as an encode's error is
                self._out = exc
            else:
                self.sent_bytes += len(out)
                if rest is None:
                    self._frames_written()
                    return
                self._out = rest
        else:
            self._out = out
        self._ready.set()

    # -- the body: writes what the fan-out made, keep-alives and hibernation between -----------

    async def body(
        self,
        encoder: Encoder,
        *,
        keepalive: float = 15.0,
        hibernate_after: float = 30.0,
        retry: int | None = None,
        fanout: _fanout.Fanout | None = None,
    ) -> AsyncIterator[bytes]:
        """The compressed SSE body of this tab: frames as they come, keep-alives, a clean end.

        Frames are encoded by `fanout` (the process's shared one if None) on worker threads; the
        body only writes what is ready, and while `write_at_once` is set, only what could not be
        written at once from the fan-out's callback (a client slow to read). A zstd stream idle
        for `hibernate_after` seconds ends its zstd frame and frees its compressor; the next
        event opens a new frame (browsers decode several in one body). A keep-alive goes through
        the encoder like any event, so the body stays one valid stream; it and hibernation run
        here, never while a worker holds the encoder.

        `retry` (milliseconds) goes out as SSE's `retry:` field in the first event: how long the
        page waits before it reconnects once this body ends, and before its first retry when a
        reconnect fails (Datastar doubles it from there).
        """
        loop = asyncio.get_running_loop()
        if retry is not None:
            self._lead = sse_fields(b"retry: %d\n" % retry)
        self._encoder = encoder
        self._fanout = fanout or _fanout.shared()
        if self._pending:  # the first frames arrived before the body started
            self._requested = True
            self._fanout.request(self)
        self._keepalive, self._hibernate_after = keepalive, hibernate_after
        self._last_event = self._last_write = loop.time()
        try:
            while True:
                out = await self._next_bytes()
                now = loop.time()
                if out is not None:
                    if isinstance(out, bytes):
                        self.sent_bytes += len(out)
                        yield out
                    else:  # a write begun from the fan-out's callback that had to wait
                        await out
                    self._frames_written()
                    if self.ended:
                        break
                elif self.ended:
                    break
                elif self._hibernates() and now >= self._last_event + self._hibernate_after:
                    # A stream whose writes all went alone holds no compressor: nothing to end.
                    self.hibernated = self._busy = True
                    if not encoder.hibernating:
                        out = encoder.hibernate()
                        _heap.freed(loop)
                        self.sent_bytes += len(out)
                        yield out
                    self._written()
                elif now >= self._last_write + self._keepalive:
                    lead, self._lead = self._lead, None
                    events = (KEEPALIVE,) if lead is None else (sse_event(lead), KEEPALIVE)
                    out = encoder.encode_asleep(*events)
                    self._busy = True
                    self.sent_bytes += len(out)
                    yield out
                    self._written()
                    self._last_write = now
            while self.encoding:  # the encoder comes back from its worker before it closes
                self._ready.clear()
                await self._ready.wait()
            self._out = None
            held = encoder.memory_size()
            out = encoder.close()
            if held:
                _heap.freed(loop)
            self.sent_bytes += len(out)
            yield out
        finally:
            self.end()
            if self._timer is not None:
                self._timer.cancel()

    def _hibernates(self) -> bool:
        """Whether this stream may hibernate: its encoder can, and it is not asleep already."""
        encoder = self._encoder
        return encoder is not None and encoder.can_hibernate and not self.hibernated

    def _frames_written(self) -> None:
        """An encode's bytes are written, by the body or at once: the clocks start again."""
        self.hibernated = False
        loop = asyncio.get_running_loop()
        self._last_event = self._last_write = loop.time()
        if self._encoder is not None and self._encoder.needs_restart:
            self.end()  # a frame outgrew the brotli window: reconnect afresh
        elif self._waiting and not self._set_timer(loop):
            # Written at once while the body waits, whose timer may be set for a later keep-alive
            # (asleep until now, it may hibernate sooner) or for none (it fired while a worker
            # encoded): set again, unless one is due already, which the body sends.
            self._ready.set()
        self._written()

    def _written(self) -> None:
        """The body wrote its bytes: frames that came meanwhile go to the next batch."""
        self._busy = False
        if self._pending and not self.ended and self._fanout is not None and not self._requested:
            self._requested = True
            self._fanout.request(self)

    def _wake(self) -> None:
        # A loop may fire a timer a little early (uvloop rounds to milliseconds): not armed any
        # more is what counts, not the time it was set for.
        self._timer = None
        self._ready.set()

    def _set_timer(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Have the timer wake the body when a keep-alive or a hibernation is due; False if one
        is due now. One timer per stream, armed again only once it fired or when it lies past
        the deadline: deadlines move later with every write, so a busy stream arms none per
        write."""
        deadline = self._last_write + self._keepalive
        if self._hibernates():
            deadline = min(deadline, self._last_event + self._hibernate_after)
        if loop.time() >= deadline:
            return False
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._wake)
        return True

    async def _next_bytes(self) -> bytes | Awaitable[None] | None:
        """Encoded bytes to write (or a write to finish); None once a keep-alive or a hibernation
        is due with none, or once ended with nothing in flight. While a worker holds the encoder
        nothing else is due: its bytes come next, and a keep-alive or a hibernation meanwhile
        would use the encoder from two threads at once (the frame may have gone to a worker
        since this began)."""
        loop = asyncio.get_running_loop()
        while self._out is None and not (self.ended and not self.encoding):
            if not self.encoding and not self._set_timer(loop):
                return None
            self._ready.clear()
            self._waiting = True
            try:
                await self._ready.wait()
            finally:
                self._waiting = False
        out, self._out = self._out, None
        if isinstance(out, BaseException):
            raise out
        return out
