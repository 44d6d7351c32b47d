"""Metrics over a real uvicorn: scraped under load, parsed as Prometheus parses them.

Counters only grow, histograms are cumulative and count what the writer counted, the open
streams are the ones the test opened, the route answers only the app's operator, and with
`--workers 2` one scrape sums both processes. Every wait is on a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import htpy as h
import httpx
import pytest
from fastapi import Depends, FastAPI
from prometheus_client.parser import text_string_to_metric_families

from fastapi_lith import Accounts, Command, Db, Lith, Rejected, SettingError, TabCommand, Tx
from fastapi_lith.backends.sqlite.feed import SqliteFeed
from fastapi_lith.engine.encoders import ZstdEncoder
from fastapi_lith.engine.frames import Frame
from fastapi_lith.testing import Tabs
from tests.support import CHILD_HANG_LIMIT, REPO, SUPPORT, until
from tests.support.browser import Server
from tests.support.inprocess import InProcessServer
from tests.support.orphan import Orphan, add_orphan_tables

APP = "metricsapp:app"
OPERATOR = {"X-Operator": "yes"}
_tabs = itertools.count(1)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def settings(db: Path, **env: str) -> dict[str, str | None]:
    return {"METRICS_DB": str(db), **env}


class Scrape:
    """One scrape, parsed: its families by name and every sample by (name, labels)."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: Samples = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples[s.name, frozenset(s.labels.items())] = s.value

    def get(self, name: str, **labels: str) -> float:
        return self.samples[name, frozenset(labels.items())]

    def total(self, name: str, **labels: str) -> float:
        """The sum over every series of `name` whose labels include `labels` (pid among them)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def pids(self) -> set[str]:
        """The processes with a series of their own (multiprocess mode)."""
        return {pid for (name, labels) in self.samples if name == "process_resident_memory_bytes"
                for key, pid in labels if key == "pid"}  # fmt: skip

    def check(self, before: Scrape | None) -> None:
        """What holds of every scrape: cumulative histograms whose count is their +Inf bucket,
        and counters no lower than in the scrape before."""
        for family in self.families.values():
            if family.type == "histogram":
                series: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        labels = frozenset((k, v) for k, v in s.labels.items() if k != "le")
                        series.setdefault(labels, []).append((float(s.labels["le"]), s.value))
                for labels, buckets in series.items():
                    buckets.sort()
                    counts = [c for _, c in buckets]
                    assert counts == sorted(counts), (family.name, labels, buckets)
                    assert buckets[-1][0] == math.inf
                    assert self.samples[family.name + "_count", labels] == counts[-1]
            if before is not None and family.type in ("counter", "histogram"):
                for s in family.samples:
                    if s.name.endswith(("_total", "_count", "_bucket", "_sum")):
                        key = (s.name, frozenset(s.labels.items()))
                        assert s.value >= before.samples.get(key, 0), (key, before.samples.get(key), s.value)


async def scrape(client: httpx.AsyncClient, base: str) -> Scrape:
    response = await client.get(f"{base}/lith/metrics", headers=OPERATOR)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    return Scrape(response.text)


class Tab:
    """One tab's stream, read to the end in the background; `pid` is the process serving it."""

    def __init__(self, base: str, encoding: str) -> None:
        self.id = f"tab{next(_tabs)}"
        self.url = f"{base}/lith/stream?views=counter,outcome/{self.id}&tab={self.id}"
        self.encoding = encoding
        self.pid = ""
        self.bytes = 0
        self._task: asyncio.Task[None] | None = None

    async def open(self, client: httpx.AsyncClient) -> Tab:
        opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read(client, opened))
        await opened
        return self

    async def _read(self, client: httpx.AsyncClient, opened: asyncio.Future[None]) -> None:
        try:
            async with client.stream("GET", self.url, headers={"Accept-Encoding": self.encoding}) as response:
                assert response.status_code == 200, response.status_code
                self.pid = response.headers.get("x-pid", "")
                opened.set_result(None)
                async for chunk in response.aiter_raw():
                    self.bytes += len(chunk)
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            if not opened.done():
                opened.set_exception(RuntimeError(f"stream {self.url} did not open"))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def tabs_on_both(server: Server, client: httpx.AsyncClient) -> list[Tab]:
    """Zstd streams of a `--workers 2` server, opened until each process serves two."""
    deadline = time.monotonic() + 60
    while server.output.count("Application startup complete") < 2:  # the port answers with one
        assert time.monotonic() < deadline, "the second worker never started"
        await asyncio.sleep(0.05)
    tabs: list[Tab] = []
    for _ in range(60):  # the kernel picks the process of each connection
        tabs.append(await Tab(server.url, "zstd").open(client))
        pids = [t.pid for t in tabs]
        if len(set(pids)) == 2 and all(pids.count(p) >= 2 for p in set(pids)):
            return tabs
    raise AssertionError("every stream landed in one process")


COUNTER = "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"


def counter_view(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar("SELECT count FROM counter")]


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    """A migrations folder of one table, `counter`, for the apps the tests build in process."""
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_counter.sql").write_text(COUNTER)
    return folder


@pytest.fixture
async def client() -> Any:
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as c:
        yield c


# 600 commands from a client in this process to a server on a thread of it take several seconds,
# and under mutmut's trampolines more than the ten `make mutate` gives a test.
@pytest.mark.timeout(60)
async def test_a_scrape_under_load_counts_what_the_writer_and_the_streams_did(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = app_server(APP, env=settings(tmp_path / "app.db"))
    encodings = ("zstd", "zstd", "gzip", "br", "identity")
    tabs = [await Tab(server.url, encoding).open(client) for encoding in encodings]
    sent = 600
    before: Scrape | None = None

    async def command(i: int) -> None:
        body = {"tab": tabs[i % len(tabs)].id, "op": i, "n": 1}
        response = await client.post(f"{server.url}/add", json=body)
        assert response.status_code == 204, response.text

    load = asyncio.ensure_future(asyncio.gather(*(command(i) for i in range(1, sent + 1))))
    scrapes = 0
    while not load.done() or scrapes < 3:  # scraped while the commands land
        now = await scrape(client, server.url)
        now.check(before)
        assert now.get("lith_writer_queue_depth") >= 0
        before, scrapes = now, scrapes + 1
    await load

    async def settled() -> Scrape | None:
        now = await scrape(client, server.url)
        now.check(before)
        return now if now.get("lith_writer_commands_total", result="committed") == sent else None

    last: Scrape = await until(settled)
    # The histograms count every batch the writer committed, and hold every command of them.
    batches = last.get("lith_writer_batches_total", result="committed")
    assert last.get("lith_writer_batch_size_count") == batches == last.get("lith_writer_commit_seconds_count")
    assert last.get("lith_writer_batch_size_sum") == sent
    assert 1 <= batches <= sent
    assert last.get("lith_writer_commands_total", result="failed") == 0
    assert last.get("lith_writer_batches_total", result="failed") == 0
    assert last.get("lith_writer_retries_total") == 0
    # The hub rendered the counter, and every stream is open, awake, in its own encoding.
    assert last.get("lith_hub_renders_total", view="counter") >= 1
    assert last.get("lith_hub_render_seconds_count", view="counter") == last.get("lith_hub_renders_total", view="counter")
    assert last.get("lith_hub_ticks_total") == last.get("lith_hub_tick_seconds_count") >= 1
    for encoding in set(encodings):
        assert last.get("lith_streams_open", state="awake", encoding=encoding) == encodings.count(encoding)
    assert last.total("lith_streams_open") == len(tabs)
    assert last.get("lith_stream_frames_total") >= 2 * len(tabs)  # each tab's first two frames
    assert last.get("lith_stream_bytes_total", stage="sent") > 0
    assert last.get("lith_stream_bytes_total", stage="html") > 0
    assert last.get("lith_stream_encoder_bytes") > 0  # zstd, brotli and gzip hold a window
    assert last.get("process_resident_memory_bytes") > 0
    for tab in tabs:
        tab.close()


async def test_an_idle_zstd_stream_is_counted_as_hibernated(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = app_server(APP, env=settings(tmp_path / "app.db", METRICS_HIBERNATE_AFTER="0.2"))
    tab = await Tab(server.url, "zstd").open(client)

    async def asleep() -> Scrape | None:
        now = await scrape(client, server.url)
        return now if now.get("lith_streams_open", state="hibernated", encoding="zstd") == 1 else None

    last: Scrape = await until(asleep)
    assert last.get("lith_streams_open", state="awake", encoding="zstd") == 0
    tab.close()


async def test_the_route_answers_only_the_apps_operator(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = app_server(APP, env=settings(tmp_path / "app.db"))
    refused = await client.get(f"{server.url}/lith/metrics")
    assert refused.status_code == 403
    assert "lith_" not in refused.text
    assert (await client.get(f"{server.url}/lith/metrics", headers={"X-Operator": "no"})).status_code == 403
    assert "lith_writer_commands_total" in (await client.get(f"{server.url}/lith/metrics", headers=OPERATOR)).text


async def test_the_route_is_off_until_included_and_out_of_openapi(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "app.db")
    app = FastAPI()
    app.include_router(lith.router)
    # No lifespan: the engine is stopped, and the scrape says only what a stopped one has.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        assert (await client.get("/lith/metrics")).status_code == 404
        app.include_router(lith.metrics_router, dependencies=[Depends(lith.unguarded)])
        response = await client.get("/lith/metrics")
        assert response.status_code == 200
        assert Scrape(response.text).get("lith_writer_queue_depth") == 0
        assert "/lith/metrics" not in app.openapi()["paths"]
        custom = Lith(tmp_path / "other.db", prefix="/live")
        app.include_router(custom.metrics_router, dependencies=[Depends(custom.unguarded)])
        assert (await client.get("/live/metrics")).status_code == 200


async def test_two_workers_one_scrape_sums_both_processes(
    server_factory: Callable[..., Server], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {**settings(tmp_path / "app.db", PROMETHEUS_MULTIPROC_DIR=str(shared)), "PYTHONPATH": str(REPO)}
    server = server_factory(APP, cwd=SUPPORT, env=env, args=["--workers", "2"])
    tabs = await tabs_on_both(server, client)
    pids = {t.pid for t in tabs}
    served: set[str] = set()
    sent = 0
    while len(served) < 2 or sent < 40:  # each command on a connection of its own: either process
        sent += 1
        async with httpx.AsyncClient(timeout=30) as own:
            response = await own.post(f"{server.url}/add", json={"tab": tabs[0].id, "op": sent, "n": 1})
        assert response.status_code == 204, response.text
        served.add(response.headers["x-pid"])
        assert sent < 200, "every command landed in one process"
    before: Scrape | None = None

    async def summed() -> Scrape | None:
        nonlocal before
        now = await scrape(client, server.url)
        now.check(before)
        before = now
        done = now.get("lith_writer_commands_total", result="committed") == sent
        return now if done and now.get("lith_feed_poll_lag_seconds_count") > 0 else None

    last: Scrape = await until(summed)
    # One scrape, from whichever process the kernel picked: both processes' streams, one series
    # of process metrics per pid, and the writers' commands summed.
    assert last.get("lith_streams_open", state="awake", encoding="zstd") == len(tabs)
    assert last.pids() == pids
    assert last.get("lith_writer_batch_size_sum") == sent
    assert last.get("lith_writer_batch_size_count") == last.get("lith_writer_batches_total", result="committed")
    for tab in tabs:
        tab.close()


async def test_accounts_sum_their_open_accounts_and_keep_a_closed_ones_counts(tmp_path: Path, migrations: Path) -> None:
    accounts = Accounts(tmp_path / "accounts", migrations=migrations)
    metrics = accounts.metrics  # before serving: the sampler runs with the accounts
    async with accounts.serve():
        for name, count in (("acme", 3), ("globex", 5)):
            await accounts.create(name)
            async with accounts.use(name) as lith:
                for _ in range(count):
                    await lith.engine.writer.do(Bump())
                await lith.engine.writer.do(Refuse(tab="t1", op=1))  # its outcome remembered

        async def remembered() -> bool:  # the outcomes of every open account, summed
            return metrics.value("lith_writer_idempotency_keys") == 2

        await until(remembered)
        await accounts.close("acme")  # its writer gone: what it committed stays counted
        metrics.sample()
        assert metrics.value("lith_accounts_open") == 1
        assert metrics.value("lith_accounts_opened_total") == 2
        assert metrics.value("lith_accounts_closed_total") == 1
        assert metrics.value("lith_writer_commands_total", result="committed") == 3 + 5 + 2
        assert metrics.value("lith_writer_batch_size_sum") == 3 + 5 + 2
    assert metrics.value("lith_accounts_closed_total") == 2  # the last one closed with the pool


async def test_what_a_stream_took_after_the_last_sample_is_counted_when_the_app_stops(tmp_path: Path, migrations: Path) -> None:
    """The stop's last sample reads the hub it can no longer reach through the engine."""
    lith = Lith(tmp_path / "app.db", migrations=migrations)
    lith.view("counter", topics={"counter"})(counter_view)
    metrics = lith.metrics
    async with Tabs(lith) as tabs:
        tab = await tabs.open("counter")  # its first frame read
        await tabs.open("counter")  # a slow tab: it reads nothing more
        metrics.sample()
        assert metrics.value("lith_stream_frames_total") == 2
        # Streams without HTTP hold no compressor: awake, identity, and no encoder memory.
        assert metrics.value("lith_streams_open", state="awake", encoding="identity") == 2
        assert metrics.value("lith_stream_encoder_bytes") == 0
        for _ in range(2):  # the slow tab reads neither: the second replaces the first
            await tabs.do(Bump())
            metrics.sample()
            assert metrics.value("lith_hub_dirty_instances") == 1  # committed, not rendered yet
            await tabs.tick()
            assert len(tab.read()) == 1  # taken after the sample: only the stop's counts it
    assert metrics.value("lith_stream_frames_total") == 4
    assert metrics.value("lith_stream_frames_superseded_total") == 1


async def test_zstd_writes_shared_by_streams_are_counted_once_compressed_and_then_reused(
    tmp_path: Path, migrations: Path
) -> None:
    lith = Lith(tmp_path / "app.db", migrations=migrations)
    lith.view("counter", topics={"counter"})(counter_view)
    metrics = lith.metrics
    async with Tabs(lith):
        metrics.sample()
        before = [metrics.value("lith_stream_cohort_writes_total", done=done) for done in ("compressed", "reused")]
        frame = Frame("board", "".join(f'<p id="card-{i}">card {i}</p>' for i in range(200)))
        frame.shared = True  # as the hub marks a frame it offers to several streams
        for encoder in [ZstdEncoder() for _ in range(3)]:
            encoder.encode_frames([frame])
        metrics.sample()
        after = [metrics.value("lith_stream_cohort_writes_total", done=done) for done in ("compressed", "reused")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 2]


class Bump(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = 1")
        tx.touch("counter")


class Served(Server):
    """`python -m fastapi_lith serve APP` in place of uvicorn's own command line."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "fastapi_lith", "serve", self.app,
                "--host", self.host, "--port", str(self.port), *self.args]  # fmt: skip


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # its uvicorn workers import the package
async def test_serve_gives_its_workers_a_fresh_metrics_folder_and_removes_it(
    tmp_path: Path, client: httpx.AsyncClient
) -> None:
    env = {"METRICS_DB": str(tmp_path / "app.db"), "PYTHONPATH": str(REPO), "PROMETHEUS_MULTIPROC_DIR": None}
    server = Served(APP, cwd=SUPPORT, env=env, args=["--workers", "2"], log_path=tmp_path / "serve.log")
    server.start()
    try:
        tabs = await tabs_on_both(server, client)
        found = re.search(r"share their metrics in (\S+)", server.output)
        assert found, server.output
        folder = Path(found.group(1))
        assert folder.is_dir()

        async def both() -> bool:  # the other process's values are as fresh as its last sample
            last = await scrape(client, server.url)
            return last.get("lith_streams_open", state="awake", encoding="zstd") == len(tabs)

        await until(both)
        assert (await scrape(client, server.url)).pids() == {t.pid for t in tabs}
        for tab in tabs:
            tab.close()
    finally:
        server.close()
    assert server.stopped_cleanly, server.output
    assert not folder.exists()


async def test_the_docs_app_serves_its_metrics_to_the_token_only(
    server_factory: Callable[..., Server], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    # A child process: the app reads its token from the environment on every request.
    env = {"APP_DB": str(tmp_path / "app.db"), "METRICS_TOKEN": "s3cret-for-prometheus", "PYTHONPATH": str(REPO)}
    server = server_factory("metrics_app:app", cwd=REPO / "docs" / "src", env=env)
    token = {"Authorization": "Bearer s3cret-for-prometheus"}
    assert (await client.get(f"{server.url}/lith/metrics")).status_code == 403
    assert (await client.get(f"{server.url}/lith/metrics", headers={"Authorization": "Bearer guess"})).status_code == 403
    scraped = await client.get(f"{server.url}/lith/metrics", headers=token)
    assert scraped.status_code == 200
    assert Scrape(scraped.text).get("lith_writer_commands_total", result="committed") == 0
    tab = await Tab(server.url, "zstd").open(client)
    async with httpx.AsyncClient(timeout=30) as own:  # the counter's command, as its page sends it
        headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
        added = await own.post(f"{server.url}/add", json={"tab": tab.id, "op": 1, "n": 2}, headers=headers)
    assert added.status_code == 204, added.text
    assert (await client.get(f"{server.url}/busy", headers=token)).json() == {"queued": 0, "committed": 1, "streams": 1}
    tab.close()


async def test_failed_repeated_and_render_errors_are_counted_apart(tmp_path: Path, migrations: Path) -> None:
    lith = Lith(tmp_path / "app.db", migrations=migrations)

    @lith.view("broken/{n}", topics={"counter"})
    def broken(db: Db, n: int) -> str:
        raise RuntimeError("a bug in a view")

    @lith.view("also-broken", topics={"counter"})
    def also_broken(db: Db) -> str:
        raise RuntimeError("a bug in another view")

    metrics = lith.metrics
    async with Tabs(lith) as tabs:
        tab = await tabs.open("broken/1", "broken/2", "also-broken")
        await tab.do(Refuse(tab=tab.id, op=1))
        with pytest.raises(Rejected):
            await tab.do(Refuse(tab=tab.id, op=2))
        await tab.do(Refuse(tab=tab.id, op=1))  # a repeat: answered with its first outcome
        metrics.sample()
        assert metrics.value("lith_writer_commands_total", result="committed") == 1
        assert metrics.value("lith_writer_commands_total", result="failed") == 1
        assert metrics.value("lith_writer_commands_total", result="repeated") == 1
        assert metrics.value("lith_writer_batches_total", result="committed") == 3
        # Two instances of one view: one series, by its pattern.
        assert metrics.value("lith_hub_render_errors_total", view="broken/{n}") == 2
        assert metrics.value("lith_hub_renders_total", view="broken/{n}") == 2
        assert metrics.value("lith_hub_render_errors_total", view="also-broken") == 1
        assert metrics.value("lith_hub_renders_total", view="also-broken") == 1
        assert metrics.value("lith_hub_render_errors_total", view="broken/1") is None


async def test_a_batch_whose_commit_failed_counts_its_commands_failed_and_no_others(
    tmp_path: Path, migrations: Path
) -> None:
    add_orphan_tables(tmp_path / "app.db")
    lith = Lith(tmp_path / "app.db", migrations=migrations)
    metrics = lith.metrics
    async with Tabs(lith) as tabs:
        await tabs.do(Bump())
        with pytest.raises(sqlite3.IntegrityError):  # the deferred foreign key, checked at COMMIT
            await tabs.do(Orphan())
        metrics.sample()
        assert metrics.value("lith_writer_commands_total", result="committed") == 1
        assert metrics.value("lith_writer_commands_total", result="failed") == 1
        assert metrics.value("lith_writer_batches_total", result="committed") == 1
        assert metrics.value("lith_writer_batches_total", result="failed") == 1


async def test_the_busy_ratio_is_the_share_of_the_time_the_writer_spent_on_batches(
    tmp_path: Path, migrations: Path
) -> None:
    lith = Lith(tmp_path / "app.db", migrations=migrations)
    metrics = lith.metrics
    async with Tabs(lith) as tabs:

        async def busy() -> bool:  # the writer's thread held most of the time: the sampler sees it
            await tabs.do(Hold(seconds=0.2))
            return (metrics.value("lith_writer_busy_ratio") or 0) >= 0.5

        async def idle() -> bool:  # a sample over a second without a batch
            return metrics.value("lith_writer_busy_ratio") == 0

        await until(busy)
        assert metrics.value("lith_writer_busy_ratio") <= 1
        await until(idle)


async def test_a_stream_ended_at_its_send_timeout_is_counted(tmp_path: Path) -> None:
    from sse_starlette.sse import SendTimeoutError

    from tests.engine.test_hub import Add, make_lith
    from tests.engine.test_streams import board_exchange

    lith, _ = make_lith(tmp_path)
    lith.send_timeout = 0.2
    metrics = lith.metrics
    async with lith.lifespan():
        _, exchange = await board_exchange(lith)
        exchange.stall = True  # the client stops reading
        await lith.writer.do(Add())
        with pytest.raises(SendTimeoutError):
            await asyncio.wait_for(exchange.task, 10)
        metrics.sample()
        assert metrics.value("lith_stream_send_timeouts_total") == 1


class Hold(Command):
    """Holds the writer's thread, as a slow batch does."""

    seconds: float

    def apply(self, tx: Tx) -> None:
        time.sleep(self.seconds)


class Refuse(TabCommand):
    """Applies once, refuses its second op: a command of each result."""

    def apply(self, tx: Tx) -> None:
        if self.op == 2:
            raise Rejected("not this one")
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = 1")


async def test_the_feed_between_two_processes_counts_its_lag_and_its_gaps(tmp_path: Path, migrations: Path) -> None:
    db = tmp_path / "app.db"
    # Two Liths on one file stand for two processes (tests/engine/test_feed.py says how).
    a = Lith(db, migrations=migrations, feed=SqliteFeed(db, keep=4, prune_every=2))
    b = Lith(db, migrations=migrations)
    b.view("counter", topics={"counter"})(counter_view)
    metrics = b.metrics
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        await tabs_b.open("counter")
        before = time.time()
        await tabs_a.do(Bump())
        await tabs_b.tick()  # b hears a's commit through the feed
        metrics.sample()
        assert metrics.value("lith_feed_poll_lag_seconds_count") == 1
        # From the commit to the poll that took it: within what the test spent on both.
        assert 0 <= metrics.value("lith_feed_poll_lag_seconds_sum") <= time.time() - before
        assert metrics.value("lith_feed_gaps_total") == 0
        for _ in range(10):  # more than the feed keeps: b finds a gap
            await tabs_a.do(Bump())
        await tabs_b.tick()
        metrics.sample()
        assert metrics.value("lith_feed_gaps_total") == 1
        assert isinstance(b.feed, SqliteFeed) and b.feed.reads > 1  # the first, then those kept past the gap
        assert metrics.value("lith_feed_poll_lag_seconds_count") == b.feed.reads  # each one read
        assert metrics.value("lith_feed_notify_seconds_count") is None  # NOTIFY is PostgreSQL's


async def test_a_postgresql_feed_counts_how_late_each_notify_arrived(migrations: Path, pg_url: str) -> None:
    (migrations / "postgres").mkdir()
    (migrations / "postgres" / "0001_counter.sql").write_text(COUNTER)
    # Two Liths on one database stand for two processes, as on SQLite above.
    a, b = Lith(pg_url, migrations=migrations), Lith(pg_url, migrations=migrations)
    b.view("counter", topics={"counter"})(counter_view)
    metrics = b.metrics
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        await tabs_b.open("counter")
        await tabs_a.do(Bump())

        async def heard() -> bool:
            await tabs_b.tick()
            metrics.sample()
            return metrics.value("lith_feed_notify_seconds_count") == 1

        await until(heard)
        assert metrics.value("lith_feed_poll_lag_seconds_count") == 1
        assert 0 <= metrics.value("lith_feed_notify_seconds_sum") <= metrics.value("lith_feed_poll_lag_seconds_sum")


async def test_a_replica_shows_its_restarts_its_lag_and_its_last_check(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    env = {"APP_DB": str(tmp_path / "app.db"), "APP_REPLICA": f"file://{tmp_path / 'replica'}", "APP_CHECK_EVERY": "1"}
    server = app_server("replicaapp:app", env=env)
    for _ in range(5):
        assert (await client.post(f"{server.url}/append", json={})).status_code == 200

    async def scraped() -> Scrape:
        return Scrape((await client.get(f"{server.url}/lith/metrics")).text)

    async def checked() -> Scrape | None:  # NaN, unknown, until the first check is read
        now = await scraped()
        return now if now.get("lith_replica_last_check_timestamp_seconds") > 0 else None

    last: Scrape = await until(checked, timeout=60)
    assert abs(last.get("lith_replica_last_check_timestamp_seconds") - time.time()) < 60
    assert last.get("lith_replica_last_check_ok") == 1
    assert last.get("lith_replica_lag_seconds") >= 0
    assert last.get("lith_replica_restarts_total") == 0
    os.kill((await client.get(f"{server.url}/health")).json()["litestream_pid"], signal.SIGKILL)

    async def restarted() -> bool:
        return (await scraped()).get("lith_replica_restarts_total") == 1

    await until(restarted)


@pytest.mark.timeout(60)  # it waits on Litestream's syncs and on the lag's sample, every SLOW_EVERY
async def test_the_replica_lag_grows_while_litestream_is_stopped_and_falls_once_it_catches_up(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    """The lag is how far the database's newest write is ahead of what Litestream has taken:
    under a second once it has synced, growing with each write while it is stopped."""
    env = {"APP_DB": str(tmp_path / "app.db"), "APP_REPLICA": f"file://{tmp_path / 'replica'}", "APP_SYNC": "1"}
    server = app_server("replicaapp:app", env=env)

    async def lag() -> float:
        return Scrape((await client.get(f"{server.url}/lith/metrics")).text).get("lith_replica_lag_seconds")

    async def append() -> None:
        assert (await client.post(f"{server.url}/append", json={})).status_code == 200

    async def caught_up() -> bool:
        return 0 <= await lag() < 1  # NaN until Litestream has taken the first write

    await append()
    await until(caught_up, timeout=60)
    litestream = (await client.get(f"{server.url}/health")).json()["litestream_pid"]
    os.kill(litestream, signal.SIGSTOP)
    try:
        async def behind() -> bool:
            await append()
            return await lag() >= 2

        await until(behind, timeout=60)
    finally:
        os.kill(litestream, signal.SIGCONT)
    await until(caught_up, timeout=60)


async def test_a_repeat_of_a_refused_command_is_failed_and_repeated_and_not_committed(tmp_path: Path, migrations: Path) -> None:
    lith = Lith(tmp_path / "app.db", migrations=migrations)
    metrics = lith.metrics
    async with Tabs(lith) as tabs:
        tab = await tabs.open("outcome/{tab}")
        for _ in range(2):  # the same op twice: the second is answered with the first's refusal
            with pytest.raises(Rejected):
                await tab.do(Refuse(tab=tab.id, op=2))
        await tab.do(Refuse(tab=tab.id, op=3))
        metrics.sample()
        assert metrics.value("lith_writer_commands_total", result="failed") == 2
        assert metrics.value("lith_writer_commands_total", result="repeated") == 1
        assert metrics.value("lith_writer_commands_total", result="committed") == 1

        async def remembered() -> bool:  # counted by the sampler's slow pass, on a reader
            return metrics.value("lith_writer_idempotency_keys") == 2  # ops 2 and 3: one outcome each

        await until(remembered)


def test_a_metrics_folder_named_after_prometheus_client_was_imported_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prometheus-client chose where its values live when this process imported it: a folder
    named now would show one process of several, so it is refused, saying when to set it."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    lith = Lith(tmp_path / "app.db")
    said = (r"PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported: set it before the app "
            r"starts \(in the service's environment\), so every process writes its values there$")
    with pytest.raises(SettingError, match=said):
        lith.metrics  # noqa: B018 - made at its first use


@pytest.mark.parametrize("include", [{}, {"dependencies": []}])
async def test_a_scrape_mounted_without_a_guard_is_refused_at_start_up(tmp_path: Path, include: dict[str, Any]) -> None:
    lith = Lith(tmp_path / "app.db")
    app = FastAPI()
    app.include_router(lith.router)
    app.include_router(lith.metrics_router, **include)
    with pytest.raises(SettingError, match=re.escape(
        "/lith/metrics shows the app's internals (its load, its views, its memory) and has no guard: include it "
        "with the app's own, app.include_router(lith.metrics_router, dependencies=[Depends(operator)]), or say "
        "that anyone may see it with dependencies=[Depends(lith.unguarded)]"
    )):
        async with app.router.lifespan_context(app):
            pass
