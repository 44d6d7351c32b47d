"""What the library counts, read as its operator reads it: its metrics (docs/metrics.md).

A benchmark observes the library through its public surface only (tests/bench/test_public.py).
In process, `Counts.of(lith.metrics)` samples the app's metrics; over HTTP, `Counts.parse(text)`
reads a scrape of `GET /lith/metrics`. Two snapshots around a window give the window:

    before = Counts.of(lith.metrics)
    ... the window ...
    window = Counts.of(lith.metrics) - before
    window.total("lith_hub_renders_total")                  # every view pattern
    window.get("lith_hub_renders_total", view="board/{board_id}")
    window.mean("lith_hub_tick_seconds"), window.quantile("lith_hub_tick_seconds", 0.95)

Counters and histograms subtract (what happened in the window); a gauge keeps its value at
the window's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass
class Counts:
    values: dict[Key, float] = field(default_factory=dict)
    gauges: set[str] = field(default_factory=set)  # sample names whose values are levels, not totals
    # An older library (`--against` a commit from before the metrics) counts nothing this way:
    # every figure read from it is NaN, shown as "–", rather than a zero that looks measured.
    absent: bool = False

    @classmethod
    def of_families(cls, families: Iterable[Any]) -> Counts:
        out = cls()
        for family in families:
            for sample in family.samples:
                if sample.name.endswith("_created"):  # when a series began: not a count
                    continue
                out.values[sample.name, frozenset(sample.labels.items())] = float(sample.value)
                if family.type == "gauge":
                    out.gauges.add(sample.name)
        return out

    @classmethod
    def of(cls, metrics: Any) -> Counts:
        """`lith.metrics` (a `fastapi_lith.Metrics`) brought up to date, then read; None (a
        library with no metrics) reads as absent."""
        if metrics is None:
            return cls(absent=True)
        metrics.sample()
        return cls.of_families(metrics.registry.collect())

    @classmethod
    def parse(cls, text: str) -> Counts:
        """A scrape of the metrics route, in Prometheus's text format."""
        from prometheus_client.parser import text_string_to_metric_families

        return cls.of_families(text_string_to_metric_families(text))

    def __sub__(self, before: Counts) -> Counts:
        if self.absent or before.absent:
            return Counts(absent=True)
        return Counts({key: value if key[0] in self.gauges else value - before.values.get(key, 0.0)
                       for key, value in self.values.items()}, set(self.gauges))

    def get(self, name: str, **labels: str) -> float:
        """One series' value; 0 when it has none (nothing counted yet)."""
        if self.absent:
            return math.nan
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of every series of `name` that has these labels (and any others)."""
        if self.absent:
            return math.nan
        want = set(labels.items())
        return sum(v for (n, ls), v in self.values.items() if n == name and want <= ls)

    def by(self, name: str, label: str) -> dict[str, float]:
        """`name`'s values by one label: renders by view pattern, say."""
        return {dict(ls)[label]: v for (n, ls), v in self.values.items() if n == name and label in dict(ls)}

    def mean(self, histogram: str, **labels: str) -> float:
        count = self.total(histogram + "_count", **labels)
        return self.total(histogram + "_sum", **labels) / count if count else math.nan

    def quantile(self, histogram: str, q: float, **labels: str) -> float:
        """As Prometheus's `histogram_quantile`: linear within the bucket the quantile falls in,
        so it is as fine as the buckets are (docs/metrics.md lists them)."""
        buckets: dict[float, float] = {}
        want = set(labels.items())
        for (n, ls), v in self.values.items():
            if n == histogram + "_bucket" and want <= ls:
                le = float(dict(ls)["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        if not buckets or not buckets.get(math.inf):
            return math.nan
        rank, lower, below = q * buckets[math.inf], 0.0, 0.0
        for le in sorted(buckets):
            if buckets[le] >= rank:
                if math.isinf(le):
                    return lower
                inside = buckets[le] - below
                return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = le, buckets[le]
        return lower
