"""The few statistics the scenarios print: percentiles, medians and a spread."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

NAN = float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0 to 100) of `values`; nan when there are none."""
    if not values:
        return NAN
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    """The median of the values that are numbers (nan ones left out); nan when none are."""
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else NAN


def spread(values: Sequence[float]) -> str:
    """`median (min–max, n)`: a few rounds on a shared machine have no better summary."""
    kept = [v for v in values if v == v]
    if not kept:
        return "–"
    if len(kept) == 1:
        return f"{kept[0]:.3g} (one round)"
    return f"{statistics.median(kept):.3g} ({min(kept):.3g}–{max(kept):.3g}, n={len(kept)})"


def number(x: float, digits: int = 0) -> str:
    """A figure for a table: thousands separated, a dash for nan."""
    return "–" if x != x else f"{x:,.{digits}f}"


def ratio(a: float, b: float) -> float:
    """a / b, nan when b is zero or either is nan: a starved run's figures stay printable."""
    return a / b if b and a == a and b == b else NAN
