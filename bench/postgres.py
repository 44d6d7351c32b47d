"""The app on PostgreSQL: the writer against a naive route, and the NOTIFY feed's latency.

On one server (bench/lib/pg.py: a throwaway cluster with PostgreSQL's durable defaults, or
`LITH_PG_URL`), processes started by this script:

  writer    commands/s and the callers' p50/p99, no HTTP, closed loop; each command inserts one
            row and updates one of 1,000 counter rows:
              naive 1x200  one process, 200 producers, each command one async transaction
                           (`async with engine.begin()`, SQLAlchemy + psycopg, its default pool):
                           what a plain FastAPI route does per request
              lith 1x200   one process, 200 producers, `Writer.do` (batches, savepoints, NOTIFY)
              lith 2x100   two processes of 100 producers each, one writer each
            every acknowledged command is checked in the database afterwards
  latency   commit in process A → frame offered to a stream in process B (NOTIFY, B's
            listener, B's hub), beside commit → frame in A itself

    python -m bench.postgres                  # about a minute
    python -m bench.postgres --quick --plot   # bench/plots/commit-to-frame-postgres.svg
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi_lith import Command, Lith, Tx

from .lib import crossing, harness
from .lib.pg import Postgres
from .lib.proc import Window
from .lib.stats import median, percentile, ratio
from .workers import commit_to_frame_plot

ROWS = 1000
SCHEMA = f"""
CREATE TABLE counter (id integer PRIMARY KEY, count integer NOT NULL DEFAULT 0);
INSERT INTO counter (id) SELECT generate_series(1, {ROWS});
CREATE TABLE event (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, counter_id integer NOT NULL,
                    at double precision NOT NULL);
"""
INSERT = "INSERT INTO event (counter_id, at) VALUES (:id, :at)"
UPDATE = "UPDATE counter SET count = count + 1 WHERE id = :id"
COUNTS = "SELECT (SELECT count(*) FROM event), (SELECT sum(count) FROM counter)"
CONFIGS = ("naive 1x200", "lith 1x200", "lith 2x100")


class Add(Command):
    id: int

    def apply(self, tx: Tx) -> None:
        tx.execute(INSERT, {"id": self.id, "at": time.time()})
        tx.execute(UPDATE, {"id": self.id})
        tx.touch(f"counter:{self.id % 16}")


async def produce(url: str, migrations: str, kind: str, producers: int, seconds: float) -> dict[str, Any]:
    """One process of a writer run (a child): closed-loop producers over the common window."""
    if kind == "naive":
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(url)
        insert, update = text(INSERT), text(UPDATE)

        async def send(i: int) -> None:
            async with engine.begin() as conn:  # one transaction per request, as a route would
                await conn.execute(insert, {"id": i, "at": time.time()})
                await conn.execute(update, {"id": i})

        async def close() -> None:
            await engine.dispose()
    else:
        lith = Lith(url, migrations=migrations)
        await lith.writer.start()
        await lith.feed.start(lith.writer)

        async def send(i: int) -> None:
            await lith.writer.do(Add(id=i))

        async def close() -> None:
            await lith.writer.close()
            await lith.feed.close()

    start = await crossing.window_start()
    end = start + seconds
    latencies: list[float] = []
    errors = 0
    rng = random.Random()

    async def producer() -> None:
        nonlocal errors
        while time.time() < end:
            t0 = time.perf_counter()
            try:
                await send(rng.randrange(1, ROWS + 1))
            except Exception:  # noqa: BLE001 - counted: a caller that got an error
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer() for _ in range(producers)))
    await close()
    return {"done": len(latencies), "latencies": latencies, "errors": errors}


def fresh(pg: Postgres, migrations: Path) -> str:
    """A new database, migrated as the app would: the naive route finds the same tables."""
    url = pg.create_database()
    asyncio.run(migrate(url, migrations))
    return url


async def migrate(url: str, migrations: Path) -> None:
    lith = Lith(url, migrations=migrations)
    await lith.writer.start()
    await lith.writer.close()


def writer_run(pg: Postgres, migrations: Path, config: str, seconds: float, smoke: bool) -> dict[str, float]:
    kind, shape = config.split()
    processes, producers = (int(x) for x in shape.split("x"))
    producers = 10 if smoke else producers
    url = fresh(pg, migrations)
    window = Window.open(pg.postmaster) if pg.postmaster else None
    answers = crossing.together("produce", [{"url": url, "migrations": str(migrations), "kind": kind,
                                             "producers": producers, "seconds": seconds}] * processes)
    cost = window.close() if window else None
    import psycopg

    with psycopg.connect(pg.dsn(url)) as conn:  # every acknowledged command there, once
        events, counted = conn.execute(COUNTS).fetchone() or (0, 0)
    done = sum(a["done"] for a in answers)
    if not events == counted or events < done:
        raise SystemExit(f"{config}: {done} commands answered, {events} events and {counted} counts written")
    latencies = [x for a in answers for x in a["latencies"]]
    # The server's CPU over the whole run (its processes' start included) per command answered.
    db_us = cost.cores * cost.seconds / done * 1e6 if cost and done else float("nan")
    return {"rate": done / seconds, "p50_ms": percentile(latencies, 50) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3,
            "errors": float(sum(a["errors"] for a in answers)), "db_us": db_us}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--tick", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="the writer runs' window")


def measure(args: argparse.Namespace) -> harness.Result:
    commits, reps, seconds = (10, 1, 0.5) if args.smoke else (100, 1, 2.0) if args.quick \
        else (args.commits, args.reps, args.seconds)
    configs = CONFIGS[:2] if args.smoke else CONFIGS
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-postgres-"))
    (tmp / "migrations").mkdir()
    (tmp / "migrations" / "0001_counter.sql").write_text(SCHEMA)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    try:
        with Postgres() as pg:
            lat = asyncio.run(crossing.commit_to_frame(pg.create_database(), tmp / "migrations", commits, args.tick))
            for rep in range(reps):
                for config in configs if rep % 2 == 0 else configs[::-1]:
                    runs[config].append(writer_run(pg, tmp / "migrations", config, seconds, args.smoke))
                    print(f"  {config}: {runs[config][-1]['rate']:,.0f} commands/s", flush=True)
            server = pg.described
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {c: {k: median([r[k] for r in rs]) for k in rs[0]} for c, rs in runs.items()}
    naive = med["naive 1x200"]["rate"]
    lines = [f"Server: {server}.\n", f"Commit → frame offered, tick {args.tick * 1e3:.0f} ms, {commits} commits "
             f"({lat['missing']} values coalesced away in B):\n",
             "| path | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|"]
    for name, values in (("A → A (writer's subscriber)", lat["local"]), ("A → B (NOTIFY)", lat["cross"])):
        lines.append(f"| {name} | " + " | ".join(f"{percentile(values, q) * 1e3:.1f}" for q in (50, 95, 99)) + " |")
    lines += ["", f"Writer, {reps} runs of {seconds:g} s each, medians:", "",
              "| config | commands/s | × naive | p50 ms | p99 ms | server CPU µs per command | errors |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for c, m in med.items():
        lines.append(f"| {c} | {m['rate']:,.0f} | {ratio(m['rate'], naive):.1f} | {m['p50_ms']:.1f} "
                     f"| {m['p99_ms']:.1f} | {m['db_us']:.0f} | {m['errors']:.0f} |")
    if lat["closing"]:
        lines.append(f"\nAn app's shutdown failed in the latency run (the library's, not the benchmark's): "
                     f"{lat['closing']}")
    figures = {"notify_p50_ms": percentile(lat["cross"], 50) * 1e3, "notify_p95_ms": percentile(lat["cross"], 95) * 1e3}
    figures.update({c.replace(" ", "_") + "_cmd_s": m["rate"] for c, m in med.items()})
    return harness.Result(figures, "\n".join(lines), {"latency": lat, "writer": med})


def draw(ours: list[harness.Result], theirs: list[harness.Result], rev: str, args: argparse.Namespace) -> list[Path]:
    return [commit_to_frame_plot({"NOTIFY": ours[-1].data["latency"]}, "commit-to-frame-postgres",
                                 f"python -m bench.postgres{' --quick' if args.quick else ''} --plot")]


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments, plot=draw,
                 children={"watch": crossing.watch, "produce": produce})
