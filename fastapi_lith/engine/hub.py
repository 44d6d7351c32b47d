"""The hub: commits touch topics, topics mark view instances dirty, ticks render them.

However many commits land in a tick, each dirty instance renders once, in one read transaction
with every other dirty instance of that tick, and its frame goes to every stream watching it.
The first change after a quiet spell renders at once; later ones wait for the next tick, so a
busy board renders at most once per `tick` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from statistics import quantiles
from typing import Any, Protocol

from ..exceptions import AccessDenied
from . import collector
from .db import Db
from .feed import Feed, LocalFeed
from .flag import Flag
from .frames import Frame
from .readers import Readers
from .shutdown import end_on_exit_signal, forget
from .streams import Principal, Stream, StreamCounts, Subscription
from .views import View, Views

log = logging.getLogger("fastapi_lith.hub")

# The first renders of opening streams go to the readers in batches of about this many, one
# batch at a time: a deploy's thousands of reconnects then hold one reader at most, and the
# ticks of the streams already open find another free.
OPEN_BATCH = 256


@dataclass(eq=False)
class Instance:
    """One view with its parameters, `"board/3"`, and the streams that watch it."""

    key: str
    view: View
    params: dict[str, Any]
    topics: frozenset[str]
    watchers: set[Stream] = field(default_factory=set)
    frame: Frame | None = None
    rendering: bool = False  # one render at a time, so an older result never lands last
    rendered: Flag = field(default_factory=Flag)  # a first render was tried

    def render(self, db: Db, timings: deque[tuple[str, float]]) -> Frame | Exception:
        """Render on a reader thread, once for all watchers; its duration goes to `timings`."""
        started = time.perf_counter()
        try:
            html = self.view.html(db, self.params)
        except Exception as exc:  # noqa: BLE001 - contained, counted and logged by the hub
            return exc
        finally:
            timings.append((self.view.pattern, time.perf_counter() - started))
        if self.frame is not None and self.frame.html == html:
            return self.frame
        return Frame.rendered(self.key, html, self.frame)


class FrameTracer(Protocol):
    """Told when frames are made and taken, when the app traces (ops/tracing.py)."""

    def rendered(self, instance: Instance, started: int, changed: bool) -> None:
        """`instance` rendered, begun at `started` (`time.time_ns()`): `instance.frame` is new
        if `changed`, else the same HTML came out."""

    def taken(self, keys: Iterable[str]) -> None:
        """A stream took the frames of `keys` (each its instance's current frame)."""


@dataclass
class Counters:
    """What the hub has done since it started; the benchmarks print these."""

    ticks: int = 0
    renders: int = 0
    unchanged: int = 0
    frames: int = 0
    skipped: int = 0
    render_errors: int = 0
    late_ticks: int = 0  # began well after their time, or ran longer than the interval
    gaps: int = 0  # polls of a feed that had lost changes: every view rendered again
    tick_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    # By view pattern ("board/{id}"), never by instance: as many entries as the app has views.
    renders_by_view: dict[str, int] = field(default_factory=dict)
    errors_by_view: dict[str, int] = field(default_factory=dict)
    # Raw observations the metrics' sampler drains (ops/metrics.py); bounded for a hub nobody samples.
    observed_ticks: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    observed_renders: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=65_536))
    closed_streams: StreamCounts = field(default_factory=StreamCounts)  # what ended streams did

    def tick_percentiles(self) -> dict[str, float]:
        """Tick duration p50/p95/p99 in milliseconds."""
        if len(self.tick_seconds) < 2:
            only = self.tick_seconds[0] * 1000 if self.tick_seconds else 0.0
            return {"p50": only, "p95": only, "p99": only}
        q = quantiles(self.tick_seconds, n=100, method="inclusive")
        return {"p50": q[49] * 1000, "p95": q[94] * 1000, "p99": q[98] * 1000}


class Hub:
    """Dirty tracking, ticks and fan-out for one app."""

    def __init__(self, views: Views, readers: Readers, *, tick: float = 0.05, feed: Feed | None = None) -> None:
        self.views = views
        self.readers = readers
        self.feed = feed if feed is not None else LocalFeed()
        self.interval = tick
        self.counters = Counters()
        self.instances: dict[str, Instance] = {}
        self.streams: set[Stream] = set()
        self._by_topic: dict[str, set[Instance]] = {}
        self.dirty: set[Instance] = set()  # changed since their last render
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = False  # waiting for something dirty: see `_arrival`
        self.ending = False  # told to stop (`end_streams`): a stream that opens now ends at once
        self.trace: FrameTracer | None = None  # told of frames made and taken, when the app traces
        # Opens whose views have no frame yet, with what each awaits: see `_first_renders`.
        self._opening: list[tuple[list[Instance], asyncio.Future[None]]] = []
        self._admitting: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Tick on a timer. Without it (tests) `await hub.tick()` advances by hand. Streams end
        at the server's stop signal, not at its next look (see shutdown.py)."""
        self._task = asyncio.create_task(self._run(), name="lith-hub")
        self.feed.on_arrival(self._arrival)
        end_on_exit_signal(self, self.end_streams)
        collector.space_full_collections()

    def end_streams(self) -> None:
        """Make every stream finish its body: the pages reconnect, to the next process. One that
        opens later, until the hub stops, ends after its first frames too."""
        self.ending = True
        for stream in list(self.streams):
            stream.end()

    async def stop(self) -> None:
        """Stop ticking and end every stream, so each response finishes its body."""
        forget(self)
        self.feed.on_arrival(None)
        self.end_streams()
        for task in (self._admitting, self._task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._task = None
        self.ending = False  # stopped: a later start serves streams again

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.feed.shared:
                await self._wait_or_poll()
            else:
                await self._wake.wait()
            self._wake.clear()
            started = loop.time()
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - a broken tick must not end the hub
                log.exception("tick failed")
            due = started + self.interval
            late = loop.time() > due
            await asyncio.sleep(max(0.0, due - loop.time()))
            # Woken well past its time, the loop was blocked: the next tick starts late.
            if late or loop.time() > due + self.interval / 2:
                self.counters.late_ticks += 1

    async def _wait_or_poll(self) -> None:
        """Other processes commit too: ask the feed every `interval`, and whenever it says
        something arrived, until something is dirty."""
        while True:
            self._take_feed()
            if self._wake.is_set():
                return
            self._idle = True
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
                return
            except TimeoutError:
                pass
            finally:
                self._idle = False

    # -- inputs: commits, other processes, streams ---------------------------------------------

    def _arrival(self) -> None:
        """The feed says another process committed. Only a hub that waits for work polls now:
        one that ticks, or rests until its next tick may begin, polls as that tick begins, and
        could not render sooner."""
        if self._idle:
            self._take_feed()

    def _take_feed(self) -> None:
        """`poll`, at every tick and whenever the feed says something arrived; a poll that fails
        is tried again at the next."""
        try:
            self.poll()
        except Exception:  # noqa: BLE001 - a broken poll must not end the hub
            log.exception("feed poll failed")

    def poll(self) -> None:
        """Take what other processes committed from the feed: dirty views, pushes to tabs."""
        changes = self.feed.poll()
        if changes is None:
            return
        if changes.everything:
            self.counters.gaps += 1
            self.dirty.update(self.instances.values())
            if self.dirty:
                self._wake.set()
            # A revocation may be among what was missed: every principal's stream reconnects,
            # and its reconnect asks the identity and the access rules again.
            self._end_streams_of(lambda s: s.principal is not None)
        elif changes.topics:
            self.touched(changes.topics)
        for tab, frame in changes.pushes:
            self._deliver(tab, frame)
        if changes.revoked:
            revoked = set(changes.revoked)
            self._end_streams_of(lambda s: s.principal in revoked)

    def touched(self, topics: Iterable[str]) -> None:
        """Mark every instance on these topics dirty: the writer's commit subscriber, and what
        changes with no commit (the dashboard's numbers). Instances nobody watches do not
        exist, so touching their topics costs nothing."""
        by_topic = self._by_topic
        for topic in topics:
            self.dirty.update(by_topic.get(topic, ()))
        if self.dirty:
            self._wake.set()

    def caught_up(self, keys: Iterable[str]) -> None:
        """A stream took its frames: instances held back for it may render again."""
        if self.trace is not None:
            self.trace.taken(keys)
        if not self.dirty:  # nothing waits to render: a broadcast's every stream passes here
            return
        instances = self.instances
        for key in keys:
            instance = instances.get(key)
            if instance is not None and instance in self.dirty:
                self._wake.set()
                return

    async def open(self, stream: Stream, keys: Iterable[str], views: Views | None = None) -> Subscription:
        """Watch view instances; the stream gets each one's current frame at once.

        `keys` name views of `views`, the app's by default: another registry (the dashboard's)
        holds views that the app's stream route cannot name.

        Raises `ViewError` for a bad key or parameter and `AccessDenied` for a view the stream's
        principal may not watch, before subscribing to anything. A view with a `tab` parameter
        is private to that tab, one with a `principal` parameter to that principal; the views
        with an access rule are asked in one read transaction.
        """
        resolved = (self.views if views is None else views).for_tab(stream.tab, keys, stream.principal)
        checked = [(key, view, params) for key, view, params in resolved if view.access is not None]
        if checked:
            self.streams.add(stream)  # a revoke while the rules run ends this open too
            try:
                answers = await self.readers.run(
                    lambda db: [view.allows(db, stream.principal, params) for _, view, params in checked]
                )
            finally:
                self.streams.discard(stream)
            refused = [key for (key, _, _), allowed in zip(checked, answers, strict=True) if not allowed]
            if refused:
                raise AccessDenied(f"view {refused[0]!r} is not for this principal")
        if stream.revoked:
            raise AccessDenied("this principal's streams were revoked")
        subscription = Subscription(self, stream, tuple(dict.fromkeys(key for key, _, _ in resolved)))
        stream.watch(subscription)
        self.streams.add(stream)
        fresh: list[Instance] = []  # no frame yet: rendering offers it to every watcher
        for key, view, params in resolved:
            instance = self.instances.get(key)
            if instance is None:
                instance = self.instances[key] = Instance(key, view, params, view.topics_for(params))
                for topic in instance.topics:
                    self._by_topic.setdefault(topic, set()).add(instance)
            instance.watchers.add(stream)
            # Rendering already (another tab opened it a moment ago): its frame reaches this
            # stream too, as a watcher, when that render lands.
            if instance.frame is None and not instance.rendering and instance not in fresh:
                instance.rendering = True  # queued: a tick or another open leaves it to this one
                fresh.append(instance)
        waiting: list[Instance] = []
        for key in stream.keys:
            instance = self.instances[key]
            if instance.frame is not None:
                self.counters.frames += 1
                stream.offer(instance.frame)
            elif instance not in fresh:
                waiting.append(instance)
        if fresh:
            await self._first_renders(fresh)
        # Return only once every view has its first frame: the stream's first write then holds
        # them all, and a brotli window sized from it fits the largest.
        for instance in waiting:
            await instance.rendered.wait()
        if self.ending:  # opened after the stop signal ended the others: the page goes elsewhere
            stream.end()
        return subscription

    async def _first_renders(self, fresh: list[Instance]) -> None:
        """Render the first frames of an opening stream with those of the other streams
        opening meanwhile, in batches of about `OPEN_BATCH`, one batch at a time."""
        done = asyncio.get_running_loop().create_future()
        self._opening.append((fresh, done))
        if self._admitting is None:
            self._admitting = asyncio.create_task(self._admit(), name="lith-hub-opens")
        await done

    async def _admit(self) -> None:
        batch: list[tuple[list[Instance], asyncio.Future[None]]] = []
        try:
            while self._opening:
                count = taken = 0
                for fresh, _ in self._opening:
                    if count >= OPEN_BATCH:
                        break
                    count += len(fresh)
                    taken += 1
                batch, self._opening = self._opening[:taken], self._opening[taken:]
                try:
                    await self._render([instance for fresh, _ in batch for instance in fresh])
                except Exception as exc:  # noqa: BLE001 - each open of the batch raises it
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                else:
                    for _, done in batch:
                        if not done.done():
                            done.set_result(None)
                batch = []
        finally:  # cancelled (the hub stopped): no open waits for a render that will not come
            self._admitting = None
            left, self._opening = [*batch, *self._opening], []
            for fresh, done in left:
                for instance in fresh:
                    instance.rendering = False
                    instance.rendered.set()
                done.cancel()

    def close(self, stream: Stream) -> None:
        """Stop watching; instances nobody watches any more are dropped with their frames."""
        for key in stream.keys:
            instance = self.instances.get(key)
            if instance is None:
                continue
            instance.watchers.discard(stream)
            if not instance.watchers:
                del self.instances[key]
                self.dirty.discard(instance)
                for topic in instance.topics:
                    peers = self._by_topic.get(topic)
                    if peers is not None:
                        peers.discard(instance)
                        if not peers:
                            del self._by_topic[topic]
        stream.watch(None)
        if stream in self.streams:
            self.counters.closed_streams.add(stream)
            self.streams.discard(stream)

    async def revoke(self, principal: Principal) -> int:
        """End every stream opened as `principal`, here and, through the feed, in every other
        process; returns how many ended here. Each page's `retry: 'always'` reconnects, and the
        reconnect asks the identity and the access rules again."""
        ended = self._end_streams_of(lambda s: s.principal == principal)
        await self.feed.revoke(principal)
        return ended

    def _end_streams_of(self, whose: Callable[[Stream], bool]) -> int:
        streams = [s for s in self.streams if whose(s)]
        for stream in streams:
            stream.revoked = True
            stream.end()
        return len(streams)

    def push(self, tab: str, frame: Frame) -> int:
        """Offer a frame outside any view to every stream of one tab (a rejected command's
        error), here and through the feed in other processes; returns how many here got it."""
        self.feed.forward(tab, frame)
        return self._deliver(tab, frame)

    def _deliver(self, tab: str, frame: Frame) -> int:
        streams = [s for s in self.streams if s.tab == tab]
        for stream in streams:
            stream.offer(frame)
        return len(streams)

    # -- the tick ----------------------------------------------------------------------------

    async def tick(self) -> int:
        """Render each dirty instance that some watcher can take, once; returns how many."""
        started = time.perf_counter()
        self.poll()
        ready = [
            i for i in self.dirty
            if not i.rendering and any(not s.holds(i.key) for s in i.watchers)
        ]
        self.counters.ticks += 1
        if ready:
            self.dirty.difference_update(ready)  # a commit during the render marks it again
            await self._render(ready)
        seconds = time.perf_counter() - started
        self.counters.tick_seconds.append(seconds)
        self.counters.observed_ticks.append(seconds)
        return len(ready)

    async def _render(self, instances: list[Instance]) -> None:
        """Render in one read transaction, so every frame of a tick shows one state."""
        for instance in instances:
            instance.rendering = True
        trace = self.trace
        started = time.time_ns() if trace is not None else 0
        try:
            timings = self.counters.observed_renders
            results = await self.readers.run(lambda db: [i.render(db, timings) for i in instances])
        finally:
            for instance in instances:
                instance.rendering = False
                instance.rendered.set()
                if instance in self.dirty:  # a commit landed meanwhile: the next tick renders it
                    self._wake.set()
        counters = self.counters
        by_view = counters.renders_by_view
        for instance, result in zip(instances, results, strict=True):
            counters.renders += 1
            pattern = instance.view.pattern
            by_view[pattern] = by_view.get(pattern, 0) + 1
            if isinstance(result, Exception):
                counters.render_errors += 1
                errors = counters.errors_by_view
                errors[pattern] = errors.get(pattern, 0) + 1
                log.error(
                    "view %s (%s) failed to render: %r",
                    instance.key, instance.view.pattern, result, exc_info=result,
                )
                continue
            if result is instance.frame:
                counters.unchanged += 1
                if trace is not None:
                    trace.rendered(instance, started, False)
                continue
            instance.frame = result
            if trace is not None:
                trace.rendered(instance, started, True)
            watchers = instance.watchers
            result.shared = len(watchers) > 1
            counters.frames += len(watchers)
            for stream in watchers:
                if stream.offer(result):
                    counters.skipped += 1

    async def render(self, key: str, params: dict[str, Any] | None = None) -> str:
        """One view's HTML for a page's first paint, from the same function the stream uses."""
        view, typed = self.views.resolve(key, params)
        return await self.readers.run(lambda db: view.html(db, typed))
