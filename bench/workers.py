"""Several processes on one SQLite file: what the change feed and the writers' lock cost.

  latency   commit in process A → frame offered to a stream in process B, through the SQLite
            feed (A's writer rings B, whose hub asks `PRAGMA data_version`, then reads the new
            entries), beside the same commit → frame in A itself (bench/lib/crossing.py)
  writer    commands/s and the callers' p50/p99 through `Writer.do`, no HTTP, closed loop, each
            process counting the same window of wall-clock time:
              1x200 local   one process, 200 producers, no feed
              1x200 feed    one process, 200 producers, the SQLite feed (the default)
              2x100 feed    two processes of 100 producers, taking turns through the lock file
              2x100 busy    the same without the lock file: SQLite's busy handler (sleep-polling)
              199+1 feed    one process of 199 producers and one of 1: what the lone caller waits
              hold+1 feed   one process holding the file 20 ms per transaction, back to back, and
                            one producer of short commands in another
            configs interleave, each repeated, medians reported

    python -m bench.workers                       # about 2 minutes
    python -m bench.workers --quick --plot        # bench/plots/commit-to-frame.svg
    python -m bench.workers --configs "1x200 feed,2x100 feed" --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi_lith import Command, Feed, Lith, LocalFeed, SqliteFeed, Tx, Writer

from .lib import conditions, crossing, harness, plot
from .lib.metrics import Counts
from .lib.stats import median, percentile, ratio

ROWS = 1000
SCHEMA = f"""
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL DEFAULT 0);
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {ROWS})
INSERT INTO counter (id, count) SELECT i, 0 FROM seq;
"""
CONFIGS = {  # producers per process, the feed, the first process's command
    "1x200 local": ((200,), "local", "add"),
    "1x200 feed": ((200,), "feed", "add"),
    "2x100 feed": ((100, 100), "feed", "add"),
    "2x100 busy": ((100, 100), "busy", "add"),
    "199+1 feed": ((199, 1), "feed", "add"),
    "hold+1 feed": ((1, 1), "feed", "hold"),
}


class Add(Command):
    id: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = :id", {"id": self.id})
        tx.touch(f"counter:{self.id % 16}")


class Hold(Command):
    """A long transaction: the writer holds the file for 20 ms (a large import, say)."""

    id: int

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = :id", {"id": self.id})
        time.sleep(0.02)


class BusyFeed(SqliteFeed):
    """The SQLite feed without its lock file: writers of different processes meet in SQLite's
    busy handler, which sleeps and retries."""

    @contextmanager
    def turn(self) -> Iterator[None]:
        yield


def fresh_db(tmp: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=tmp))
    (folder / "migrations").mkdir()
    (folder / "migrations" / "0001_counter.sql").write_text(SCHEMA)
    return folder / "app.db"


async def produce(path: str, feed: str, producers: int, seconds: float, command: str) -> dict[str, Any]:
    """One process of a writer run (a child): closed-loop producers over the common window."""
    db = Path(path)
    made: Feed = LocalFeed() if feed == "local" else {"feed": SqliteFeed, "busy": BusyFeed}[feed](db)
    writer = Writer(db, migrations=db.parent / "migrations", feed=made)
    await writer.start()
    metrics = getattr(Lith(db, writer=writer), "metrics", None)  # the writer's counts, as its operator sees them
    kind = {"add": Add, "hold": Hold}[command]
    start = await crossing.window_start()
    end = start + seconds
    latencies: list[float] = []
    errors = 0
    before, cpu0 = Counts.of(metrics), time.process_time()

    async def producer(k: int) -> None:
        nonlocal errors
        rng = random.Random(k)
        while time.time() < end:
            t0 = time.perf_counter()
            try:
                await writer.do(kind(id=rng.randint(1, ROWS)))
            except Exception:  # noqa: BLE001 - counted and reported
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer(k) for k in range(producers)))
    cpu = time.process_time() - cpu0
    batches = (Counts.of(metrics) - before).get("lith_writer_batches_total", result="committed")
    closing = ""
    try:
        await writer.close()
    except Exception as exc:  # noqa: BLE001 - a finding: the other process held the file (reported)
        closing = f"{type(exc).__name__}: {exc}"
    if isinstance(made, SqliteFeed):
        await made.close()
    return {"done": len(latencies), "latencies": latencies, "errors": errors, "batches": batches, "cpu": cpu,
            "closing": closing}


def writer_run(tmp: Path, config: str, seconds: float) -> dict[str, float]:
    split, feed, first = CONFIGS[config]
    path = fresh_db(tmp)
    asyncio.run(migrate(path))  # before the processes start: on an equal footing
    answers = crossing.together("produce", [
        {"path": str(path), "feed": feed, "producers": n, "seconds": seconds, "command": first if i == 0 else "add"}
        for i, n in enumerate(split)])
    shutil.rmtree(path.parent, ignore_errors=True)
    for a in answers:
        if a["closing"]:
            print(f"  {config}: Writer.close() failed: {a['closing']}", flush=True)
    done = sum(a["done"] for a in answers)
    latencies = [x for a in answers for x in a["latencies"]]
    return {"rate": done / seconds, "p50_ms": percentile(latencies, 50) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3,
            "last_p50_ms": percentile(answers[-1]["latencies"], 50) * 1e3,
            "last_p99_ms": percentile(answers[-1]["latencies"], 99) * 1e3,
            "per_tx": done / max(1, sum(a["batches"] for a in answers)),
            "cpu_us": sum(a["cpu"] for a in answers) / max(1, done) * 1e6, "errors": sum(a["errors"] for a in answers)}


async def migrate(path: Path) -> None:
    writer = Writer(path, migrations=path.parent / "migrations")
    await writer.start()
    await writer.close()


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:.1f}" if values else "–"


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"writer configs, of: {', '.join(CONFIGS)}")
    ap.add_argument("--commits", type=int, default=300, help="commits of the latency measurement")
    ap.add_argument("--tick", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="the writer runs' window")


def measure(args: argparse.Namespace) -> harness.Result:
    commits, reps, seconds = (10, 1, 0.5) if args.smoke else (100, 1, 2.0) if args.quick \
        else (args.commits, args.reps, args.seconds)
    configs = ["2x100 feed"] if args.smoke else args.configs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-workers-"))
    try:
        path = fresh_db(tmp)
        lat = asyncio.run(crossing.commit_to_frame(str(path), path.parent / "migrations", commits, args.tick))
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
        for _ in range(reps):
            for config in configs:  # interleaved: drifting load weighs on each alike
                runs[config].append(writer_run(tmp, config, seconds))
                print(f"  {config}: {runs[config][-1]['rate']:,.0f} commands/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"Commit → frame offered, tick {args.tick * 1e3:.0f} ms, {commits} commits 20–80 ms apart "
             f"({lat['missing']} values coalesced away in B):\n",
             "| path | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|"]
    paths = (("same process (writer's subscriber)", lat["local"]), ("other process (SQLite feed)", lat["cross"]))
    for name, values in paths:
        lines.append(f"| {name} | {ms(values, 50)} | {ms(values, 95)} | {ms(values, 99)} |")
    lines += ["", f"Writer, {reps} runs of {seconds:g} s each, medians:", "",
              f"| config | commands/s | / {configs[0]} | p50 ms | p99 ms | the last process's p50 / p99 ms "
              "| per transaction | CPU µs per command | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    med = {c: {k: median([r[k] for r in rs]) for k in rs[0]} for c, rs in runs.items()}
    for c, m in med.items():
        lines.append(f"| {c} | {m['rate']:,.0f} | {ratio(m['rate'], med[configs[0]]['rate']):.2f} | {m['p50_ms']:.1f} "
                     f"| {m['p99_ms']:.1f} | {m['last_p50_ms']:.2f} / {m['last_p99_ms']:.1f} | {m['per_tx']:.0f} "
                     f"| {m['cpu_us']:.1f} | {m['errors']:.0f} |")
    if lat["closing"]:
        lines.append(f"\nAn app's shutdown failed in the latency run (the library's, not the benchmark's): "
                     f"{lat['closing']}")
    figures = {"cross_p50_ms": percentile(lat["cross"], 50) * 1e3, "cross_p95_ms": percentile(lat["cross"], 95) * 1e3,
               "local_p50_ms": percentile(lat["local"], 50) * 1e3}
    figures.update({c.replace(" ", "_").replace("+", "_") + "_cmd_s": m["rate"] for c, m in med.items()})
    return harness.Result(figures, "\n".join(lines), {"latency": lat, "writer": med})


def draw(ours: list[harness.Result], theirs: list[harness.Result], rev: str, args: argparse.Namespace) -> list[Path]:
    return [commit_to_frame_plot({"SQLite feed": ours[-1].data["latency"]}, "commit-to-frame-sqlite",
                                 f"python -m bench.workers{' --quick' if args.quick else ''} --plot")]


def commit_to_frame_plot(series: dict[str, dict[str, Any]], name: str, command: str) -> Path:
    """The distribution of commit → frame offered, in the same process and across processes."""
    fig, ax = plot.figure("Commit → frame offered, across processes (50 ms tick)", "ms", "share of commits at or under")
    for label, lat in series.items():
        for key, style in (("local", ":"), ("cross", "-")):
            values = sorted(v * 1e3 for v in lat[key])
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], style,
                        label=f"{label}: {'same process' if key == 'local' else 'other process'}")
    ax.legend(fontsize=7)
    return plot.save(fig, name, conditions.caption(command))


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments, plot=draw,
                 children={"watch": crossing.watch, "produce": produce})
