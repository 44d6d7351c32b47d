"""The writer benchmark: commands per second through `Writer.do`, in process, no HTTP.

One command = one `UPDATE counter SET count = count + :n WHERE id = :id` over 1,000 counter rows
(the id chosen per command), applied in its own savepoint, sent by `await writer.do(cmd)` with a
Pydantic `Command` built per call, as a request handler would. P producers each send their next
command as soon as the previous one returned (a closed loop), for P in {1, 50, 200} and
`synchronous` in {NORMAL, FULL}. Beside ours, in the same run:

  floor      the same SQL on raw sqlite3 in one thread: SAVEPOINT/UPDATE/RELEASE per command,
             COMMIT per 512, one cursor (what the writer thread could do with no Python around it)
  naive      what a user would otherwise write: one transaction per command through SQLAlchemy's
             async engine on aiosqlite (`async with engine.begin() as conn: await conn.execute()`)
  cache off  ours with `statement_cache=False`
  uvloop     ours on uvloop (uvicorn's loop when installed); the default asyncio loop is the
             main figure

Each measurement runs in a fresh database file, warm-up first, then a fixed window; each config
is repeated (interleaved with the others) and the medians are reported.

    python bench/writer.py                 # about 3 minutes
    python bench/writer.py --quick         # about 1 minute
    python bench/writer.py --producers 1,200 --sync NORMAL --only ours,floor
    python bench/writer.py --json a.json; python bench/writer.py --json b.json
    python bench/writer.py --merge a.json b.json          # medians over both (noisy machines)
    python bench/writer.py --only ours,gcfreeze,looponly,looponly_uv --producers 200   # diagnostics
    python bench/writer.py --profile       # py-spy at 200 producers, NORMAL: where the time goes

Beside throughput and the caller's latency it reports CPU per command split by thread (event
loop / writer, from the threads' CPU clocks), the share of time in the cyclic GC, and how many
cores other processes kept busy during each window (the noise beside each figure).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import sqlalchemy as sa  # noqa: E402
from pydantic import Field  # noqa: E402

from conditions import (  # noqa: E402
    OtherLoad, load_average, one_line, percentile, print_conditions, wait_for_quiet,
)
from fastapi_lith import Command, TabCommand, Tx, Writer  # noqa: E402
from fastapi_lith.engine.statements import compile_statement  # noqa: E402
from fastapi_lith.engine.store import Batch  # noqa: E402

try:
    import uvloop
except ImportError:  # pragma: no cover - optional
    uvloop = None

ROWS = 1000
BATCH = 512  # the floor's commands per COMMIT, the writer's default batch_size
SAMPLE_EVERY = 4  # caller latency: every 4th command of each producer (power of two)

counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = (
    counter.update()
    .where(counter.c.id == sa.bindparam("cid"))
    .values(count=counter.c.count + sa.bindparam("n"))
)
_COMPILED = compile_statement(ADD)
ADD_SQL = _COMPILED.sql  # what the writer runs: the floor runs the very same text
ADD_ORDER = tuple(_COMPILED.compiled.positiontup or ())

SCHEMA = f"""
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL DEFAULT 0);
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {ROWS})
INSERT INTO counter (id, count) SELECT i, 0 FROM seq;
"""

# The ids every variant walks through: the same sequence, drawn once, so choosing an id costs
# the same (an index) everywhere.
_IDS_MASK = (1 << 16) - 1
_rng = random.Random(20261129)
IDS = [_rng.randint(1, ROWS) for _ in range(_IDS_MASK + 1)]
del _rng


class Add(Command):
    id: int = Field(ge=1, le=ROWS)
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"cid": self.id, "n": self.n})
        tx.touch("counter")


class KeyedAdd(Add):
    """`Add` as a page sends it: its `tab` and `op` make an idempotency key, so the writer
    looks the key up and records the outcome beside the UPDATE (the `keyed` variant)."""

    tab: str
    op: int


class TabAdd(TabCommand):
    """`Add` as a `TabCommand`: keyed like `KeyedAdd`, and each records its tab's outcome (the
    message its outcome view shows) in the library's `lith_tab` (the `tab` variant)."""

    id: int = Field(ge=1, le=ROWS)
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"cid": self.id, "n": self.n})
        tx.touch("counter")
        self.say("Added.")


# -- helpers ----------------------------------------------------------------------------------


class GcClock:
    """Time spent in the cyclic garbage collector while measuring, per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self.longest = 0.0
        self._t0 = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.on:
            took = time.perf_counter() - self._t0
            g = info["generation"]
            self.seconds[g] += took
            self.count[g] += 1
            self.longest = max(self.longest, took)

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class Phase:
    __slots__ = ("running", "measuring", "done")

    def __init__(self) -> None:
        self.running = True
        self.measuring = False
        self.done = 0


def fresh_db(tmp: Path, name: str, *, migrations: bool) -> Path:
    """A fresh folder for one measurement: the db path, and the migration that builds it."""
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    if migrations:
        (folder / "migrations").mkdir()
        (folder / "migrations" / "0001_counter.sql").write_text(SCHEMA)
    else:
        conn = sqlite3.connect(folder / "bench.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(SCHEMA)
        conn.close()
    return folder / "bench.db"


def check_total(path: Path, expected_at_least: int) -> None:
    """Every command the run counted is in the file (the benchmark measures real writes)."""
    conn = sqlite3.connect(path)
    total = conn.execute("SELECT sum(count) FROM counter").fetchone()[0] or 0
    conn.close()
    if total < expected_at_least:
        raise AssertionError(f"{path}: {total} increments in the file, {expected_at_least} counted")


# -- ours ---------------------------------------------------------------------------------------


def _no_database(batch: Batch) -> None:
    """Stands in for the store's `run` in the `looponly` diagnostic: no SQL, only the hop."""
    batch.topics = frozenset(("counter",))


async def _ours(path: Path, sync: str, producers: int, cache: bool, warmup: float, duration: float,
                gclock: GcClock, loop_only: bool = False, keyed: bool = False, tabbed: bool = False) -> dict[str, Any]:
    writer = Writer(path, migrations=path.parent / "migrations", synchronous=sync, statement_cache=cache)
    await writer.start()
    if loop_only:  # diagnostic: what the event loop side alone allows (the batch hop stays)
        writer.store.run = _no_database  # type: ignore[method-assign]
    writer_clock = writer_thread_clock(writer)
    phase = Phase()
    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def producer(k: int) -> None:
        do, pc, ids, sample = writer.do, time.perf_counter, IDS, latencies.append
        i = k * 7919
        j = k
        tab = f"tab{k}"
        while phase.running:
            # Built per call, as a request handler would; keyed: a new op per command, as a page's.
            cmd = (TabAdd if tabbed else KeyedAdd)(id=ids[i & _IDS_MASK], n=1, tab=tab, op=j + 1) if keyed \
                else Add(id=ids[i & _IDS_MASK], n=1)
            i += 1
            j += 1
            try:
                if j & (SAMPLE_EVERY - 1) or not phase.measuring:
                    await do(cmd)
                else:
                    t0 = pc()
                    await do(cmd)
                    sample(pc() - t0)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[type(exc).__name__] += 1

    tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
    await asyncio.sleep(warmup)
    gclock.on = True
    c0, b0 = writer.commands, writer.batches
    w0, l0 = thread_cpu(writer_clock), time.thread_time()
    cpu0, t0, others = time.process_time(), time.perf_counter(), OtherLoad()
    phase.measuring = True
    await asyncio.sleep(duration)
    phase.measuring = False
    t1, cpu1, other_cores = time.perf_counter(), time.process_time(), others.stop()
    w1, l1 = thread_cpu(writer_clock), time.thread_time()
    gclock.on = False
    c1, b1 = writer.commands, writer.batches
    batch_seconds = list(writer.commit_seconds)[-(b1 - b0):] if b1 > b0 else []
    phase.running = False
    await asyncio.gather(*tasks)
    await writer.close()  # also ends the writer's thread: the bench makes many writers
    if not loop_only:
        check_total(path, c1)
    n, elapsed = c1 - c0, t1 - t0
    return {
        "cmds": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "per_tx": n / (b1 - b0) if b1 > b0 else float("nan"),
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "batch_p50_ms": percentile(batch_seconds, 50) * 1e3,
        "cpu_us": (cpu1 - cpu0) / n * 1e6 if n else float("nan"),
        "other_cores": other_cores,
        "gc_share": sum(gclock.seconds) / elapsed,
        "gc_longest_ms": gclock.longest * 1e3,
        "gc_full": gclock.count[2],
        "loop_cpu_us": (l1 - l0) / n * 1e6 if n else float("nan"),
        "writer_cpu_us": (w1 - w0) / n * 1e6 if n and writer_clock is not None else float("nan"),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
    }


def writer_thread_clock(writer: Writer) -> int | None:
    """The CPU clock of the writer's thread (its one `lith-writer` thread)."""
    pool = getattr(writer, "_thread", None)
    threads = list(getattr(pool, "_threads", ()) or ())
    if not threads:
        threads = [t for t in threading.enumerate() if t.name.startswith("lith-writer") and t.is_alive()]
    if len(threads) != 1 or threads[0].ident is None:
        return None
    try:
        return time.pthread_getcpuclockid(threads[0].ident)
    except (AttributeError, OSError):
        return None


def thread_cpu(clock: int | None) -> float:
    return time.clock_gettime(clock) if clock is not None else float("nan")


def run_ours(path: Path, sync: str, producers: int, warmup: float, duration: float, *, cache: bool = True,
             loop: str = "asyncio", loop_only: bool = False, keyed: bool = False, tabbed: bool = False) -> dict[str, Any]:
    with GcClock() as gclock:
        return _run_loop(_ours(path, sync, producers, cache, warmup, duration, gclock, loop_only, keyed, tabbed), loop)


def _run_loop(coro: Any, loop: str) -> Any:
    if loop == "uvloop":
        assert uvloop is not None
        return uvloop.run(coro)
    return asyncio.run(coro)


# -- naive: one transaction per command through SQLAlchemy's async engine on aiosqlite ------------


async def _naive(path: Path, sync: str, producers: int, warmup: float, duration: float) -> dict[str, Any]:
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 30})

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute(f"PRAGMA synchronous = {sync}")
        cur.close()

    phase = Phase()
    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def producer(k: int) -> None:
        pc, ids = time.perf_counter, IDS
        i = k * 7919
        while phase.running:
            cmd = Add(id=ids[i & _IDS_MASK], n=1)
            i += 1
            t0 = pc()
            try:
                async with engine.begin() as conn:
                    await conn.execute(ADD, {"cid": cmd.id, "n": cmd.n})
            except Exception as exc:  # noqa: BLE001 - "database is locked" and friends: counted
                if phase.measuring:
                    errors[f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"] += 1
                continue
            if phase.measuring:
                phase.done += 1
                latencies.append(pc() - t0)

    tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
    await asyncio.sleep(warmup)
    cpu0, t0, others = time.process_time(), time.perf_counter(), OtherLoad()
    phase.measuring = True
    await asyncio.sleep(duration)
    phase.measuring = False
    t1, cpu1, other_cores = time.perf_counter(), time.process_time(), others.stop()
    n = phase.done
    phase.running = False
    await asyncio.gather(*tasks)
    await engine.dispose()
    elapsed = t1 - t0
    return {
        "cmds": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "per_tx": 1.0,
        "other_cores": other_cores,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "cpu_us": (cpu1 - cpu0) / n * 1e6 if n else float("nan"),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
    }


def run_naive(path: Path, sync: str, producers: int, warmup: float, duration: float) -> dict[str, Any]:
    return asyncio.run(_naive(path, sync, producers, warmup, duration))


# -- the floor: raw sqlite3, one thread -----------------------------------------------------------


def run_floor(path: Path, sync: str, warmup: float, duration: float) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=512)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    conn.execute(f"PRAGMA synchronous = {sync}")
    cur = conn.cursor()
    execute, sql, ids = cur.execute, ADD_SQL, IDS
    assert ADD_ORDER == ("n", "cid"), ADD_ORDER
    i = 0
    n = 0
    pc = time.perf_counter
    start = pc()
    measure_from = start + warmup
    t0 = cpu0 = None
    while True:
        execute("BEGIN IMMEDIATE")
        for _ in range(BATCH):
            execute("SAVEPOINT cmd")
            execute(sql, (1, ids[i & _IDS_MASK]))
            execute("RELEASE cmd")
            i += 1
        execute("COMMIT")
        now = pc()
        if t0 is None:
            if now >= measure_from:
                t0, cpu0, others = now, time.process_time(), OtherLoad()
            continue
        n += BATCH
        if now - t0 >= duration:
            break
    cpu1, other_cores = time.process_time(), others.stop()
    conn.close()
    check_total(path, n)
    elapsed = now - t0
    return {
        "cmds": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "per_tx": float(BATCH),
        "us_per_cmd": elapsed / n * 1e6,
        "other_cores": other_cores,
        "cpu_us": (cpu1 - cpu0) / n * 1e6,
        "errors": 0,
    }


# -- the matrix -------------------------------------------------------------------------------

VARIANTS = ("ours", "uvloop", "cacheoff", "naive", "floor")
# Diagnostics, run only when asked (--only ours,gcfreeze,...): ours after gc.freeze(); ours with
# the database work replaced by nothing (the ceiling the event loop side allows), on asyncio/uvloop.
# `keyed`: ours with a `tab` and a new `op` per command, so each records its outcome; `tab`: the
# same as a `TabCommand`, which also records its tab's outcome message (read by
# bench/compare_writer.py).
EXTRA_VARIANTS = ("keyed", "tab", "gcfreeze", "looponly", "looponly_uv")
GOAL = {"NORMAL": 150_000, "FULL": 100_000}
LITH_GO = {("NORMAL", 200): "80,530 (4-vCPU VPS)", ("FULL", 200): "34,893 (i5-13500)", ("FULL", 1): "526 (i5-13500)"}


def run_one(variant: str, tmp: Path, sync: str, producers: int, warmup: float, duration: float) -> dict[str, Any]:
    gc.collect()
    if variant == "floor":
        path = fresh_db(tmp, f"floor-{sync}", migrations=False)
        result = run_floor(path, sync, warmup, duration)
    elif variant == "naive":
        path = fresh_db(tmp, f"naive-{sync}-{producers}", migrations=False)
        result = run_naive(path, sync, producers, warmup, duration)
    else:
        path = fresh_db(tmp, f"{variant}-{sync}-{producers}", migrations=True)
        if variant == "gcfreeze":
            gc.freeze()  # what an app could do at the end of its startup: no full scans of the imports
        try:
            result = run_ours(
                path, sync, producers, warmup, duration,
                cache=variant != "cacheoff", loop="uvloop" if variant in ("uvloop", "looponly_uv") else "asyncio",
                loop_only=variant.startswith("looponly"), keyed=variant in ("keyed", "tab"), tabbed=variant == "tab",
            )
        finally:
            gc.unfreeze()
    shutil.rmtree(path.parent, ignore_errors=True)
    return result


def split(r: dict[str, Any]) -> str:
    if "loop_cpu_us" not in r:
        return ""
    return (f" (loop {r['loop_cpu_us']:5.1f} + writer {r['writer_cpu_us']:5.1f}; "
            f"GC {r['gc_share']:.1%}, longest {r['gc_longest_ms']:.0f} ms)")


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if key in r and r[key] == r[key]]
    return statistics.median(values) if values else float("nan")


def fmt_int(x: float) -> str:
    return "–" if x != x else f"{x:,.0f}"


def fmt(x: float, digits: int = 2) -> str:
    return "–" if x != x else f"{x:,.{digits}f}"


def ratio(a: float, b: float, digits: int = 1) -> str:
    if a != a or b != b or not b:
        return "–"
    return f"{a / b:,.{digits}f}×"


def tables(results: dict[tuple[str, str, int], list[dict[str, Any]]], syncs: list[str], producers: list[int], reps: int, duration: float) -> str:
    keys = ("rate", "per_tx", "p50_ms", "p99_ms", "batch_p50_ms", "cpu_us", "loop_cpu_us", "writer_cpu_us", "us_per_cmd",
            "other_cores", "gc_share", "gc_longest_ms", "gc_full")
    med = {key: {k: median_of(runs, k) for k in keys} for key, runs in results.items()}
    errs = {key: sum(r.get("errors", 0) for r in runs) for key, runs in results.items()}

    def m(variant: str, sync: str, p: int, k: str) -> float:
        return med.get((variant, sync, 0 if variant == "floor" else p), {}).get(k, float("nan"))

    def lat(variant: str, sync: str, p: int, digits: int = 2) -> str:
        return f"{fmt(m(variant, sync, p, 'p50_ms'), digits)} / {fmt(m(variant, sync, p, 'p99_ms'), digits)}"

    has = {v for v, _, _ in results}
    lines = [f"Medians of {reps} runs of {duration} s each. Latency = from the `do()` call to its return, "
             "as the caller sees it (p50 / p99, ms).\n"]
    lines.append("| sync | P | ours cmd/s | cmd/tx | ours p50 / p99 ms | uvloop cmd/s | uvloop p50 / p99 ms "
                 "| cache off cmd/s | naive cmd/s | naive p50 / p99 ms | naive errors | floor cmd/s | floor µs/cmd | others' cores |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sync in syncs:
        for p in producers:
            lines.append(
                f"| {sync} | {p} | **{fmt_int(m('ours', sync, p, 'rate'))}** | {fmt(m('ours', sync, p, 'per_tx'), 1)} "
                f"| {lat('ours', sync, p)} | {fmt_int(m('uvloop', sync, p, 'rate'))} | {lat('uvloop', sync, p)} "
                f"| {fmt_int(m('cacheoff', sync, p, 'rate'))} | {fmt_int(m('naive', sync, p, 'rate'))} "
                f"| {lat('naive', sync, p, 1)} | {errs.get(('naive', sync, p), '–')} "
                f"| {fmt_int(m('floor', sync, p, 'rate'))} | {fmt(m('floor', sync, p, 'us_per_cmd'), 2)} "
                f"| {fmt(m('ours', sync, p, 'other_cores'), 2)} |"
            )
    lines.append("\n(others' cores: how many of the machine's cores other processes kept busy during the median "
                 "window of ours: the noise beside the figure.)")
    if "gcfreeze" in has:
        lines.append("")
        lines.append("| sync | P | ours cmd/s | p50 / p99 ms | in GC (longest pause) | after gc.freeze() cmd/s "
                     "| p50 / p99 ms | in GC (longest pause) | freeze / default |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for sync in syncs:
            for p in producers:
                gcs = {v: f"{fmt(m(v, sync, p, 'gc_share') * 100, 1)}% ({fmt(m(v, sync, p, 'gc_longest_ms'), 1)} ms)"
                       for v in ("ours", "gcfreeze")}
                lines.append(
                    f"| {sync} | {p} | {fmt_int(m('ours', sync, p, 'rate'))} | {lat('ours', sync, p)} | {gcs['ours']} "
                    f"| {fmt_int(m('gcfreeze', sync, p, 'rate'))} | {lat('gcfreeze', sync, p)} | {gcs['gcfreeze']} "
                    f"| {ratio(m('gcfreeze', sync, p, 'rate'), m('ours', sync, p, 'rate'), 2)} |"
                )
    if has & {"looponly", "looponly_uv"}:
        lines.append("")
        lines.append("Diagnostic: the event loop side alone (the store's `run` replaced by a no-op; the hop to the "
                     "writer thread stays):\n")
        lines.append("| sync | P | ours cmd/s | loop side alone, asyncio cmd/s | loop CPU µs/cmd "
                     "| loop side alone, uvloop cmd/s | loop CPU µs/cmd |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for sync in syncs:
            for p in producers:
                lines.append(
                    f"| {sync} | {p} | {fmt_int(m('ours', sync, p, 'rate'))} "
                    f"| {fmt_int(m('looponly', sync, p, 'rate'))} | {fmt(m('looponly', sync, p, 'loop_cpu_us'), 1)} "
                    f"| {fmt_int(m('looponly_uv', sync, p, 'rate'))} | {fmt(m('looponly_uv', sync, p, 'loop_cpu_us'), 1)} |"
                )
    lines.append("")
    lines.append("| sync | P | ours µs/cmd (wall) | floor µs/cmd | ours / floor, wall (goal ≤ 3×) | ours / floor, CPU "
                 "| ours / naive (goal ≥ 20× at 200) | cache on / off | uvloop / asyncio | goal cmd/s | ours vs goal | lith (Go) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sync in syncs:
        for p in producers:
            ours = m("ours", sync, p, "rate")
            floor_us = m("floor", sync, p, "us_per_cmd")
            ours_us = 1e6 / ours if ours == ours and ours else float("nan")
            goal = GOAL[sync] if p == 200 and sync in GOAL else float("nan")
            vs_goal = "–" if goal != goal or ours != ours else f"{ours / goal:.0%}, {'met' if ours >= goal else 'missed'}"
            lines.append(
                f"| {sync} | {p} | {fmt(ours_us, 2)} | {fmt(floor_us, 2)} | {ratio(ours_us, floor_us)} "
                f"| {ratio(m('ours', sync, p, 'cpu_us'), m('floor', sync, p, 'cpu_us'))} "
                f"| {ratio(ours, m('naive', sync, p, 'rate'))} | {ratio(ours, m('cacheoff', sync, p, 'rate'))} "
                f"| {ratio(m('uvloop', sync, p, 'rate'), ours, 2)} | {fmt_int(goal)} | {vs_goal} "
                f"| {LITH_GO.get((sync, p), '–')} |"
            )
    lines.append("")
    lines.append("CPU µs per command, all threads of the process; for ours also split into the event loop thread "
                 "and the writer thread, with how busy each was (share of one core) and the writer's batch time "
                 "(taking the batch → commit returned on the loop):\n")
    lines.append("| sync | P | ours CPU (loop + writer) | loop busy | writer busy | batch p50 ms | in GC (longest pause) "
                 "| uvloop CPU (loop + writer) | cache off CPU | naive CPU | floor CPU |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sync in syncs:
        for p in producers:
            rate = m("ours", sync, p, "rate")
            lc, wc = m("ours", sync, p, "loop_cpu_us"), m("ours", sync, p, "writer_cpu_us")
            ulc, uwc = m("uvloop", sync, p, "loop_cpu_us"), m("uvloop", sync, p, "writer_cpu_us")
            lines.append(
                f"| {sync} | {p} | {fmt(m('ours', sync, p, 'cpu_us'), 1)} ({fmt(lc, 1)} + {fmt(wc, 1)}) "
                f"| {fmt(lc * rate / 1e4, 0)}% | {fmt(wc * rate / 1e4, 0)}% | {fmt(m('ours', sync, p, 'batch_p50_ms'), 3)} "
                f"| {fmt(m('ours', sync, p, 'gc_share') * 100, 1)}% ({fmt(m('ours', sync, p, 'gc_longest_ms'), 0)} ms) "
                f"| {fmt(m('uvloop', sync, p, 'cpu_us'), 1)} ({fmt(ulc, 1)} + {fmt(uwc, 1)}) "
                f"| {fmt(m('cacheoff', sync, p, 'cpu_us'), 1)} | {fmt(m('naive', sync, p, 'cpu_us'), 0)} "
                f"| {fmt(m('floor', sync, p, 'cpu_us'), 2)} |"
            )
    others = [r["other_cores"] for runs in results.values() for r in runs if r.get("other_cores") == r.get("other_cores")]
    if others:
        lines.append("")
        lines.append(f"Other processes on the machine kept {statistics.median(others):.2f} cores busy during a median "
                     f"window (max {max(others):.2f}, of {os.cpu_count()}): figures from a shared machine.")
    kinds: dict[tuple[str, str, int], Counter[str]] = defaultdict(Counter)
    for key, runs in results.items():
        for r in runs:
            kinds[key].update(r.get("error_kinds", {}))
    notes = [f"errors {v} {s} P={p}: {dict(c)}" for (v, s, p), c in kinds.items() if c]
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines)


def main_bench(args: argparse.Namespace) -> None:
    producers = [int(p) for p in args.producers.split(",")]
    syncs = [s.strip().upper() for s in args.sync.split(",")]
    variants = [v for v in (args.only.split(",") if args.only else VARIANTS)]
    unknown = set(variants) - set(VARIANTS) - set(EXTRA_VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}: pick from {VARIANTS + EXTRA_VARIANTS}")
    if "uvloop" in variants and uvloop is None:
        print("uvloop is not importable: no uvloop column")
        variants.remove("uvloop")
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-writer-"))
    found = print_conditions(
        loop="asyncio (main figures), uvloop (extra column)" if "uvloop" in variants else "asyncio",
        tmpdir=tmp,
        sources=("fastapi_lith/engine/writer.py", "fastapi_lith/backends/sqlite/writer.py", "fastapi_lith/engine/statements.py", "fastapi_lith/engine/db.py"),
    )
    print(f"SQL per command: {ADD_SQL}  (params {ADD_ORDER}), {ROWS} rows, a savepoint each")
    print(f"repeats {args.reps}, warm-up {args.warmup} s, window {args.duration} s per run; "
          f"caller latency sampled every {SAMPLE_EVERY}th command\n", flush=True)

    results: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    started = time.perf_counter()
    try:
        for sync in syncs:
            configs = [(v, p) for p in producers for v in variants if v != "floor"]
            if "floor" in variants:
                configs.insert(0, ("floor", 0))
            for rep in range(args.reps):
                for variant, p in configs:
                    if args.quiet:
                        wait_for_quiet(args.quiet)
                    r = run_one(variant, tmp, sync, p, args.warmup, args.duration)
                    results[(variant, sync, p)].append(r)
                    extra = f" errors {r['error_kinds']}" if r.get("errors") else ""
                    lat = f" p50 {r['p50_ms']:.3f} ms p99 {r['p99_ms']:.3f} ms" if "p50_ms" in r else ""
                    print(f"  [{time.perf_counter() - started:6.1f}s] {sync:6} {variant:8} P={p:<3} "
                          f"rep {rep + 1}: {r['rate']:>10,.0f} cmd/s  {r['per_tx']:6.1f}/tx "
                          f"cpu {r['cpu_us']:6.1f} µs/cmd{split(r)}{lat}{extra}"
                          f" | others {r.get('other_cores', float('nan')):.2f} cores", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    table = tables(results, syncs, producers, args.reps, args.duration)
    print("\n" + table)
    end_load = load_average()
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average at the end: {end_load}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "conditions": found, "conditions_line": one_line(found), "end_load": end_load,
            "args": vars(args), "table": table,
            "runs": {f"{v}|{s}|{p}": runs for (v, s, p), runs in results.items()},
        }, indent=1, default=str))


def main_merge(args: argparse.Namespace) -> None:
    """Pool the runs of several invocations (a shared machine is noisy at different times)."""
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    reps = 0
    duration = None
    for name in args.merge:
        data = json.loads(Path(name).read_text())
        print(f"{name}: {data['conditions_line']}; load average at the end {data['end_load']}")
        reps += int(data["args"]["reps"])
        duration = data["args"]["duration"]
        for key, runs in data["runs"].items():
            variant, sync, p = key.split("|")
            results[(variant, sync, int(p))].extend(runs)
    syncs = list(dict.fromkeys(s for _, s, _ in results))
    producers = sorted({p for v, _, p in results if v != "floor"})
    print()
    print(tables(results, syncs, producers, reps, duration))


# -- profile ----------------------------------------------------------------------------------


def profile_target(args: argparse.Namespace) -> None:
    """The process py-spy records: ours only, one config, no repeats."""
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-profile-"))
    try:
        sync = args.sync.split(",")[0].upper()
        p = int(args.producers.split(",")[-1])
        r = run_one("ours", tmp, sync, p, args.warmup, args.duration)
        print(f"profiled run: {sync} P={p}: {r['rate']:,.0f} cmd/s, {r['per_tx']:.1f}/tx, "
              f"cpu {r['cpu_us']:.1f} µs/cmd, p50 {r['p50_ms']:.3f} ms", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
Frame = tuple[str, str, int]
Rule = tuple[Callable[[str, str, int, str], bool], Callable[[str, str, int, str], str]]
OUTSIDE = "outside the event loop (imports, setup, teardown)"


def parse_raw(path: Path) -> list[tuple[str, list[Frame], int]]:
    """py-spy's raw (collapsed) stacks with --threads: `thread (tid): name;frame;...;frame count`,
    root first, frames as `func (file:line)`."""
    stacks = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        body, _, count = line.rpartition(" ")
        parts = body.split(";")
        thread = parts[0] if parts[0].startswith("thread") else ""
        frames = []
        for part in parts[1:] if thread else parts:
            m = FRAME.match(part)
            frames.append((m["func"], m["file"], int(m["line"] or 0)) if m else (part, "", 0))
        stacks.append((thread, frames, int(count)))
    return stacks


def source_line(file: str, line: int) -> str:
    """The text of a profiled line (py-spy paths are relative to a sys.path entry)."""
    import linecache

    if not file or not line:
        return ""
    for base in (ROOT, HERE):
        candidate = base / file
        if candidate.is_file():
            return linecache.getline(str(candidate), line).strip()
    return ""


def where(file: str, line: int) -> str:
    name = f"bench/writer.py:{line}" if file == "writer.py" else f"{file}:{line}"
    text = source_line(file, line)
    return f"{name} `{text[:72]}`" if text else name


def own(frame: Frame) -> bool:
    return frame[1].startswith("fastapi_lith/") or frame[1] in ("writer.py", "bench/writer.py")


HAND_BACK = {
    "_WorkItem.run", "Future.set_result", "Future._invoke_callbacks",
    "_chain_future.<locals>._call_set_state", "BaseEventLoop.call_soon_threadsafe",
    "BaseSelectorEventLoop._write_to_self",
}

WRITER_THREAD_RULES: list[Rule] = [
    (lambda f, fi, ln, t: fi.endswith("statements.py"),
     lambda f, fi, ln, t: "bind: StatementCache.bind + Statement.bind (statements.py)"),
    (lambda f, fi, ln, t: f == "Tx.touch", lambda f, fi, ln, t: f"tx.touch ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f.endswith(".execute") and fi.startswith("fastapi_lith/") and "_cursor.execute(sql" in t,
     lambda f, fi, ln, t: f"the UPDATE itself: {where(fi, ln)}"),
    (lambda f, fi, ln, t: f.endswith(".execute") and fi.startswith("fastapi_lith/"),
     lambda f, fi, ln, t: f"{f} ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "Add.apply", lambda f, fi, ln, t: "Add.apply body (bench command: params dict)"),
    (lambda f, fi, ln, t: f == "SqliteStore._transaction" and "SAVEPOINT" in t, lambda f, fi, ln, t: f"SAVEPOINT ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "SqliteStore._transaction" and "RELEASE" in t and "ROLLBACK" not in t,
     lambda f, fi, ln, t: f"RELEASE ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "SqliteStore._transaction" and "COMMIT" in t, lambda f, fi, ln, t: f"COMMIT ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "SqliteStore._transaction" and "BEGIN" in t, lambda f, fi, ln, t: f"BEGIN IMMEDIATE ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "SqliteStore._transaction", lambda f, fi, ln, t: f"_transaction loop ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f in HAND_BACK,
     lambda f, fi, ln, t: "hand-back to the loop (set_result → call_soon_threadsafe → self-pipe write)"),
    (lambda f, fi, ln, t: f == "_worker", lambda f, fi, ln, t: "waiting for the next batch (SimpleQueue.get)"),
]

LOOP_THREAD_RULES: list[Rule] = [
    (lambda f, fi, ln, t: fi.startswith("pydantic"), lambda f, fi, ln, t: "pydantic: Add(...) construction and validation"),
    (lambda f, fi, ln, t: f == "Writer.do", lambda f, fi, ln, t: f"Writer.do: {where(fi, ln)}"),
    (lambda f, fi, ln, t: fi == "asyncio/locks.py", lambda f, fi, ln, t: f"asyncio.Event: {f}"),
    (lambda f, fi, ln, t: f == "Writer._run" and "set_result" in t,
     lambda f, fi, ln, t: f"Writer._run: future resolution ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "Writer._run" and "run_in_executor" in t,
     lambda f, fi, ln, t: f"Writer._run: hop to the writer thread ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f == "Writer._run", lambda f, fi, ln, t: f"Writer._run: {where(fi, ln)}"),
    (lambda f, fi, ln, t: f.endswith("producer"), lambda f, fi, ln, t: f"bench producer loop ({where(fi, ln)})"),
    (lambda f, fi, ln, t: f in ("_chain_future.<locals>._set_state", "_copy_future_state"),
     lambda f, fi, ln, t: "hand-back: asyncio future set from the concurrent one"),
    (lambda f, fi, ln, t: f in ("BaseSelectorEventLoop._read_from_self", "BaseSelectorEventLoop._process_self_data"),
     lambda f, fi, ln, t: "self-pipe read (woken by the writer thread)"),
    (lambda f, fi, ln, t: f == "EpollSelector.select", lambda f, fi, ln, t: "epoll_wait (waiting for the writer thread)"),
    (lambda f, fi, ln, t: f == "Handle._run",
     lambda f, fi, ln, t: "task steps and callbacks in C (Task.__step / __wakeup: resuming the callers)"),
    (lambda f, fi, ln, t: f == "BaseEventLoop._run_once", lambda f, fi, ln, t: f"loop bookkeeping: _run_once ({where(fi, ln)})"),
]


WAITS = {"epoll_wait (waiting for the writer thread)", "waiting for the next batch (SimpleQueue.get)"}


def which_thread(name: str, frames: list[Frame]) -> str:
    funcs = {f for f, _, _ in frames}
    if "_worker" in funcs or "lith-writer" in name:
        return "writer thread"
    if "BaseEventLoop.run_forever" in funcs or any(fi.startswith("uvloop") for _, fi, _ in frames):
        return "event loop thread"
    return OUTSIDE


def classify(thread: str, frames: list[Frame]) -> str:
    rules = WRITER_THREAD_RULES if thread == "writer thread" else LOOP_THREAD_RULES if thread == "event loop thread" else []
    for f, fi, ln in reversed(frames):
        text = source_line(fi, ln) if own((f, fi, ln)) else ""
        for test, label in rules:
            if test(f, fi, ln, text):
                return label(f, fi, ln, text)
    leaf = frames[-1] if frames else ("?", "", 0)
    return f"other: {leaf[0]} ({leaf[1]}:{leaf[2]})"


def summarize_profile(raw: Path, rate: int, top: int = 16) -> tuple[str, dict[str, Any]]:
    stacks = parse_raw(raw)
    by_thread: Counter[str] = Counter()
    by_cat: dict[str, Counter[str]] = defaultdict(Counter)
    by_own: dict[str, Counter[str]] = defaultdict(Counter)
    for name, frames, count in stacks:
        thread = which_thread(name, frames)
        by_thread[thread] += count
        if thread == OUTSIDE:
            continue
        by_cat[thread][classify(thread, frames)] += count
        mine = [fr for fr in frames if own(fr)]
        if mine:
            f, fi, _ = mine[-1]
            by_own[thread][f"{f} ({'bench/writer.py' if fi == 'writer.py' else fi})"] += count
    inside = {t: n for t, n in by_thread.items() if t != OUTSIDE}
    total = sum(inside.values()) or 1
    out = [f"{raw.name}: {sum(by_thread.values())} samples at {rate} Hz; {by_thread[OUTSIDE]} of them "
           f"{OUTSIDE} are left out"]
    for thread, n in sorted(inside.items(), key=lambda kv: -kv[1]):
        out.append(f"\n  {thread}: {n} samples = {n / rate:.2f} s, {n / total:.1%} of the samples in the loop's run")
        busy = n - sum(c for cat, c in by_cat[thread].items() if cat in WAITS)
        out.append("    by category (% of this thread's samples | % of its samples that are not waiting):")
        for cat, c in by_cat[thread].most_common(top):
            share = "     –" if cat in WAITS or not busy else f"{c / busy:6.1%}"
            out.append(f"      {c / n:6.1%} | {share}  {cat}")
        out.append("    by deepest own function, inclusive (% of this thread):")
        for label, c in by_own[thread].most_common(8):
            out.append(f"      {c / n:6.1%}  {label}")
    data = {"threads": inside, "categories": {t: dict(c) for t, c in by_cat.items()}}
    return "\n".join(out), data


def main_profile(args: argparse.Namespace) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    print_conditions(loop="asyncio", sources=("fastapi_lith/engine/writer.py", "fastapi_lith/backends/sqlite/writer.py", "fastapi_lith/engine/statements.py", "fastapi_lith/engine/db.py"))
    out_dir = Path(args.profile_dir or tempfile.mkdtemp(prefix="lith-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = [sys.executable, str(Path(__file__).resolve()), "--profile-target",
              "--producers", args.producers.split(",")[-1], "--sync", args.sync.split(",")[0],
              "--warmup", "0.5", "--duration", str(args.profile_seconds)]
    modes = {
        "active": ([], "samples of running threads (py-spy's default, idle=False)"),
        "gil": (["--gil"], "only the thread that holds the GIL: where the Python time goes"),
    }
    for mode in args.profile_modes.split(","):
        flags, meaning = modes[mode]
        raw = out_dir / f"writer-{mode}.txt"
        cmd = [spy, "record", "-r", str(args.rate), "-f", "raw", "--threads", "-o", str(raw), *flags]
        print(f"\n== {mode}: {meaning}")
        print("$", " ".join(cmd), "--", " ".join(target[1:]), flush=True)
        subprocess.run(cmd + ["--"] + target, check=True, stderr=subprocess.DEVNULL)
        print(summarize_profile(raw, args.rate)[0], flush=True)
    print(f"\nraw stacks in {out_dir}; load average at the end: {load_average()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", default="1,50,200", help="comma-separated producer counts")
    ap.add_argument("--sync", default="NORMAL,FULL", help="synchronous settings, comma-separated")
    ap.add_argument("--only", default="", help=f"variants to run, of {','.join(VARIANTS + EXTRA_VARIANTS)} (default: {','.join(VARIANTS)})")
    ap.add_argument("--reps", type=int, default=3, help="repeats per config (median reported)")
    ap.add_argument("--warmup", type=float, default=0.4, help="seconds before each window")
    ap.add_argument("--duration", type=float, default=1.6, help="seconds measured per run")
    ap.add_argument("--quick", action="store_true", help="about a minute: shorter windows")
    ap.add_argument("--quiet", type=float, default=0.0, metavar="SECONDS",
                    help="before each run wait up to SECONDS for other processes to use < 0.35 cores "
                         "(shared machines; adds to the runtime)")
    ap.add_argument("--json", default="", help="write every run and the tables to this file")
    ap.add_argument("--profile", action="store_true", help="py-spy ours at the last P and first sync")
    ap.add_argument("--profile-seconds", type=float, default=5.0)
    ap.add_argument("--profile-dir", default="")
    ap.add_argument("--profile-modes", default="active,gil", help="py-spy runs: active (idle=False), gil")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--summarize", default="", help="summarize an existing py-spy raw file")
    ap.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                    help="print the tables for the pooled runs of earlier --json files (medians over all)")
    ap.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.duration = 0.2, 0.45
    if args.merge:
        main_merge(args)
    elif args.summarize:
        print(summarize_profile(Path(args.summarize), args.rate)[0])
    elif args.profile_target:
        profile_target(args)
    elif args.profile:
        if args.producers == "1,50,200":
            args.producers = "200"
        if args.sync == "NORMAL,FULL":
            args.sync = "NORMAL"
        main_profile(args)
    else:
        main_bench(args)


if __name__ == "__main__":
    main()
