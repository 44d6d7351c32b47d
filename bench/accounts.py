"""One database per account: what many small writers cost against one big one, in process.

1. Throughput: 200 closed-loop producers through `writer.do`, either 100 accounts × 2
   producers (100 files, 100 writers) or 1 account × 200 (one file, one writer); rounds
   interleaved, medians, and their ratio.
2. Memory: RSS and live Python objects per open account (N open at once), and what a closed
   account leaves behind (after 2N more were opened and closed).
3. Cold open: `GET /a/NAME/` (the page with its first render, through FastAPI in process) of a
   closed account, against the same GET once it is open.
4. Isolation: 2 producers of small commands while another sends large writes (20,000 rows
   each), into another account or into the same one: the small commands' p50/p99.

    python -m bench.accounts            # about a minute and a half
    python -m bench.accounts --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from fastapi_lith import Accounts, Command, Db, Tx

from .lib import harness
from .lib.load import produce
from .lib.proc import rss
from .lib.stats import median, percentile

INIT = "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"


class Add(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = 1")
        tx.touch("counter")


class Bulk(Command):
    """A large write: 20,000 rows in one command."""

    def apply(self, tx: Tx) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS bulk (x INTEGER)")
        tx.conn.executemany("INSERT INTO bulk VALUES (?)", ((i,) for i in range(20000)))
        tx.execute("DELETE FROM bulk")


def build(root: Path, **kwargs: Any) -> tuple[Accounts, FastAPI]:
    (root / "migrations").mkdir(parents=True, exist_ok=True)
    (root / "migrations" / "0001_init.sql").write_text(INIT)
    accounts = Accounts(root / "accounts", migrations=root / "migrations", same_origin_only=False, **kwargs)

    @accounts.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter"))

    app = FastAPI(lifespan=accounts.lifespan)
    accounts.install(app)

    @accounts.router.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return f"<main>{await accounts.render('counter')}</main>" + accounts.connect("counter", tab="t1")

    return accounts, app


async def throughput(accounts: Accounts, names: list[str], per_account: int, warmup: float,
                     seconds: float) -> dict[str, float]:
    async with contextlib.AsyncExitStack() as stack:
        liths = [await stack.enter_async_context(accounts.use(name)) for name in names]
        load = await produce(lambda k, i: liths[k % len(liths)].writer.do(Add()), len(liths) * per_account,
                             warmup=warmup, seconds=seconds)
    assert load.cost is not None
    return {"rate": load.rate, "p50": load.p50_ms, "p99": load.p99_ms, "others": load.cost.others}


async def isolation(accounts: Accounts, small: str, large: str, seconds: float) -> dict[str, float]:
    """Small commands' latency in `small` while `large` takes large writes."""
    latencies: list[float] = []
    stop = False

    async def bulk(lith: Any) -> None:
        while not stop:
            await lith.writer.do(Bulk())

    async def producer(lith: Any) -> None:
        while not stop:
            started = time.perf_counter()
            await lith.writer.do(Add())
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.002)  # a person's pace, not a closed loop

    async with accounts.use(small) as s, accounts.use(large) as big:
        tasks = [asyncio.ensure_future(bulk(big)), *(asyncio.ensure_future(producer(s)) for _ in range(2))]
        await asyncio.sleep(seconds / 4)
        latencies.clear()
        await asyncio.sleep(seconds)
        stop = True
        await asyncio.gather(*tasks)
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


def tracked() -> int:
    """Objects the cycle collector knows, frozen ones included (each writer start freezes)."""
    return len(gc.get_objects()) + gc.get_freeze_count()


async def memory(root: Path, n: int) -> dict[str, float]:
    accounts, app = build(root, max_open=10_000, idle_after=600)
    async with accounts.lifespan(app):
        names = [f"m{i:04d}" for i in range(3 * n)]
        for name in names:  # created, then closed: every code path and allocator arena used once
            await accounts.create(name)
            await accounts.close(name)
        gc.collect()
        base = rss(), tracked()
        async with contextlib.AsyncExitStack() as stack:
            for name in names[:n]:
                await (await stack.enter_async_context(accounts.use(name))).render("counter")
            gc.collect()
            opened = rss(), tracked()
        for name in names[:n]:
            await accounts.close(name)
        gc.collect()
        closed = rss(), tracked()
        for name in names[n:]:
            async with accounts.use(name):
                pass
            await accounts.close(name)
        gc.collect()
        after = rss(), tracked()
    return {"open_kib": (opened[0] - base[0]) / n / 1024, "open_objects": (opened[1] - base[1]) / n,
            "closed_kib": (after[0] - closed[0]) / (2 * n) / 1024, "closed_objects": (after[1] - closed[1]) / (2 * n)}


async def cold_open(root: Path, n: int) -> dict[str, float]:
    accounts, app = build(root, max_open=10_000, idle_after=600)
    cold, warm = [], []
    async with accounts.lifespan(app):
        names = [f"c{i:03d}" for i in range(n)]
        for name in names:
            await accounts.create(name)
            await accounts.close(name)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
            await client.get(f"/a/{names[0]}/")
            await accounts.close(names[0])
            for name in names:
                started = time.perf_counter()
                response = await client.get(f"/a/{name}/")
                cold.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200 and '<p id="counter">0</p>' in response.text
                started = time.perf_counter()
                await client.get(f"/a/{name}/")
                warm.append((time.perf_counter() - started) * 1000)
    return {"cold_ms": median(cold), "cold_p90_ms": percentile(cold, 90), "warm_ms": median(warm)}


async def run(args: argparse.Namespace) -> harness.Result:
    rounds, seconds, n_memory, n_cold = (1, 0.3, 10, 3) if args.smoke else (2, 1.5, 100, 20) if args.quick \
        else (3, 3.0, 200, 50)
    root = Path(tempfile.mkdtemp(prefix="lith-bench-accounts-"))
    try:
        accounts, app = build(root / "throughput", max_open=1000, idle_after=600)
        async with accounts.lifespan(app):
            many = [f"a{i:03d}" for i in range(100)]
            for name in [*many, "solo"]:
                await accounts.create(name)
            tp: dict[str, list[dict[str, float]]] = {"100 × 2": [], "1 × 200": []}
            for _ in range(rounds):
                tp["100 × 2"].append(await throughput(accounts, many, 2, seconds / 3, seconds))
                tp["1 × 200"].append(await throughput(accounts, ["solo"], 200, seconds / 3, seconds))
        mem = await memory(root / "memory", n_memory)
        cold = await cold_open(root / "cold", n_cold)
        accounts, app = build(root / "isolation", max_open=100, idle_after=600)
        iso: dict[str, list[dict[str, float]]] = {"other account": [], "same account": []}
        async with accounts.lifespan(app):
            for name in ("small", "large"):
                await accounts.create(name)
            for _ in range(rounds):
                iso["other account"].append(await isolation(accounts, "small", "large", seconds))
                iso["same account"].append(await isolation(accounts, "small", "small", seconds))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t = {k: {f: median([r[f] for r in rs]) for f in rs[0]} for k, rs in tp.items()}
    i = {k: {f: median([r[f] for r in rs]) for f in rs[0]} for k, rs in iso.items()}
    lines = [f"{rounds} rounds of {seconds:g} s; memory over {n_memory} accounts; cold open over {n_cold}.\n",
             "| accounts × producers | commands/s | p50 ms | p99 ms | others' cores |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {m['rate']:,.0f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['others']:.2f} |" for k, m in t.items()]
    lines += ["", f"Memory: {mem['open_kib']:.0f} KiB and {mem['open_objects']:.0f} Python objects per open account; "
              f"{mem['closed_kib']:.1f} KiB and {mem['closed_objects']:.2f} objects left per closed one.",
              f"First page: cold {cold['cold_ms']:.2f} ms (p90 {cold['cold_p90_ms']:.2f}), "
              f"warm {cold['warm_ms']:.2f} ms, {cold['cold_ms'] / cold['warm_ms']:.1f}×."]
    lines += ["", "| large writes go to | small commands' p50 ms | p99 ms |", "|---|---:|---:|"]
    lines += [f"| {k} | {m['p50']:.2f} | {m['p99']:.2f} |" for k, m in i.items()]
    figures = {"many_cmd_s": t["100 × 2"]["rate"], "one_cmd_s": t["1 × 200"]["rate"],
               "open_account_kib": mem["open_kib"], "closed_account_kib": mem["closed_kib"],
               "cold_open_ms": cold["cold_ms"],
               "isolated_p99_ms": i["other account"]["p99"], "shared_p99_ms": i["same account"]["p99"]}
    return harness.Result(figures, "\n".join(lines), {"throughput": t, "memory": mem, "cold": cold, "isolation": i})


def measure(args: argparse.Namespace) -> harness.Result:
    return asyncio.run(run(args))


if __name__ == "__main__":
    harness.main(__doc__, measure)
