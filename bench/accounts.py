"""One database per account: what many small writers cost against one big one, in process.

1. Throughput: 200 producers in a closed loop (each sends its next command once the previous
   returned) through `writer.do`, either 100 accounts x 2 producers (100 files, 100 writers)
   or 1 account x 200 producers (one file, one writer). Commands/s and the caller's p50/p99,
   rounds interleaved, medians, and the ratio of the two in the same run.
2. Memory: RSS per open account (N accounts open at once) and what a closed account leaves
   behind (RSS and live Python objects after N more accounts opened and closed).
3. Cold open: `GET /a/NAME/` (the page with its first render, through FastAPI in process) of an
   account that is closed, against the same GET once it is open.
4. Isolation: 2 producers of small commands while another producer sends large writes (a
   20,000-row insert each), either into another account or into the same one: the small
   commands' p50/p99 in both cases, and the ratio.

    python bench/accounts.py            # about a minute and a half
    python bench/accounts.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import httpx  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import HTMLResponse  # noqa: E402

from markupsafe import Markup  # noqa: E402
from conditions import OtherLoad, load_average, percentile, print_conditions  # noqa: E402
from fastapi_lith import Accounts, Command, Db, Tx  # noqa: E402

INIT = "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"


class Add(Command):
    n: int = 1

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})
        tx.touch("counter")


class Bulk(Command):
    """A large write: 20,000 rows in one command."""

    def apply(self, tx: Tx) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS bulk (x INTEGER)")
        tx.conn.executemany("INSERT INTO bulk VALUES (?)", ((i,) for i in range(20000)))
        tx.execute("DELETE FROM bulk")


async def isolation(accounts: Accounts, small: str, large: str, seconds: float) -> dict[str, float]:
    """Small commands' latency in `small` while `large` takes large writes."""
    latencies: list[float] = []
    stop = False

    async def bulk(lith: object) -> None:
        while not stop:
            await lith.writer.do(Bulk())  # type: ignore[attr-defined]

    async def producer(lith: object) -> None:
        while not stop:
            started = time.perf_counter()
            await lith.writer.do(Add())  # type: ignore[attr-defined]
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.002)

    async with accounts.use(small) as s, accounts.use(large) as big:
        tasks = [asyncio.ensure_future(bulk(big)), *(asyncio.ensure_future(producer(s)) for _ in range(2))]
        await asyncio.sleep(0.5)
        latencies.clear()
        await asyncio.sleep(seconds)
        stop = True
        await asyncio.gather(*tasks)
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "n": len(latencies)}


def build(root: Path, **kwargs: object) -> tuple[Accounts, FastAPI]:
    migrations = root / "migrations"
    migrations.mkdir(parents=True, exist_ok=True)
    (migrations / "0001_init.sql").write_text(INIT)
    accounts = Accounts(root / "accounts", migrations=migrations, same_origin_only=False, **kwargs)

    @accounts.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter"))

    app = FastAPI(lifespan=accounts.lifespan)
    accounts.install(app)

    @accounts.router.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return f"<main>{await accounts.render('counter')}</main>" + accounts.connect("counter", tab="t1")

    return accounts, app


async def throughput(accounts: Accounts, names: list[str], per_account: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    done = 0
    stop = False

    async def producer(lith: object) -> None:
        nonlocal done
        writer = lith.writer  # type: ignore[attr-defined]
        while not stop:
            started = time.perf_counter()
            await writer.do(Add())
            latencies.append(time.perf_counter() - started)
            done += 1

    async with contextlib_all(accounts, names) as liths:
        tasks = [asyncio.ensure_future(producer(lith)) for lith in liths for _ in range(per_account)]
        await asyncio.sleep(0.5)  # warm-up
        latencies.clear()
        done, other = 0, OtherLoad()
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed, count = time.perf_counter() - started, done
        cores = other.stop()
        stop = True
        await asyncio.gather(*tasks)
    ms = [x * 1000 for x in latencies]
    return {"rate": count / elapsed, "p50": percentile(ms, 50), "p99": percentile(ms, 99), "other": cores}


class contextlib_all:
    """Hold several accounts open at once."""

    def __init__(self, accounts: Accounts, names: list[str]) -> None:
        self.uses = [accounts.use(name) for name in names]

    async def __aenter__(self) -> list[object]:
        return [await use.__aenter__() for use in self.uses]

    async def __aexit__(self, *exc: object) -> None:
        for use in self.uses:
            await use.__aexit__(None, None, None)


def tracked() -> int:
    """Objects the cycle collector knows, frozen ones included (each writer start freezes)."""
    return len(gc.get_objects()) + gc.get_freeze_count()


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, seconds, n_memory, n_cold = (2, 1.5, 100, 20) if args.quick else (3, 3.0, 200, 50)
    print_conditions(loop="asyncio")
    print(f"rounds {rounds} x {seconds} s per throughput config; memory over {n_memory} accounts; "
          f"cold open over {n_cold} accounts\n")  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="bench-accounts-"))
    try:
        accounts, app = build(root, max_open=1000, idle_after=600)
        async with accounts.lifespan(app):
            many = [f"a{i:03d}" for i in range(100)]
            for name in [*many, "solo"]:
                await accounts.create(name)
            results: dict[str, list[dict[str, float]]] = {"100 x 2": [], "1 x 200": []}
            for _ in range(rounds):
                results["100 x 2"].append(await throughput(accounts, many, 2, seconds))
                results["1 x 200"].append(await throughput(accounts, ["solo"], 200, seconds))
            print("1. Throughput, 200 producers (medians)")
            print(f"  {'accounts x producers':<22}{'commands/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'other cores':>13}")
            med = {}
            for label, runs in results.items():
                med[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                m = med[label]
                print(f"  {label:<22}{m['rate']:>12,.0f}{m['p50']:>9.2f}{m['p99']:>9.2f}{m['other']:>13.2f}")
            a, b = med["100 x 2"], med["1 x 200"]
            print(f"  ratio 100x2 / 1x200: commands/s {a['rate'] / b['rate']:.2f}, p99 {a['p99'] / b['p99']:.2f}\n")
            for name in accounts.open_names():
                await accounts.close(name)

        accounts, app = build(root / "memory", max_open=10_000, idle_after=600)
        async with accounts.lifespan(app):
            names = [f"m{i:04d}" for i in range(3 * n_memory)]
            for name in names:
                await accounts.create(name)
            for name in names:  # warm: every code path and allocator arena used once
                await accounts.close(name)
            gc.collect()
            base_rss, base_objects = rss_kib(), tracked()
            async with contextlib_all(accounts, names[:n_memory]) as liths:
                for lith in liths:
                    await lith.render("counter")  # type: ignore[attr-defined]
                gc.collect()
                open_rss, open_objects = rss_kib(), tracked()
            for name in names[:n_memory]:
                await accounts.close(name)
            gc.collect()
            closed_rss, closed_objects = rss_kib(), tracked()
            for name in names[n_memory:]:  # n more opened and closed: what stays per closed one
                async with accounts.use(name):
                    pass
                await accounts.close(name)
            gc.collect()
            after_rss, after_objects = rss_kib(), tracked()
        print("2. Memory")
        print(f"  per open account     {(open_rss - base_rss) / n_memory:8.0f} KiB RSS, "
              f"{(open_objects - base_objects) / n_memory:6.0f} Python objects ({n_memory} open at once)")
        print(f"  per closed account   {(after_rss - closed_rss) / (2 * n_memory):8.1f} KiB RSS, "
              f"{(after_objects - closed_objects) / (2 * n_memory):6.2f} Python objects "
              f"(after {2 * n_memory} more opened and closed)\n")  # fmt: skip

        accounts, app = build(root / "cold", max_open=10_000, idle_after=600)
        async with accounts.lifespan(app):
            names = [f"c{i:03d}" for i in range(n_cold)]
            for name in names:
                await accounts.create(name)
                await accounts.close(name)
            transport = httpx.ASGITransport(app=app)
            cold, warm = [], []
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
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
        print("3. First page of an account (GET with its first render, in process)")
        print(f"  cold (closed)  median {statistics.median(cold):6.2f} ms  p90 {percentile(cold, 90):6.2f} ms")
        print(f"  warm (open)    median {statistics.median(warm):6.2f} ms  p90 {percentile(warm, 90):6.2f} ms")
        print(f"  ratio cold / warm {statistics.median(cold) / statistics.median(warm):.1f}\n")
        accounts, app = build(root / "isolation", max_open=100, idle_after=600)
        async with accounts.lifespan(app):
            for name in ("small", "large"):
                await accounts.create(name)
            runs: dict[str, list[dict[str, float]]] = {"other account": [], "same account": []}
            for _ in range(rounds):
                runs["other account"].append(await isolation(accounts, "small", "large", seconds))
                runs["same account"].append(await isolation(accounts, "small", "small", seconds))
        print("4. Small commands beside large writes (20,000 rows each), medians")
        print(f"  {'large writes go to':<22}{'p50 ms':>9}{'p99 ms':>9}{'commands':>10}")
        iso = {}
        for label, results in runs.items():
            iso[label] = {k: statistics.median(r[k] for r in results) for k in results[0]}
            m = iso[label]
            print(f"  {label:<22}{m['p50']:>9.2f}{m['p99']:>9.2f}{m['n']:>10.0f}")
        a, b = iso["other account"], iso["same account"]
        print(f"  ratio other / same: p50 {a['p50'] / b['p50']:.2f}, p99 {a['p99'] / b['p99']:.2f}\n")
        print("load average at the end:", load_average())
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
