"""The names an operator's dashboard reads are the ones docs/metrics.md lists, each of its type.

The table in "The names" is what an operator writes alerts and queries against: a metric the
app exposes under another name or type, or one the page leaves out, is a broken promise either
way. Every instrument exists here: the replica's, the accounts' and the NOTIFY histogram too.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from fastapi_lith.ops.instruments import Instruments
from tests.support import REPO

# A row of the table: the names (each in backquotes, a `{labels}` suffix left off), then the type.
ROW = re.compile(r"^\| (?P<names>`[^|]+`) \| (?P<type>counter|gauge|histogram) \|", re.MULTILINE)


def documented() -> dict[str, str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    table = text.split("## The names", 1)[1].split("\n\n", 2)[1]
    names: dict[str, str] = {}
    for row in ROW.finditer(table):
        for name in re.findall(r"`([a-z_]+)(?:\{[^}]*\})?`", row["names"]):
            names[name] = row["type"]
    return names


def exposed() -> dict[str, str]:
    registry = CollectorRegistry()
    Instruments(registry, replica=True, pool=True).notify()
    # prometheus-client names a counter's family without its `_total`; the scrape has it.
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in registry.collect()}


def test_every_metric_is_documented_under_its_name_and_type() -> None:
    assert documented() == exposed()


def test_a_batch_size_is_counted_in_powers_of_two_up_to_the_largest_batch() -> None:
    """docs/metrics.md: "buckets 1, 2, 4 .. 512", and a batch holds at most 512 commands."""
    registry = CollectorRegistry()
    Instruments(registry, replica=False, pool=False).writer_batch_size.observe(512)
    buckets = {s.labels["le"]: s.value for f in registry.collect() for s in f.samples
               if s.name == "lith_writer_batch_size_bucket"}  # fmt: skip
    assert list(buckets) == [f"{2.0**i}" for i in range(10)] + ["+Inf"]
    assert buckets["256.0"] == 0 and buckets["512.0"] == 1
