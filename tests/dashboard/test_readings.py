"""What the dashboard reads from a registry: rates over the last second, histograms' growth,
the plots' points, and every number present only when its metric is."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fastapi_lith.dashboard.readings import POINT_EVERY, Reader, Samples
from fastapi_lith.dashboard.readings import Histogram as Observed


def registry() -> tuple[CollectorRegistry, Counter, Histogram]:
    reg = CollectorRegistry()
    commands = Counter("lith_writer_commands_total", "", ("result",), registry=reg)
    commit = Histogram("lith_writer_commit_seconds", "", registry=reg, buckets=(0.001, 0.01, 0.1))
    Gauge("lith_streams_open", "", ("state", "encoding"), registry=reg).labels("awake", "zstd").set(3)
    return reg, commands, commit


def test_a_histogram_grows_by_what_it_observed_and_its_worst_is_a_bucket_bound() -> None:
    before = Observed(2, 0.004, [(0.001, 1), (0.01, 2), (math.inf, 2)])
    after = Observed(5, 0.104, [(0.001, 1), (0.01, 3), (math.inf, 5)])
    grew = after.since(before)
    assert grew.count == 3 and math.isclose(grew.sum, 0.1)
    assert grew.most == math.inf  # two of the three were past the last bound
    assert Observed(1, 0.005, [(0.001, 0), (0.01, 1), (math.inf, 1)]).most == 0.01
    assert Observed().mean is None and Observed().most is None


def test_rates_points_and_absent_metrics() -> None:
    reg, commands, commit = registry()
    reader = Reader()
    first, plotted = reader.read(Samples(reg.collect()), now=100.0)
    assert not plotted and first.commands_per_second == 0 and first.history == ()
    assert first.streams == {("awake", "zstd"): 3} and first.open_streams == 3
    assert first.replica_lag is None and first.accounts_open is None and first.rss is None
    commands.labels("committed").inc(50)
    commit.observe(0.005)
    commit.observe(0.005)
    later, plotted = reader.read(Samples(reg.collect()), now=100.0 + POINT_EVERY)
    assert plotted and later.committed == 50
    assert math.isclose(later.commands_per_second, 50 / POINT_EVERY)
    assert math.isclose(later.commit or 0, 0.005)
    (point,) = later.history
    assert math.isclose(point.commit_mean or 0, 0.005) and point.commit_most == 0.01
    assert point.tick_mean is None  # no tick observed: a gap in that line
    # Nobody watched for a while: the plots show a gap, not a minute's growth as one second.
    gap, plotted = reader.read(Samples(reg.collect()), now=100.0 + 60 * POINT_EVERY)
    assert plotted and gap.history[-1].commit_mean is None
