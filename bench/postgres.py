"""The app on PostgreSQL: the writer against a naive route, and the NOTIFY feed's latency.

Side by side in one run, processes started by this script, on one server (a throwaway cluster
with PostgreSQL's default, durable settings unless LITH_PG_URL names one):

  writer    commands/s and the callers' p50/p99 latency, no HTTP, closed loop (each producer
            sends its next command when the previous one returned); each command inserts one
            row and updates one of 1000 counter rows:
              naive 1x200  one process, 200 producers, each command one async transaction
                           (`async with engine.begin()`, SQLAlchemy + psycopg, its default pool
                           of 5 + 10 connections): what a plain FastAPI route does per request
              lith 1x200   one process, 200 producers, `Writer.do` (batches, savepoints, NOTIFY)
              lith 2x100   two processes of 100 producers each, one writer each
              old ...      with --old DIR: lith's configs run by another checkout's code (its
                           own .venv), e.g. the last release, for new against old in one run
              ... 1x1      with --single: one producer, the latency of a lone command
            with --refuse SHARE that share of the commands raises after writing (rolled back).
            configs interleave, each repeated, medians reported.
  latency   commit in process A -> frame offered to a stream in process B (NOTIFY, B's listener,
            B's next tick), against commit -> frame in A itself, per commit; A sets a counter
            to 1, 2, 3, ... 20 to 80 ms apart. Both read one clock (CLOCK_MONOTONIC).

    python bench/postgres.py                     # both, about 1 minute
    python bench/postgres.py writer --reps 3 --duration 3
    python bench/postgres.py writer --old ../old-checkout --single
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The library's code: this checkout's, or another's for the "old" configs (see --old).
CODE = Path(os.environ.get("LITH_BENCH_CODE") or ROOT)
sys.path[:0] = [str(CODE), str(HERE), str(ROOT)]

from markupsafe import Markup  # noqa: E402
from conditions import load_average, percentile, print_conditions  # noqa: E402
from fastapi_lith import Command, Db, Frame, Lith, Stream, Tx  # noqa: E402

ROWS = 1000
SCHEMA = f"""
CREATE TABLE counter (id integer PRIMARY KEY, count integer NOT NULL DEFAULT 0);
INSERT INTO counter (id) SELECT generate_series(1, {ROWS});
CREATE TABLE event (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, counter_id integer NOT NULL, at double precision NOT NULL);
"""
INSERT = "INSERT INTO event (counter_id, at) VALUES (%s, %s)"
UPDATE = "UPDATE counter SET count = count + 1 WHERE id = %s"
CONFIGS = ("naive 1x200", "lith 1x200", "lith 2x100")


class Refused(Exception):
    """The answer of a command told to fail after it wrote (--refuse)."""


class Add(Command):
    id: int
    refuse: bool = False

    def apply(self, tx: Tx) -> None:
        tx.execute(INSERT, (self.id, time.time()))
        tx.execute(UPDATE, (self.id,))
        tx.touch(f"counter:{self.id % 16}")
        if self.refuse:  # after writing: its savepoint must undo both statements
            raise Refused("refused")


class Set(Command):
    value: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = %s WHERE id = 1", (self.value,))
        tx.touch("counter")


def migrations(tmp: Path) -> Path:
    folder = tmp / "migrations"
    folder.mkdir(exist_ok=True)
    (folder / "0001_counter.sql").write_text(SCHEMA)
    return folder


def child(role: str, code: Path | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    """This script in a new process; with `code`, on that checkout's library and .venv."""
    python, env = sys.executable, None
    if code is not None:
        python, env = str(code / ".venv" / "bin" / "python"), {**os.environ, "LITH_BENCH_CODE": str(code)}
    args = [python, __file__, f"_{role}", json.dumps(kwargs)]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=300)
    if proc.returncode:
        raise SystemExit(f"a child process failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


# -- writer -----------------------------------------------------------------------------------


def fresh(server: Any, folder: Path) -> str:
    """A new database, migrated as the app would: the naive route finds the same tables."""
    from fastapi_lith.backends.postgres.db import migrate, open_postgres

    url = server.create_database("bench")
    with open_postgres(url) as conn:
        migrate(conn, folder)
    return url


async def _produce(url: str, folder: str, kind: str, producers: int, start: float, warmup: float,
                   duration: float, refuse: float = 0.0) -> dict[str, Any]:
    """One process: `producers` closed-loop producers; counts what completes in the window, a
    command refused on purpose (a share `refuse` of them) as one answered."""
    if kind == "naive":
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(url)
        insert = text("INSERT INTO event (counter_id, at) VALUES (:id, :at)")
        update = text("UPDATE counter SET count = count + 1 WHERE id = :id")

        async def send(i: int, refuse: bool) -> None:
            async with engine.begin() as conn:  # one transaction per request, as a route would
                await conn.execute(insert, {"id": i, "at": time.time()})
                await conn.execute(update, {"id": i})
                if refuse:
                    raise Refused("refused")

        close = engine.dispose
    else:
        lith = Lith(url, migrations=folder)
        await lith.writer.start()
        await lith.feed.start(lith.writer)

        async def send(i: int, refuse: bool) -> None:
            await lith.writer.do(Add(id=i, refuse=refuse))

        async def close() -> None:
            await lith.writer.close()
            await lith.feed.close()

    begin, end = start + warmup, start + warmup + duration
    latencies: list[float] = []
    errors = acknowledged = 0
    rng = random.Random()

    async def producer() -> None:
        nonlocal errors, acknowledged
        while time.time() < end:
            t0 = time.time()
            try:
                await send(rng.randrange(1, ROWS + 1), rng.random() < refuse)
                acknowledged += 1
            except Refused:
                pass
            except Exception:  # noqa: BLE001 - counted: a caller that got an error
                errors += 1
                continue
            t1 = time.time()
            if begin <= t0 and t1 <= end:
                latencies.append(t1 - t0)

    await asyncio.sleep(max(0.0, start - time.time()))
    await asyncio.gather(*(producer() for _ in range(producers)))
    await close()
    return {"done": len(latencies), "latencies": sorted(latencies), "errors": errors, "acknowledged": acknowledged}


def writer_run(url: str, folder: Path, config: str, duration: float, warmup: float,
               old: Path | None, refuse: float) -> dict[str, Any]:
    kind, shape = config.split()
    processes, producers = (int(x) for x in shape.split("x"))
    code = old if kind == "old" else None
    start = time.time() + 3  # every process imported and connected before the window
    procs = [child("produce", code, url=url, folder=str(folder), kind="lith" if kind == "old" else kind,
                   producers=producers, start=start, warmup=warmup, duration=duration, refuse=refuse)
             for _ in range(processes)]
    results = [answer(p) for p in procs]
    from fastapi_lith.backends.postgres.db import open_postgres

    with open_postgres(url) as conn:  # every acknowledged command there, once: a check, not a timing
        events, counted = conn.execute("SELECT (SELECT count(*) FROM event), (SELECT sum(count) FROM counter)").fetchone()
    acknowledged = sum(r["acknowledged"] for r in results)
    if not events == counted == acknowledged:
        raise SystemExit(f"{config}: {acknowledged} commands acknowledged, {events} events and {counted} counts written")
    latencies = sorted(x for r in results for x in r["latencies"])
    return {"rate": sum(r["done"] for r in results) / duration, "latencies": latencies,
            "errors": sum(r["errors"] for r in results)}


# -- latency ----------------------------------------------------------------------------------


class Recorder(Stream):
    """A stream that notes when the hub offers each value of the counter."""

    def __init__(self, tab: str) -> None:
        super().__init__(tab)
        self.offered: dict[int, float] = {}

    def offer(self, frame: Frame) -> bool:
        value = int(frame.html.rsplit(">", 2)[-2].split("<", 1)[0])
        self.offered.setdefault(value, time.monotonic())
        return super().offer(frame)


def counter_app(url: str, folder: str, tick: float) -> Lith:
    lith = Lith(url, migrations=folder, tick=tick)

    @lith.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter WHERE id = 1"))

    return lith


async def _watch(url: str, folder: str, tick: float, seconds: float) -> dict[str, Any]:
    lith = counter_app(url, folder, tick)
    async with lith.lifespan():
        stream = Recorder("b")
        await lith.hub.open(stream, ["counter"])
        print("ready", flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await stream.next(timeout=0.5)
    return {"offered": stream.offered}


async def _drain(stream: Stream) -> None:
    while True:
        await stream.next()


async def latency(url: str, folder: Path, commits: int, tick: float) -> dict[str, Any]:
    lith = counter_app(url, str(folder), tick)
    async with lith.lifespan():
        watcher = child("watch", url=url, folder=str(folder), tick=tick, seconds=commits * 0.05 + 8)
        assert watcher.stdout is not None
        assert watcher.stdout.readline().strip() == "ready"
        local = Recorder("a")
        await lith.hub.open(local, ["counter"])
        committed: dict[int, float] = {}
        value = 0
        lith.writer.subscribe(lambda topics: committed.setdefault(value, time.monotonic()))
        taking = asyncio.create_task(_drain(local))
        rng = random.Random(13)
        for value in range(1, commits + 1):
            await lith.writer.do(Set(value=value))
            await asyncio.sleep(rng.uniform(0.02, 0.08))
        await asyncio.sleep(1)
        taking.cancel()
    offered_b = {int(k): v for k, v in answer(watcher)["offered"].items()}
    cross = [offered_b[v] - t for v, t in committed.items() if v in offered_b]
    here = [local.offered[v] - t for v, t in committed.items() if v in local.offered]
    return {"commits": commits, "cross": cross, "local": here, "missing": commits - len(cross)}


# -- main -------------------------------------------------------------------------------------


def git_rev(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:.1f}" if values else "-"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1].startswith("_"):  # a child process
        kwargs = json.loads(sys.argv[2])
        fn = {"_watch": _watch, "_produce": _produce}[sys.argv[1]]
        print(json.dumps(asyncio.run(fn(**kwargs))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", choices=["latency", "writer", "both"], default="both")
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--tick", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--old", default="", metavar="DIR",
                        help="also run lith's configs on another checkout's code and .venv (read only)")
    parser.add_argument("--single", action="store_true", help="also one producer: a lone command's latency")
    parser.add_argument("--refuse", type=float, default=0.0, metavar="SHARE",
                        help="this share of the commands fails after writing (0.01: one in a hundred)")
    args = parser.parse_args()
    from tests.support import pgcluster

    server = pgcluster.Existing(os.environ["LITH_PG_URL"]) if os.environ.get("LITH_PG_URL") else pgcluster.Cluster(durable=True)
    print_conditions(loop="asyncio")
    print("  server: PostgreSQL", "(LITH_PG_URL)" if os.environ.get("LITH_PG_URL") else "(a throwaway cluster, default durable settings: fsync on, synchronous_commit on)")
    tmp = Path(tempfile.mkdtemp(prefix="lith-pg-bench-"))
    folder = migrations(tmp)
    try:
        if args.what in ("latency", "both"):
            url = server.create_database("bench")
            r = asyncio.run(latency(url, folder, args.commits, args.tick))
            print(f"\n## Latency, commit -> frame offered (tick {args.tick * 1e3:.0f} ms, {r['commits']} commits "
                  f"20-80 ms apart; {r['missing']} values coalesced away in B)\n")
            print("| path | p50 ms | p95 ms | p99 ms | max ms |")
            print("|---|---:|---:|---:|---:|")
            for name, values in (("A -> A (writer's subscriber)", r["local"]), ("A -> B (NOTIFY)", r["cross"])):
                print(f"| {name} | {ms(values, 50)} | {ms(values, 95)} | {ms(values, 99)} | {ms(values, 100)} |")
        if args.what in ("writer", "both"):
            old = Path(args.old).resolve() if args.old else None
            configs = [c for c in CONFIGS]
            if old is not None:
                configs[1:1] = ["old 1x200"]
                configs.append("old 2x100")
                print(f"  old:    {old.name} at {git_rev(old)}, new: {ROOT.name} at {git_rev(ROOT)}")
            if args.single:
                configs += ["naive 1x1"] + (["old 1x1"] if old else []) + ["lith 1x1"]
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
            for rep in range(args.reps):
                order = configs if rep % 2 == 0 else configs[::-1]
                for config in order:
                    url = fresh(server, folder)  # each run on a fresh database
                    runs[config].append(writer_run(url, folder, config, args.duration, args.warmup, old, args.refuse))
            refused = f", {args.refuse:.1%} of the commands failing after they wrote" if args.refuse else ""
            print(f"\n## Writer, {args.reps} runs each of {args.duration:.0f} s, medians{refused}\n")
            print("| config | commands/s | x naive | x naive, each rep | x old | p50 ms | p99 ms | errors |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            def rate_of(config: str) -> float:
                return statistics.median(r["rate"] for r in runs[config]) if config in runs else 0.0

            for config in configs:
                shape = config.split()[1]
                rate = rate_of(config)
                naive = "naive 1x1" if shape == "1x1" else "naive 1x200"  # the same producers
                base = rate_of(naive)
                # Rep by rep (the configs of a rep ran minutes apart at most): how far the ratio moves.
                each = sorted(r["rate"] / n["rate"] for r, n in zip(runs[config], runs[naive]) if n["rate"])
                spread = f"{each[0]:.1f}-{each[-1]:.1f}" if each and config != naive else "-"
                before = rate_of(f"old {shape}")
                p50 = statistics.median(percentile(r["latencies"], 50) for r in runs[config]) * 1e3
                p99 = statistics.median(percentile(r["latencies"], 99) for r in runs[config]) * 1e3
                errors = sum(r["errors"] for r in runs[config])
                vs_naive = f"{rate / base:.1f}" if base else "-"
                vs_old = f"{rate / before:.2f}" if before and not config.startswith(("old", "naive")) else "-"
                print(f"| {config} | {rate:,.0f} | {vs_naive} | {spread} | {vs_old} | {p50:.1f} | {p99:.1f} | {errors} |")
        print("\nload average at the end:", load_average())
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
