"""Several processes on one SQLite file: what the change feed and the writers' lock cost.

Two measurements, each side by side in one run, processes started by this script:

  latency   commit in process A -> frame offered to a stream in process B (through the feed:
            `PRAGMA data_version` polled at every tick, then the new entries), against the same
            commit -> frame in A itself (through the writer's subscriber), per commit. A sets a
            counter to 1, 2, 3, ... at random intervals of 20 to 80 ms; "commit" is when A's
            writer hands the committed batch back to its event loop; "offered" is when a hub
            calls `Stream.offer` with the frame showing that value. Both processes read one
            clock (CLOCK_MONOTONIC).
  writer    commands/s and the callers' p50/p99 latency through `Writer.do`, no HTTP, closed loop
            (each producer sends its next command when the previous one returned):
              1x200 local   one process, 200 producers, no feed (the writer before this change)
              1x200 feed    one process, 200 producers, the SQLite feed (the default now)
              2x100 feed    two processes of 100 producers each, taking turns through the lock file
              2x100 busy    the same without the lock file: SQLite's busy handler (sleep-polling)
              199+1 feed    one process of 199 producers, one of 1: what the lone caller waits
              199+1 busy    the same with the busy handler
              hold+1 feed   one process holding the file 20 ms per transaction, back to back, and
                            one producer of short commands in another: what it waits
              hold+1 busy   the same with the busy handler
            Each process measures the same window of wall-clock time; configs interleave, each
            repeated, medians reported.

    python bench/workers.py                    # both, about 2 minutes
    python bench/workers.py latency --commits 300
    python bench/workers.py writer --reps 3 --duration 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from markupsafe import Markup  # noqa: E402
from conditions import load_average, percentile, print_conditions  # noqa: E402
from fastapi_lith import Command, Db, Frame, Lith, Stream, Tx, Writer  # noqa: E402
from fastapi_lith.backends.sqlite.feed import SqliteFeed  # noqa: E402
from fastapi_lith.engine.feed import Feed, LocalFeed  # noqa: E402

ROWS = 1000
SCHEMA = f"""
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL DEFAULT 0);
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {ROWS})
INSERT INTO counter (id, count) SELECT i, 0 FROM seq;
"""


class Add(Command):
    id: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = ?", (self.id,))
        tx.touch(f"counter:{self.id % 16}")


class Set(Command):
    value: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = ? WHERE id = 1", (self.value,))
        tx.touch("counter")


class Hold(Command):
    """A long transaction: the writer holds the file for 20 ms (a large import, say)."""

    id: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = ?", (self.id,))
        time.sleep(0.02)


class BusyFeed(SqliteFeed):
    """The SQLite feed without the lock file: writers of different processes meet in SQLite's
    busy handler, which sleeps and retries."""

    @contextmanager
    def turn(self) -> Iterator[None]:
        yield


def fresh_db(tmp: Path) -> Path:
    folder = tmp / "migrations"
    folder.mkdir(exist_ok=True)
    (folder / "0001_counter.sql").write_text(SCHEMA)
    for old in tmp.glob("app.db*"):
        old.unlink()
    return tmp / "app.db"


def make_feed(kind: str, path: Path) -> Feed:
    return LocalFeed() if kind == "local" else {"feed": SqliteFeed, "busy": BusyFeed}[kind](path)


def child(role: str, **kwargs: Any) -> subprocess.Popen[str]:
    args = [sys.executable, __file__, f"_{role}", json.dumps(kwargs)]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=300)
    if proc.returncode:
        raise SystemExit(f"a child process failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


# -- latency ----------------------------------------------------------------------------------


class Recorder(Stream):
    """A stream that notes when the hub offers each value of the counter."""

    def __init__(self, tab: str) -> None:
        super().__init__(tab)
        self.offered: dict[int, float] = {}

    def offer(self, frame: Frame) -> bool:
        now = time.monotonic()
        value = int(frame.html.rsplit(">", 2)[-2].split("<", 1)[0])
        self.offered.setdefault(value, now)
        return super().offer(frame)


def counter_app(path: Path, tick: float) -> Lith:
    lith = Lith(path, migrations=path.parent / "migrations", tick=tick)

    @lith.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter WHERE id = 1"))

    return lith


async def _watch(path: str, tick: float, seconds: float) -> dict[str, Any]:
    """Process B: one stream on the counter, recording offers, for `seconds`."""
    lith = counter_app(Path(path), tick)
    async with lith.lifespan():
        stream = Recorder("b")
        await lith.hub.open(stream, ["counter"])
        print("ready", flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await stream.next(timeout=0.5)
    return {"offered": stream.offered}


async def latency(tmp: Path, commits: int, tick: float) -> dict[str, Any]:
    path = fresh_db(tmp)
    lith = counter_app(path, tick)
    async with lith.lifespan():  # A first: it migrates; B then finds the database ready
        watcher = child("watch", path=str(path), tick=tick, seconds=commits * 0.05 + 8)
        assert watcher.stdout is not None
        assert watcher.stdout.readline().strip() == "ready"
        local = Recorder("a")
        await lith.hub.open(local, ["counter"])
        committed: dict[int, float] = {}
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


async def _drain(stream: Stream) -> None:
    while True:
        await stream.next()


# -- writer -----------------------------------------------------------------------------------


async def _produce(path: str, feed: str, producers: int, warmup: float, duration: float,
                   command: str = "add") -> dict[str, Any]:
    """One process: `producers` closed-loop producers; counts what completes in the window.

    It says "ready" once its writer runs, and reads the window's start (wall clock) back, so
    that every process measures the same window."""
    db = Path(path)
    kind = {"add": Add, "hold": Hold}[command]
    writer = Writer(db, migrations=db.parent / "migrations", feed=make_feed(feed, db))
    await writer.start()
    print("ready", flush=True)
    start = float(await asyncio.to_thread(sys.stdin.readline)) + warmup
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    done = 0
    end = start + duration
    batches: list[int] = []
    cpu: list[float] = []  # this process's CPU time (every thread), less noisy than wall time here

    async def count_batches() -> None:
        await asyncio.sleep(max(0.0, start - time.time()))
        batches.append(writer.batches)
        cpu.append(time.process_time())
        await asyncio.sleep(max(0.0, end - time.time()))
        batches.append(writer.batches)
        cpu.append(time.process_time())

    async def producer(k: int) -> None:
        nonlocal done
        rng = random.Random(k)
        while (now := time.time()) < end:
            t0 = time.perf_counter()
            try:
                await writer.do(kind(id=rng.randint(1, ROWS)))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[str(exc)[:60]] += 1
                continue
            if now >= start:
                done += 1
                latencies.append(time.perf_counter() - t0)

    await asyncio.gather(count_batches(), *(producer(k) for k in range(producers)))
    await writer.close()
    if isinstance(writer.feed, SqliteFeed):
        await writer.feed.close()
    n = batches[1] - batches[0]
    batch_seconds = list(writer.commit_seconds)[-(writer.batches - batches[0]):][:n] if n else []
    return {"done": done, "latencies": latencies, "errors": dict(errors), "batches": n, "cpu": cpu[1] - cpu[0],
            "batch_seconds": batch_seconds}


CONFIGS = {  # producers per process, the feed, and the first process's command
    "1x200 local": ((200,), "local", "add"),
    "1x200 feed": ((200,), "feed", "add"),
    "2x100 feed": ((100, 100), "feed", "add"),
    "2x100 busy": ((100, 100), "busy", "add"),
    "199+1 feed": ((199, 1), "feed", "add"),
    "199+1 busy": ((199, 1), "busy", "add"),
    "hold+1 feed": ((1, 1), "feed", "hold"),
    "hold+1 busy": ((1, 1), "busy", "hold"),
}


def writer_run(tmp: Path, config: str, duration: float, warmup: float) -> dict[str, Any]:
    split, feed, first = CONFIGS[config]
    path = fresh_db(tmp)
    # Migrate first, so that the processes start on an equal footing.
    asyncio.run(_migrate(path))
    procs = [child("produce", path=str(path), feed=feed, producers=n, warmup=warmup,
                   duration=duration, command=first if i == 0 else "add") for i, n in enumerate(split)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    start = f"{time.time()}\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(start)
        proc.stdin.flush()
    results = [answer(p) for p in procs]
    latencies = [x for r in results for x in r["latencies"]]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    return {
        "rate": sum(r["done"] for r in results) / duration,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "errors": dict(errors),
        "batch_p50_ms": percentile([x for r in results for x in r["batch_seconds"]], 50) * 1e3,
        "batch_p99_ms": percentile([x for r in results for x in r["batch_seconds"]], 99) * 1e3,
        "cpu_us": sum(r["cpu"] for r in results) / max(1, sum(r["done"] for r in results)) * 1e6,
        # The last process's callers alone: with 199 + 1, the one producer beside a busy writer.
        "last_p50_ms": percentile(results[-1]["latencies"], 50) * 1e3,
        "last_p99_ms": percentile(results[-1]["latencies"], 99) * 1e3,
        "per_tx": sum(r["done"] for r in results) / max(1, sum(r["batches"] for r in results)),
        "shares": [round(r["done"] / max(1, sum(x["done"] for x in results)), 2) for r in results],
    }


async def _migrate(path: Path) -> None:
    writer = Writer(path, migrations=path.parent / "migrations")
    await writer.start()
    await writer.close()


# -- main -------------------------------------------------------------------------------------


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
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--tick", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    print_conditions(loop="asyncio")
    tmp = Path(tempfile.mkdtemp(prefix="lith-workers-"))
    try:
        if args.what in ("latency", "both"):
            r = asyncio.run(latency(tmp, args.commits, args.tick))
            print(f"\n## Latency, commit -> frame offered (tick {args.tick * 1e3:.0f} ms, {r['commits']} commits "
                  f"20-80 ms apart; {r['missing']} values coalesced away in B)\n")
            print("| path | p50 ms | p95 ms | p99 ms | max ms |")
            print("|---|---:|---:|---:|---:|")
            for name, values in (("same process (writer subscriber)", r["local"]),
                                 ("other process (feed poll)", r["cross"])):
                top = f"{max(values) * 1e3:.1f}" if values else "-"
                print(f"| {name} | {ms(values, 50)} | {ms(values, 95)} | {ms(values, 99)} | {top} |")
        if args.what in ("writer", "both"):
            configs = args.configs.split(",")
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
            for _ in range(args.reps):
                for config in configs:  # interleaved, so drifting load hits each alike
                    runs[config].append(writer_run(tmp, config, args.duration, args.warmup))
            print(f"\n## Writer, 200 producers, {args.reps} runs of {args.duration:.0f} s each, medians\n")
            print(f"| config | commands/s | ratio to {configs[0]} | p50 ms | p99 ms | commands per transaction "
                  "| batch p50 / p99 ms (waiting for the turn included) | CPU µs per command | errors |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
            base = statistics.median(r["rate"] for r in runs[configs[0]])
            for config in configs:
                rate = statistics.median(r["rate"] for r in runs[config])
                p50 = statistics.median(r["p50_ms"] for r in runs[config])
                p99 = statistics.median(r["p99_ms"] for r in runs[config])
                errors: Counter[str] = Counter()
                for r in runs[config]:
                    errors.update(r["errors"])
                per_tx = statistics.median(r["per_tx"] for r in runs[config])
                b50 = statistics.median(r["batch_p50_ms"] for r in runs[config])
                b99 = statistics.median(r["batch_p99_ms"] for r in runs[config])
                print(f"| {config} | {rate:,.0f} | {rate / base:.2f} | {p50:.1f} | {p99:.1f} | {per_tx:.0f} | "
                      f"{b50:.2f} / {b99:.1f} | {statistics.median(r['cpu_us'] for r in runs[config]):.1f} | "
                      f"{sum(errors.values())} {dict(errors) or ''} |")
            print("\nper run (commands/s):", {c: [round(r["rate"]) for r in runs[c]] for c in configs})
            lone = [c for c in configs if "+1 " in c]
            if lone:
                print("\nThe one producer of the second process, beside 199 producers or one 20 ms "
                      "transaction after another in the first (p50 / p99 ms, medians):",
                      {c: f"{statistics.median(r['last_p50_ms'] for r in runs[c]):.2f} / "
                          f"{statistics.median(r['last_p99_ms'] for r in runs[c]):.1f}" for c in lone})
            print("per run, each process's share of the commands:", {c: [r["shares"] for r in runs[c]] for c in configs})
        print("\nload average at the end:", load_average())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
