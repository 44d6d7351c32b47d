"""The names an operator's dashboard reads are the ones docs/metrics.md lists, each of its type
and with its labels.

The table in "The names" is what an operator writes alerts and queries against: a metric the
app exposes under another name, type or labels, or one the page leaves out, is a broken promise
either way. Every instrument exists here: the replica's, the accounts' and the NOTIFY histogram
too.
"""

from __future__ import annotations

import functools
import re

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from fastapi_lith.ops.instruments import Instruments
from tests.support import REPO

# A row of the table: the names (each in backquotes), then the type.
ROW = re.compile(r"^\| (?P<names>`[^|]+`) \| (?P<type>counter|gauge|histogram) \|", re.MULTILINE)
NAME = re.compile(r"`(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})?`")


@functools.cache
def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each name of the table: its type and its labels (`{state, encoding}`)."""
    text = (REPO / "docs" / "metrics.md").read_text()
    table = text.split("## The names", 1)[1].split("\n\n", 2)[1]
    names: dict[str, tuple[str, tuple[str, ...]]] = {}
    for row in ROW.finditer(table):
        for name in NAME.finditer(row["names"]):
            labels = tuple(label.strip() for label in (name["labels"] or "").split(",") if label.strip())
            names[name["name"]] = (row["type"], labels)
    return names


def every_instrument() -> tuple[CollectorRegistry, Instruments]:
    """Every instrument, the replica's, the accounts' and NOTIFY's too, in the registry a scrape reads."""
    registry = CollectorRegistry()
    made = Instruments(registry, replica=True, pool=True)
    made.notify()
    return registry, made


def scraped_name(family: Metric) -> str:
    """The name a scrape shows: prometheus-client names a counter's family without its `_total`."""
    return family.name + ("_total" if family.type == "counter" else "")


def test_every_metric_is_documented_under_its_name_and_type() -> None:
    registry, _ = every_instrument()
    scraped = {scraped_name(family): family.type for family in registry.collect()}
    assert {name: kind for name, (kind, _) in documented().items()} == scraped


@pytest.mark.parametrize("name", sorted(documented()))
def test_each_metric_takes_the_labels_the_docs_give_it(name: str) -> None:
    _, made = every_instrument()
    metrics = [m for m in vars(made).values() if isinstance(m, MetricWrapperBase)]
    (metric,) = [m for m in metrics if scraped_name(m.describe()[0]) == name]
    labels = documented()[name][1]
    if labels:
        metric.labels(**dict.fromkeys(labels, "x"))  # ValueError unless these are its label names
    else:
        with pytest.raises(ValueError, match="No label names"):
            metric.labels()


def test_each_metric_says_what_it_counts_in_one_sentence() -> None:
    """A scrape's `# HELP` line, what Prometheus and Grafana show beside the name: a sentence
    (a capital or a number first, a period last), never empty, never shouted."""
    registry, _ = every_instrument()
    for family in registry.collect():
        text = family.documentation
        assert text[:1].isupper() or text[:1].isdigit(), (family.name, text)
        assert text.endswith(".") and text != text.upper(), (family.name, text)


def test_a_batch_size_is_counted_in_powers_of_two_up_to_the_largest_batch() -> None:
    """docs/metrics.md: "buckets 1, 2, 4 .. 512", and a batch holds at most 512 commands."""
    registry = CollectorRegistry()
    Instruments(registry, replica=False, pool=False).writer_batch_size.observe(512)
    buckets = {s.labels["le"]: s.value for f in registry.collect() for s in f.samples
               if s.name == "lith_writer_batch_size_bucket"}  # fmt: skip
    assert list(buckets) == [f"{2.0**i}" for i in range(10)] + ["+Inf"]
    assert buckets["256.0"] == 0 and buckets["512.0"] == 1
