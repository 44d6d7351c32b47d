"""What the dashboard shows, read from the app's metrics registry in one pass per refresh.

The dashboard reads numbers only through `lith.metrics`: a refresh samples the engine into the
registry, collects the registry once, and keeps what it shows as a `Readings`, an immutable
value the views render from on a reader thread. Rates are measured over the last `RATE_WINDOW`
seconds of refreshes; the plots get one `Point` a second, from the histograms' growth.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

RATE_WINDOW = 1.0  # seconds a rate is measured over
POINT_EVERY = 1.0  # seconds between two points of the plots (and two renders of them)
HISTORY = 300  # points kept: the plots show the last five minutes watched

Labels = frozenset[tuple[str, str]]


class Samples:
    """One collection of the registry: every sample's value, by name, then labels."""

    def __init__(self, families: Iterable[Any]) -> None:
        self.by_name: dict[str, list[tuple[Labels, float]]] = {}
        for family in families:
            for sample in family.samples:
                series = self.by_name.setdefault(sample.name, [])
                series.append((frozenset(sample.labels.items()), sample.value))

    def has(self, name: str) -> bool:
        return name in self.by_name

    def total(self, name: str, **labels: str) -> float:
        """The sum of every series of `name` whose labels include `labels` (several processes
        give one series each)."""
        want = frozenset(labels.items())
        return sum(value for have, value in self.by_name.get(name, ()) if want <= have)

    def label_values(self, name: str, label: str) -> list[str]:
        return sorted({v for have, _ in self.by_name.get(name, ()) for k, v in have if k == label})

    def histogram(self, name: str, **labels: str) -> Histogram:
        buckets: dict[float, float] = {}
        want = frozenset(labels.items())
        for have, value in self.by_name.get(name + "_bucket", ()):
            if want <= have:
                bound = float(dict(have)["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
        return Histogram(
            self.total(name + "_count", **labels), self.total(name + "_sum", **labels), sorted(buckets.items())
        )


@dataclass(frozen=True)
class Histogram:
    """A histogram's count, sum and cumulative buckets (upper bound, count)."""

    count: float = 0.0
    sum: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)

    def since(self, before: Histogram) -> Histogram:
        """What was observed after `before`."""
        earlier = dict(before.buckets)
        return Histogram(
            self.count - before.count, self.sum - before.sum,
            [(bound, n - earlier.get(bound, 0.0)) for bound, n in self.buckets],
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    @property
    def most(self) -> float | None:
        """The smallest bucket bound that holds every observation: the largest one is at most
        this (a histogram keeps no maximum)."""
        if self.count <= 0:
            return None
        for bound, n in self.buckets:
            if n >= self.count:
                return bound
        return math.inf


@dataclass(frozen=True)
class ViewTime:
    """One view pattern's renders since the app started."""

    view: str
    renders: float
    mean: float | None
    most: float | None


@dataclass(frozen=True)
class Point:
    """One second of the plots, in seconds: None where nothing was observed."""

    at: float
    commit_mean: float | None
    commit_most: float | None
    tick_mean: float | None
    tick_most: float | None


@dataclass(frozen=True)
class Readings:
    """Everything the dashboard's views show, as of `at`."""

    at: float = 0.0
    committed: float = 0.0
    failed: float = 0.0
    repeated: float = 0.0
    commands_per_second: float = 0.0
    failed_batches: float = 0.0
    retries: float = 0.0
    queue: float = 0.0
    busy: float = 0.0
    batch_size: float | None = None
    keys: float = 0.0
    commit: float | None = None
    ticks_per_second: float = 0.0
    tick: float | None = None
    late_ticks: float = 0.0
    renders_per_second: float = 0.0
    unchanged: float = 0.0
    dirty: float = 0.0
    streams: dict[tuple[str, str], float] = field(default_factory=dict)
    frames: float = 0.0
    html_per_frame: float | None = None
    sent_per_frame: float | None = None
    superseded: float = 0.0
    send_timeouts: float = 0.0
    rss: float | None = None
    encoder_bytes: float = 0.0
    views: list[ViewTime] = field(default_factory=list)
    replica_lag: float | None = None
    replica_restarts: float | None = None
    accounts_open: float | None = None
    accounts_opened: float | None = None
    accounts_closed: float | None = None
    history: tuple[Point, ...] = ()

    @property
    def open_streams(self) -> float:
        return sum(self.streams.values())


# The counters a rate is measured of: (name, labels).
_RATED = (
    ("lith_writer_commands_total", (("result", "committed"),)),
    ("lith_hub_ticks_total", ()),
    ("lith_hub_renders_total", ()),
)


class Reader:
    """Turns collections of the registry into `Readings`, keeping what rates and plots need."""

    def __init__(self) -> None:
        self._recent: deque[tuple[float, tuple[float, ...]]] = deque()
        self._history: deque[Point] = deque(maxlen=HISTORY)
        self._last_point: tuple[float, Histogram, Histogram] | None = None

    def read(self, samples: Samples, now: float | None = None) -> tuple[Readings, bool]:
        """The readings of `samples`, and whether the plots got a new point."""
        now = time.monotonic() if now is None else now
        totals = tuple(samples.total(name, **dict(labels)) for name, labels in _RATED)
        recent = self._recent
        recent.append((now, totals))
        while len(recent) > 2 and now - recent[1][0] >= RATE_WINDOW:
            recent.popleft()
        first_at, first = recent[0]
        spent = now - first_at
        rates = [(b - a) / spent if spent > 0 else 0.0 for a, b in zip(first, totals, strict=True)]

        commit = samples.histogram("lith_writer_commit_seconds")
        tick = samples.histogram("lith_hub_tick_seconds")
        plotted = self._plot(now, commit, tick)
        batch = samples.histogram("lith_writer_batch_size")
        frames = samples.total("lith_stream_frames_total")
        streams = {
            (state, encoding): samples.total("lith_streams_open", state=state, encoding=encoding)
            for state in samples.label_values("lith_streams_open", "state")
            for encoding in samples.label_values("lith_streams_open", "encoding")
        }
        views = []
        for view in samples.label_values("lith_hub_render_seconds_count", "view"):
            times = samples.histogram("lith_hub_render_seconds", view=view)
            views.append(ViewTime(view, times.count, times.mean, times.most))
        views.sort(key=lambda v: v.mean or 0.0, reverse=True)

        def present(name: str) -> float | None:
            return samples.total(name) if samples.has(name) else None

        readings = Readings(
            at=now,
            committed=samples.total("lith_writer_commands_total", result="committed"),
            failed=samples.total("lith_writer_commands_total", result="failed"),
            repeated=samples.total("lith_writer_commands_total", result="repeated"),
            commands_per_second=rates[0],
            failed_batches=samples.total("lith_writer_batches_total", result="failed"),
            retries=samples.total("lith_writer_retries_total"),
            queue=samples.total("lith_writer_queue_depth"),
            busy=samples.total("lith_writer_busy_ratio"),
            batch_size=batch.mean,
            keys=samples.total("lith_writer_idempotency_keys"),
            commit=commit.mean,
            ticks_per_second=rates[1],
            tick=tick.mean,
            late_ticks=samples.total("lith_hub_late_ticks_total"),
            renders_per_second=rates[2],
            unchanged=samples.total("lith_hub_unchanged_total"),
            dirty=samples.total("lith_hub_dirty_instances"),
            streams=streams,
            frames=frames,
            html_per_frame=samples.total("lith_stream_bytes_total", stage="html") / frames if frames else None,
            sent_per_frame=samples.total("lith_stream_bytes_total", stage="sent") / frames if frames else None,
            superseded=samples.total("lith_stream_frames_superseded_total"),
            send_timeouts=samples.total("lith_stream_send_timeouts_total"),
            rss=present("process_resident_memory_bytes"),
            encoder_bytes=samples.total("lith_stream_encoder_bytes"),
            views=views,
            replica_lag=present("lith_replica_lag_seconds"),
            replica_restarts=present("lith_replica_restarts_total"),
            accounts_open=present("lith_accounts_open"),
            accounts_opened=present("lith_accounts_opened_total"),
            accounts_closed=present("lith_accounts_closed_total"),
            history=tuple(self._history),
        )
        return readings, plotted

    def _plot(self, now: float, commit: Histogram, tick: Histogram) -> bool:
        """A point every `POINT_EVERY` seconds: what the histograms observed since the last."""
        last = self._last_point
        if last is not None and now - last[0] < POINT_EVERY:
            return False
        self._last_point = (now, commit, tick)
        if last is None:  # the first collection: nothing to measure growth against yet
            return False
        if now - last[0] > 3 * POINT_EVERY:  # nobody watched meanwhile: a gap in the lines
            self._history.append(Point(now, None, None, None, None))
            return True
        commit_grew, tick_grew = commit.since(last[1]), tick.since(last[2])
        self._history.append(Point(now, commit_grew.mean, commit_grew.most, tick_grew.mean, tick_grew.most))
        return True
