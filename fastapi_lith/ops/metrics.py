"""Metrics in Prometheus's format: what the engine counts, sampled into prometheus-client.

The engine keeps plain integers and small bounded deques of raw observations (a batch's size
and commit time, a tick's duration, a view's render time); it never imports prometheus-client,
so a command or a frame costs nothing more than the increments the benchmarks already read.
A `Metrics` brings those into real counters, gauges and histograms: its sampler every
`SAMPLE_EVERY` seconds while the app runs, and each scrape first. Counters grow by the delta
since the last sample, gauges are set, the deques are drained into histograms.

Several processes (`uvicorn --workers N`) share one scrape through prometheus-client's
multiprocess mode: `PROMETHEUS_MULTIPROC_DIR` names an empty folder before prometheus-client
is imported, every process writes its values there, and a scrape in any of them reads all.
Then a process holds one `Metrics` (one `Lith` or one `Accounts`): two would write the same
names over each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
import prometheus_client
from fastapi import APIRouter
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, multiprocess, values
from starlette.responses import Response

from ..engine.engine import Engine
from ..engine.feed import Feed
from ..engine.hub import Hub
from ..engine.streams import StreamCounts
from ..exceptions import NotRunning, SettingError
from .litestream import local_position
from .replica_check import last_check

log = logging.getLogger("fastapi_lith.metrics")

SAMPLE_EVERY = 1.0  # seconds between two passes of the sampler
SLOW_EVERY = 5.0  # the outcomes table is counted (on a reader), the replica's files read, this often
ENV = "PROMETHEUS_MULTIPROC_DIR"

_SIZES = tuple(float(1 << i) for i in range(10))  # 1, 2, 4 .. 512: a batch holds at most 512
_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_LAGS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_STATES = ("awake", "hibernated")
_ENCODINGS = ("zstd", "br", "gzip", "identity")


def multiprocess_dir() -> str | None:
    """The folder the processes of this app share their values in, None for one process.

    prometheus-client chooses where values live when it is imported: a folder named after
    that comes too late, and is refused rather than silently showing one process only.
    """
    folder = os.environ.get(ENV)
    shared = values.ValueClass is not values.MutexValue
    if folder and not shared:
        raise SettingError(
            f"{ENV} was set after prometheus_client was imported: set it before the app starts "
            "(in the service's environment), so every process writes its values there"
        )
    return folder if shared else None


class Pool(Protocol):
    """What the metrics read of an account pool (account_pool.py)."""

    opened: int
    closed: int

    def open_names(self) -> list[str]: ...


class Replicated(Protocol):
    """What the metrics read of a replica (replica.py)."""

    path: Path
    restarts: int


class Metrics:
    """The metrics of one app: `lith.metrics` (or `accounts.metrics`, summing its accounts).

    `engines()` gives the engines to sample now. `registry` is what a scrape exposes;
    `value(name, **labels)` reads one sample of it (after `sample()`, to be current).
    """

    def __init__(
        self,
        engines: Callable[[], Iterable[Engine]],
        *,
        replica: Replicated | None = None,
        pool: Pool | None = None,
    ) -> None:
        self._engines = engines
        self._replica = replica
        self._pool = pool
        self.folder = multiprocess_dir()
        self.registry = CollectorRegistry()
        # Shared by processes, every value lives in the folder and the scrape reads them all;
        # the objects themselves then belong to no registry.
        own: CollectorRegistry | None = None if self.folder else self.registry
        if self.folder:
            multiprocess.MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
        self._process = ProcessCollector(registry=None)
        if not self.folder:
            self.registry.register(self._process)
        self._process_gauges: dict[str, Gauge] = {}

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=own)

        def gauge(name: str, doc: str, mode: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=own, multiprocess_mode=mode)  # type: ignore[arg-type]

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, labels, registry=own, buckets=buckets)

        self.writer_commands = counter(
            "lith_writer_commands_total", "Commands the writer answered, by result.", ("result",)
        )
        self.writer_batches = counter("lith_writer_batches_total", "Batches the writer ran, by result.", ("result",))
        self.writer_retries = counter(
            "lith_writer_retries_total", "Batches run again (PostgreSQL: a deadlock or a serialization failure)."
        )
        self.writer_queue = gauge("lith_writer_queue_depth", "Commands waiting for a batch.", "livesum")
        self.writer_batch_size = histogram("lith_writer_batch_size", "Commands per committed batch.", _SIZES)
        self.writer_commit = histogram(
            "lith_writer_commit_seconds", "From handing a batch to the writer thread to its answer.", _SECONDS
        )
        self.writer_busy = gauge(
            "lith_writer_busy_ratio", "Share of the last sample interval the writer spent on batches.", "livemax"
        )
        self.writer_keys = gauge(
            "lith_writer_idempotency_keys", "Rows of the outcomes table (keyed commands remembered).", "livemax"
        )
        self.hub_ticks = counter("lith_hub_ticks_total", "Ticks of the hub.")
        self.hub_tick_seconds = histogram("lith_hub_tick_seconds", "How long a tick took.", _SECONDS)
        self.hub_late = counter(
            "lith_hub_late_ticks_total", "Ticks that started well after their time or ran past the interval."
        )
        self.hub_renders = counter("lith_hub_renders_total", "View renders, by view pattern.", ("view",))
        self.hub_render_seconds = histogram(
            "lith_hub_render_seconds", "How long a view took to render, by view pattern.", _SECONDS, ("view",)
        )
        self.hub_render_errors = counter(
            "lith_hub_render_errors_total", "Renders that raised, by view pattern.", ("view",)
        )
        self.hub_unchanged = counter("lith_hub_unchanged_total", "Renders whose HTML had not changed.")
        self.hub_dirty = gauge("lith_hub_dirty_instances", "View instances waiting to render.", "livesum")
        self.streams_open = gauge(
            "lith_streams_open", "Open streams, by state and encoding.", "livesum", ("state", "encoding")
        )
        self.stream_bytes = counter(
            "lith_stream_bytes_total", "Stream bytes: html before compression, sent after.", ("stage",)
        )
        self.stream_frames = counter("lith_stream_frames_total", "Frames the streams took to send.")
        self.stream_superseded = counter(
            "lith_stream_frames_superseded_total", "Frames replaced by a newer one before a slow tab took them."
        )
        self.stream_timeouts = counter(
            "lith_stream_send_timeouts_total", "Streams ended because the client stopped reading."
        )
        self.encoder_bytes = gauge(
            "lith_stream_encoder_bytes", "Memory the streams' compressors hold (estimated).", "livesum"
        )
        self.feed_gaps = counter("lith_feed_gaps_total", "Changes missed from the feed: every view rendered again.")
        self.feed_lag = histogram(
            "lith_feed_poll_lag_seconds", "From another process's commit to this hub taking it.", _LAGS
        )
        self._histogram = histogram
        self.feed_notify: Histogram | None = None  # made when a feed measures NOTIFY (PostgreSQL)
        if replica is not None:
            self.replica_lag = gauge(
                "lith_replica_lag_seconds", "How far the database's newest write is ahead of Litestream.", "livemax"
            )
            self.replica_restarts = counter("lith_replica_restarts_total", "Times Litestream was started again.")
            self.replica_checked = gauge(
                "lith_replica_last_check_timestamp_seconds", "When the replica was last restored and compared.",
                "livemax",
            )
            self.replica_ok = gauge(
                "lith_replica_last_check_ok", "1 if the last check found the replica whole.", "livemin"
            )
            for unknown in (self.replica_lag, self.replica_checked, self.replica_ok):  # until first read
                unknown.set(math.nan)
        if pool is not None:
            self.accounts_open = gauge("lith_accounts_open", "Accounts open now.", "livesum")
            self.accounts_opened = counter("lith_accounts_opened_total", "Accounts opened.")
            self.accounts_closed = counter("lith_accounts_closed_total", "Accounts closed.")
        self._hubs: weakref.WeakKeyDictionary[Engine, Hub] = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakKeyDictionary[object, dict[str, float]] = weakref.WeakKeyDictionary()
        self._busy_at = time.monotonic()
        self._busy: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------------

    def value(self, name: str, **labels: str) -> float | None:
        """One sample of the registry, `value("lith_writer_commands_total", result="committed")`;
        None if it has none."""
        return self.registry.get_sample_value(name, labels)

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (reads the shared folder in multiprocess mode)."""
        return prometheus_client.generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """Sample now, then write the exposition off the event loop."""
        self.sample()
        return await anyio.to_thread.run_sync(self.exposition)

    # -- sampling --------------------------------------------------------------------------

    def sample(self) -> None:
        """Bring every value up to date from the engines' counters (on the event loop)."""
        queued = dirty = encoder_bytes = 0
        open_streams = dict.fromkeys(((s, e) for s in _STATES for e in _ENCODINGS), 0)
        for engine in list(self._engines()):
            writer = engine.writer
            queued += writer.queued
            self._sample_writer(writer)
            self._sample_feed(engine.feed)
            try:
                hub = engine.hub
            except NotRunning:
                continue
            self._hubs[engine] = hub  # for its last counts once it has stopped: `retire`
            dirty += len(hub.dirty)
            encoder_bytes += self._sample_hub(hub, open_streams)
        self.writer_queue.set(queued)
        self.hub_dirty.set(dirty)
        self.encoder_bytes.set(encoder_bytes)
        for (state, encoding), count in open_streams.items():
            self.streams_open.labels(state, encoding).set(count)
        self._sample_busy()
        if self._replica is not None:
            self._grow(self.replica_restarts, self._replica, "restarts", self._replica.restarts)
        pool = self._pool
        if pool is not None:
            self.accounts_open.set(len(pool.open_names()))
            self._grow(self.accounts_opened, pool, "opened", pool.opened)
            self._grow(self.accounts_closed, pool, "closed", pool.closed)
        if self.folder:
            self._sample_process()

    def retire(self, engine: Engine) -> None:
        """The last counts of an engine that has stopped (an account closed, the app's end):
        what its writer drained and its streams did after the last sample."""
        self._sample_writer(engine.writer)
        self._sample_feed(engine.feed)
        hub = self._hubs.pop(engine, None)
        if hub is not None:
            self._sample_hub(hub, {(s, e): 0 for s in _STATES for e in _ENCODINGS})

    def _grow(self, counter: Any, owner: object, name: str, value: float) -> None:
        """Add to `counter` what `owner`'s own count `name` grew by since it was last seen."""
        seen = self._seen.get(owner)
        if seen is None:
            seen = self._seen[owner] = {}
        last = seen.get(name, 0)
        if value > last:
            counter.inc(value - last)
            seen[name] = value

    def _sample_writer(self, writer: Any) -> None:
        grow = self._grow
        individual = writer.failed - writer.lost  # commands that failed inside a committed batch
        grow(self.writer_commands.labels("committed"), writer, "committed",
             writer.commands - individual - writer.repeats)  # fmt: skip
        grow(self.writer_commands.labels("failed"), writer, "failed", writer.failed)
        grow(self.writer_commands.labels("repeated"), writer, "repeated", writer.repeats)
        grow(self.writer_batches.labels("committed"), writer, "batches", writer.batches)
        grow(self.writer_batches.labels("failed"), writer, "failed_batches", writer.failed_batches)
        grow(self.writer_retries, writer, "retries", getattr(writer.store, "retried", 0))
        observed = writer.observed
        while observed:
            size, seconds = observed.popleft()
            self.writer_batch_size.observe(size)
            self.writer_commit.observe(seconds)

    def _sample_feed(self, feed: Feed) -> None:
        lags = feed.lags
        while lags:
            self.feed_lag.observe(lags.popleft())
        notified = feed.notify_lags
        if notified is None:
            return
        if self.feed_notify is None:
            self.feed_notify = self._histogram(
                "lith_feed_notify_seconds", "From another process's commit to its NOTIFY arriving here.", _LAGS
            )
        while notified:
            self.feed_notify.observe(notified.popleft())

    def _sample_hub(self, hub: Hub, open_streams: dict[tuple[str, str], int]) -> int:
        """The hub's counters and its streams; returns the bytes its streams' encoders hold."""
        grow, counters = self._grow, hub.counters
        grow(self.hub_ticks, hub, "ticks", counters.ticks)
        grow(self.hub_late, hub, "late", counters.late_ticks)
        grow(self.hub_unchanged, hub, "unchanged", counters.unchanged)
        grow(self.feed_gaps, hub, "gaps", counters.gaps)
        for view, count in counters.renders_by_view.items():
            grow(self.hub_renders.labels(view), hub, "renders:" + view, count)
        for view, count in counters.errors_by_view.items():
            grow(self.hub_render_errors.labels(view), hub, "errors:" + view, count)
        ticks = counters.observed_ticks
        while ticks:
            self.hub_tick_seconds.observe(ticks.popleft())
        renders = counters.observed_renders
        while renders:
            view, seconds = renders.popleft()
            self.hub_render_seconds.labels(view).observe(seconds)
        totals = StreamCounts()
        closed = counters.closed_streams
        for name in StreamCounts.__slots__:
            setattr(totals, name, getattr(closed, name))
        memory = 0
        for stream in list(hub.streams):
            totals.add(stream)
            encoder = stream.encoder
            if encoder is None:  # no body yet, or a virtual tab: nothing is compressed
                open_streams["awake", "identity"] += 1
                continue
            state = "hibernated" if encoder.hibernating else "awake"
            open_streams[state, encoder.name or "identity"] += 1
            memory += encoder.memory_size()
        grow(self.stream_frames, hub, "frames", totals.frames)
        grow(self.stream_superseded, hub, "superseded", totals.superseded)
        grow(self.stream_bytes.labels("html"), hub, "html", totals.html_bytes)
        grow(self.stream_bytes.labels("sent"), hub, "sent", totals.sent_bytes)
        grow(self.stream_timeouts, hub, "timeouts", totals.send_timeouts)
        return memory

    def _sample_busy(self) -> None:
        """The busiest writer's share of the time since the last measure; a measure over less
        than half a sample interval (a scrape right after the sampler) would be noise."""
        now = time.monotonic()
        elapsed = now - self._busy_at
        if elapsed < SAMPLE_EVERY / 2:
            return
        busy: dict[int, float] = {}
        ratio = 0.0
        for engine in self._engines():
            writer = engine.writer
            busy[id(writer)] = writer.busy_seconds
            spent = writer.busy_seconds - self._busy.get(id(writer), writer.busy_seconds)
            ratio = max(ratio, min(1.0, spent / elapsed))
        self._busy, self._busy_at = busy, now
        self.writer_busy.set(ratio)

    def _sample_process(self) -> None:
        """Shared by processes, prometheus-client's process collector would show the scraping
        process only: its values are copied into gauges, one series per process."""
        for family in self._process.collect():
            for sample in family.samples:
                gauge = self._process_gauges.get(sample.name)
                if gauge is None:
                    gauge = self._process_gauges[sample.name] = Gauge(
                        sample.name, family.documentation, registry=None, multiprocess_mode="liveall"
                    )
                gauge.set(sample.value)

    async def _sample_slowly(self) -> None:
        """What costs a query or a file read, off the writer and the event loop."""
        rows = 0
        for engine in list(self._engines()):
            try:
                readers = engine.hub.readers
            except NotRunning:
                continue
            rows += await readers.run(lambda db: db.scalar(_COUNT_KEYS) or 0)
        self.writer_keys.set(rows)
        if self._replica is not None:
            lag, checked = await anyio.to_thread.run_sync(_replica_files, self._replica.path)
            self.replica_lag.set(lag)
            if checked is not None:
                self.replica_checked.set(checked[0])
                self.replica_ok.set(1 if checked[1] else 0)

    # -- the sampler -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sample every `SAMPLE_EVERY` seconds while the app runs (its lifespan enters this)."""
        self._task = asyncio.create_task(self._run(), name="lith-metrics")
        try:
            yield
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            for engine in list(self._engines()):  # stopped by now: what they did last
                self.retire(engine)
            self.sample()  # and the rest: nothing is open any more
            if self.folder:
                multiprocess.mark_process_dead(os.getpid(), self.folder)  # type: ignore[no-untyped-call]

    async def _run(self) -> None:
        next_slow = 0.0
        while True:
            try:
                self.sample()
                if time.monotonic() >= next_slow:
                    next_slow = time.monotonic() + SLOW_EVERY
                    await self._sample_slowly()
            except Exception:  # noqa: BLE001 - a failed sample must not end the sampler
                log.exception("sampling the metrics failed")
            await asyncio.sleep(SAMPLE_EVERY)


_COUNT_KEYS = "SELECT count(*) FROM lith_outcome"


def _replica_files(path: Path) -> tuple[float, tuple[float, bool] | None]:
    """How many seconds the database's newest write (its WAL) is ahead of what Litestream has
    taken from it (0 when caught up, NaN before Litestream took anything), and the last check's
    time and result, if any."""
    lag = 0.0
    position = local_position(path)
    try:
        written = path.with_name(path.name + "-wal").stat().st_mtime
    except OSError:
        written = None
    if written is not None:
        taken = position.at.timestamp() if position is not None and position.at is not None else None
        lag = max(0.0, written - taken) if taken is not None else math.nan
    last = last_check(path)
    if last is None:
        return lag, None
    try:
        at = datetime.fromisoformat(last.at).timestamp()
    except ValueError:
        return lag, None
    return lag, (at, last.ok)


def metrics_router(metrics: Metrics, prefix: str) -> APIRouter:
    """`GET {prefix}/metrics`, out of OpenAPI; the app adds its own guard when it includes it:
    `app.include_router(lith.metrics_router, dependencies=[Depends(operator)])`."""
    router = APIRouter(prefix=prefix, include_in_schema=False)

    @router.get("/metrics")
    async def scrape() -> Response:
        """Every metric of the app (of every process, in multiprocess mode)."""
        return Response(await metrics.scrape(), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return router
