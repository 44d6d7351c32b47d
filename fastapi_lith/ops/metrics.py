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
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, multiprocess, values

from ..engine import cohorts
from ..engine.engine import Engine
from ..engine.feed import Feed
from ..engine.hub import Hub
from ..engine.streams import StreamCounts
from ..exceptions import NotRunning, SettingError
from .instruments import ENCODINGS, STATES, Instruments
from .litestream import local_position
from .replica_check import last_check

log = logging.getLogger("fastapi_lith.metrics")

SAMPLE_EVERY = 1.0  # seconds between two passes of the sampler
SLOW_EVERY = 5.0  # the outcomes table is counted (on a reader), the replica's files read, this often
ENV = "PROMETHEUS_MULTIPROC_DIR"



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
        self.instruments = Instruments(own, replica=replica is not None, pool=pool is not None)
        self._hubs: weakref.WeakKeyDictionary[Engine, Hub] = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakKeyDictionary[object, dict[str, float]] = weakref.WeakKeyDictionary()
        self._busy_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------------

    def value(self, name: str, **labels: str) -> float | None:
        """One sample of the registry, `value("lith_writer_commands_total", result="committed")`;
        None if it has none."""
        return self.registry.get_sample_value(name, labels)

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (reads the shared folder in multiprocess mode)."""
        return prometheus_client.generate_latest(self.registry)

    content_type = prometheus_client.CONTENT_TYPE_LATEST  # of what `scrape` writes

    async def scrape(self) -> bytes:
        """Sample now, then write the exposition off the event loop."""
        self.sample()
        return await anyio.to_thread.run_sync(self.exposition)

    # -- sampling --------------------------------------------------------------------------

    def sample(self) -> None:
        """Bring every value up to date from the engines' counters (on the event loop)."""
        metric = self.instruments
        queued = dirty = encoder_bytes = 0
        open_streams = dict.fromkeys(((s, e) for s in STATES for e in ENCODINGS), 0)
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
        cohort = cohorts.counts  # the process's: every app's streams share its cohorts
        self._grow(metric.cohort_writes.labels("compressed"), cohort, "made", cohort.made)
        self._grow(metric.cohort_writes.labels("reused"), cohort, "reused", cohort.reused)
        metric.writer_queue.set(queued)
        metric.hub_dirty.set(dirty)
        metric.encoder_bytes.set(encoder_bytes)
        for (state, encoding), count in open_streams.items():
            metric.streams_open.labels(state, encoding).set(count)
        self._sample_busy()
        if self._replica is not None:
            self._grow(metric.replica_restarts, self._replica, "restarts", self._replica.restarts)
        pool = self._pool
        if pool is not None:
            metric.accounts_open.set(len(pool.open_names()))
            self._grow(metric.accounts_opened, pool, "opened", pool.opened)
            self._grow(metric.accounts_closed, pool, "closed", pool.closed)
        if self.folder:
            self._sample_process()

    def retire(self, engine: Engine) -> None:
        """The last counts of an engine that has stopped (an account closed, the app's end):
        what its writer drained and its streams did after the last sample."""
        self._sample_writer(engine.writer)
        self._sample_feed(engine.feed)
        hub = self._hubs.pop(engine, None)
        if hub is not None:
            self._sample_hub(hub, {(s, e): 0 for s in STATES for e in ENCODINGS})

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
        metric = self.instruments
        grow = self._grow
        # Applied afresh and committed: not failed inside a committed batch, not a repeat (a
        # repeat of a failure counts as both, so it is taken off once).
        individual = writer.failed - writer.lost
        fresh = writer.commands - individual - writer.repeats + writer.repeated_errors
        grow(metric.writer_commands.labels("committed"), writer, "committed", fresh)
        grow(metric.writer_commands.labels("failed"), writer, "failed", writer.failed)
        grow(metric.writer_commands.labels("repeated"), writer, "repeated", writer.repeats)
        grow(metric.writer_batches.labels("committed"), writer, "batches", writer.batches)
        grow(metric.writer_batches.labels("failed"), writer, "failed_batches", writer.failed_batches)
        grow(metric.writer_retries, writer, "retries", getattr(writer.store, "retried", 0))
        observed = writer.observed
        while observed:
            size, seconds = observed.popleft()
            metric.writer_batch_size.observe(size)
            metric.writer_commit.observe(seconds)

    def _sample_feed(self, feed: Feed) -> None:
        metric = self.instruments
        lags = feed.lags
        while lags:
            metric.feed_lag.observe(lags.popleft())
        notified = feed.notify_lags
        if notified is None:
            return
        notify = metric.notify()
        while notified:
            notify.observe(notified.popleft())

    def _sample_hub(self, hub: Hub, open_streams: dict[tuple[str, str], int]) -> int:
        """The hub's counters and its streams; returns the bytes its streams' encoders hold."""
        metric = self.instruments
        grow, counters = self._grow, hub.counters
        grow(metric.hub_ticks, hub, "ticks", counters.ticks)
        grow(metric.hub_late, hub, "late", counters.late_ticks)
        grow(metric.hub_unchanged, hub, "unchanged", counters.unchanged)
        grow(metric.feed_gaps, hub, "gaps", counters.gaps)
        for view, count in counters.renders_by_view.items():
            grow(metric.hub_renders.labels(view), hub, "renders:" + view, count)
        for view, count in counters.errors_by_view.items():
            grow(metric.hub_render_errors.labels(view), hub, "errors:" + view, count)
        ticks = counters.observed_ticks
        while ticks:
            metric.hub_tick_seconds.observe(ticks.popleft())
        renders = counters.observed_renders
        while renders:
            view, seconds = renders.popleft()
            metric.hub_render_seconds.labels(view).observe(seconds)
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
            state = "hibernated" if stream.hibernated else "awake"
            open_streams[state, encoder.name or "identity"] += 1
            memory += encoder.memory_size()
        grow(metric.stream_frames, hub, "frames", totals.frames)
        grow(metric.stream_superseded, hub, "superseded", totals.superseded)
        grow(metric.stream_bytes.labels("html"), hub, "html", totals.html_bytes)
        grow(metric.stream_bytes.labels("sent"), hub, "sent", totals.sent_bytes)
        grow(metric.stream_timeouts, hub, "timeouts", totals.send_timeouts)
        return memory

    def _sample_busy(self) -> None:
        """The busiest writer's share of the time since the last measure; a measure over less
        than half a sample interval (a scrape right after the sampler) would be noise."""
        metric = self.instruments
        now = time.monotonic()
        elapsed = now - self._busy_at
        if elapsed < SAMPLE_EVERY / 2:
            return
        ratio = 0.0
        for engine in self._engines():
            writer = engine.writer
            seen = self._seen.setdefault(writer, {})
            spent = writer.busy_seconds - seen.get("busy", writer.busy_seconds)  # a new writer: none yet
            seen["busy"] = writer.busy_seconds
            ratio = max(ratio, min(1.0, spent / elapsed))
        self._busy_at = now
        metric.writer_busy.set(ratio)

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
        metric = self.instruments
        rows = 0
        for engine in list(self._engines()):
            try:
                readers = engine.hub.readers
            except NotRunning:
                continue
            rows += await readers.run(lambda db: db.scalar(_COUNT_KEYS) or 0)
        metric.writer_keys.set(rows)
        if self._replica is not None:
            lag, checked = await anyio.to_thread.run_sync(_replica_files, self._replica.path)
            metric.replica_lag.set(lag)
            if checked is not None:
                metric.replica_checked.set(checked[0])
                metric.replica_ok.set(1 if checked[1] else 0)

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
