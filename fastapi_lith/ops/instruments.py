"""The names an operator's dashboard reads: every counter, gauge and histogram of `Metrics`.

Declared once, here, with their help texts, buckets and how several processes' values combine
(a gauge's `multiprocess_mode`: summed over the live processes, or the largest, or the smallest).
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SIZES = tuple(float(1 << i) for i in range(10))  # 1, 2, 4 .. 512: a batch holds at most 512
SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAGS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STATES = ("awake", "hibernated")
ENCODINGS = ("zstd", "br", "gzip", "identity")


class Instruments:
    """The prometheus-client objects of one `Metrics`, registered in `own` (None: in no
    registry, their values in the multiprocess folder). The replica's exist with `replica`,
    the accounts' with `pool`."""

    def __init__(self, own: CollectorRegistry | None, *, replica: bool, pool: bool) -> None:
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
        self.writer_batch_size = histogram("lith_writer_batch_size", "Commands per committed batch.", SIZES)
        self.writer_commit = histogram(
            "lith_writer_commit_seconds", "From handing a batch to the writer thread to its answer.", SECONDS
        )
        self.writer_busy = gauge(
            "lith_writer_busy_ratio", "Share of the last sample interval the writer spent on batches.", "livemax"
        )
        self.writer_keys = gauge(
            "lith_writer_idempotency_keys", "Rows of the outcomes table (keyed commands remembered).", "livemax"
        )
        self.hub_ticks = counter("lith_hub_ticks_total", "Ticks of the hub.")
        self.hub_tick_seconds = histogram("lith_hub_tick_seconds", "How long a tick took.", SECONDS)
        self.hub_late = counter(
            "lith_hub_late_ticks_total", "Ticks that started well after their time or ran past the interval."
        )
        self.hub_renders = counter("lith_hub_renders_total", "View renders, by view pattern.", ("view",))
        self.hub_render_seconds = histogram(
            "lith_hub_render_seconds", "How long a view took to render, by view pattern.", SECONDS, ("view",)
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
        self.cohort_writes = counter(
            "lith_stream_cohort_writes_total",
            "Writes of zstd cohorts (several streams, the same bytes): compressed once, or reused by another member.",
            ("done",),
        )
        self.stream_timeouts = counter(
            "lith_stream_send_timeouts_total", "Streams ended because the client stopped reading."
        )
        self.encoder_bytes = gauge(
            "lith_stream_encoder_bytes", "Memory the streams' compressors hold (estimated).", "livesum"
        )
        self.feed_gaps = counter("lith_feed_gaps_total", "Changes missed from the feed: every view rendered again.")
        self.feed_lag = histogram(
            "lith_feed_poll_lag_seconds", "From another process's commit to this hub taking it.", LAGS
        )
        self._histogram = histogram
        self.feed_notify: Histogram | None = None  # made when a feed measures NOTIFY: `notify()`
        if replica:
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
        if pool:
            self.accounts_open = gauge("lith_accounts_open", "Accounts open now.", "livesum")
            self.accounts_opened = counter("lith_accounts_opened_total", "Accounts opened.")
            self.accounts_closed = counter("lith_accounts_closed_total", "Accounts closed.")

    def notify(self) -> Histogram:
        """NOTIFY's latency: only a PostgreSQL feed measures it, so made at its first sample."""
        if self.feed_notify is None:
            self.feed_notify = self._histogram(
                "lith_feed_notify_seconds", "From another process's commit to its NOTIFY arriving here.", LAGS
            )
        return self.feed_notify
