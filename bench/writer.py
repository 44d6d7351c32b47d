"""The writer: commands per second through `Writer.do`, in process, no HTTP.

One command is one `UPDATE counter SET count = count + :n WHERE id = :id` over 1,000 rows (the
id drawn per command), in its own savepoint, sent by `await writer.do(cmd)` with a Pydantic
command built per call, as a request handler would. P producers each send their next command
once the previous one returned (a closed loop), for each P and `synchronous` setting. Beside
ours, in the same run:

  tab      the same UPDATE as a `TabCommand`: keyed by its tab and op (looked up, then recorded)
           and its tab's outcome written: what every click of a page costs
  uvloop   ours on uvloop (uvicorn's loop in production); asyncio is the main figure
  naive    what a route would otherwise do: one transaction per command through SQLAlchemy's
           async engine on aiosqlite (`async with engine.begin(): await conn.execute(...)`)
  floor    the same SQL on raw sqlite3 in one thread, SAVEPOINT/UPDATE/RELEASE per command and
           COMMIT per 512: what the writer thread could do with no Python around it; a
           micro-benchmark, so pyperf times one batch (its wall time, one thread: its CPU, but
           for FULL's fsync waits)
  traced   ours with every command spanned as an app with an OpenTelemetry provider has it
           (docs/tracing.md: the writer inside `lith.lifespan()`, its hub idle, the provider set
           globally), the SDK's batch processor handing the spans to an exporter that drops them;
           only when asked (`--variants ours,traced`)

Each run is a fresh database file, a warm-up, then a window; every increment counted is
checked in the file afterwards. CPU per command is every thread of the process, split into the
event loop and the writer thread (by the threads' CPU clocks). The writer's own figures come from
its metrics (`Lith(path, writer=writer).metrics`, sampled at the window's edges): commands per
batch, the mean commit of a batch, and the share of the window it spent on batches (busy).

    python -m bench.writer                          # about 3 minutes
    python -m bench.writer --quick --plot           # about a minute, and bench/plots/writer-producers.svg
    python -m bench.writer --producers 200 --sync NORMAL --variants ours,floor --profile
    python -m bench.writer --quick --against main   # ours / main's library, same run
    python -m bench.writer --quick --variants ours,traced --sync NORMAL   # what tracing costs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import Field

from fastapi_lith import Command, Lith, TabCommand, Tx, Writer

from .lib import conditions, harness, perf, plot
from .lib.load import Load, produce
from .lib.metrics import Counts
from .lib.proc import ThreadClocks
from .lib.profile import Spy
from .lib.stats import NAN, median, number, ratio

ROWS = 1000
BATCH = 512  # the floor's commands per COMMIT: the writer's default batch_size
VARIANTS = ("ours", "tab", "uvloop", "naive", "floor")
TRACED = "traced"  # needs opentelemetry-sdk (the dev extra): never among the defaults
# lith (Go) on its writer benchmark (DESIGN.md): commands/s at 200 producers
LITH_GO = {"NORMAL": (80_530, "4-vCPU VPS"), "FULL": (34_893, "i5-13500")}

SQL = "UPDATE counter SET count = count + ? WHERE id = ?"
COUNTER = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = COUNTER.update().where(COUNTER.c.id == sa.bindparam("cid")).values(count=COUNTER.c.count + sa.bindparam("n"))
SCHEMA = f"""
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL DEFAULT 0);
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {ROWS})
INSERT INTO counter (id, count) SELECT i, 0 FROM seq;
"""
# The ids every variant walks through, drawn once, so choosing one costs an index everywhere.
MASK = (1 << 16) - 1
IDS = [random.Random(20261129).randint(1, ROWS) for _ in range(MASK + 1)]


class Add(Command):
    id: int = Field(ge=1, le=ROWS)
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"cid": self.id, "n": self.n})
        tx.touch("counter")


class TabAdd(TabCommand):
    id: int = Field(ge=1, le=ROWS)
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"cid": self.id, "n": self.n})
        tx.touch("counter")
        self.say("Added.")


def fresh_db(tmp: Path, *, migrations: bool) -> Path:
    folder = Path(tempfile.mkdtemp(dir=tmp))
    if migrations:
        (folder / "migrations").mkdir()
        (folder / "migrations" / "0001_counter.sql").write_text(SCHEMA)
    else:
        conn = sqlite3.connect(folder / "bench.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(SCHEMA)
        conn.close()
    return folder / "bench.db"


def check_total(path: Path, counted: int) -> None:
    """Every command counted is in the file: the figures are of real writes."""
    conn = sqlite3.connect(path)
    total = conn.execute("SELECT sum(count) FROM counter").fetchone()[0] or 0
    conn.close()
    if total < counted:
        raise AssertionError(f"{total} increments in the file, {counted} counted")


def figures_of(load: Load, cpu: float, **more: float) -> dict[str, float]:
    return {"rate": load.rate, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
            "cpu_us": cpu / load.done * 1e6 if load.done else NAN, "errors": float(sum(load.errors.values())), **more}


def trace_globally() -> None:
    """Give the process an OpenTelemetry provider, as a traced app does: the spans go to an
    exporter that drops them, through the SDK's batch processor (its thread's CPU is counted
    with the rest). Set once per process (OpenTelemetry refuses a second); only a Lith's
    lifespan asks for it, so the untraced variants, which run no lifespan, stay untraced."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


async def ours(path: Path, sync: str, producers: int, warmup: float, seconds: float, *, tab: bool,
               profile: bool, traced: bool = False) -> dict[str, float]:
    writer = Writer(path, migrations=path.parent / "migrations", synchronous=sync)  # type: ignore[arg-type]
    lith = Lith(path, writer=writer)  # for its metrics; only the traced variant runs its lifespan
    async with contextlib.AsyncExitStack() as running:
        if traced:
            trace_globally()
            await running.enter_async_context(lith.lifespan(ticks=False))
        else:
            await writer.start()
            running.push_async_callback(writer.close)
        load, edges = await window(writer, lith, producers, warmup, seconds, tab=tab, profile=profile)
    check_total(path, load.done)
    w, cores, per, c = load.cost, edges["cores"], ratio(1e6, load.rate), edges["counts"]
    assert w is not None
    out = figures_of(load, w.cores * w.seconds, others=w.others, loop_us=cores.get("loop", NAN) * per,
                     writer_us=cores.get("writer", NAN) * per, per_tx=c.mean("lith_writer_batch_size"),
                     commit_ms=c.mean("lith_writer_commit_seconds") * 1e3,
                     busy=c.get("lith_writer_commit_seconds_sum") / w.seconds)
    if profile:
        print(f"\nprofile of ours, {sync}, {producers} producers ({edges['spy'].command}):\n{edges['spy'].summary()}\n")
    return out


async def window(writer: Writer, lith: Lith, producers: int, warmup: float, seconds: float, *, tab: bool,
                 profile: bool) -> tuple[Load, dict[str, Any]]:
    """The closed loop over one window, and what the writer's metrics and threads say of it."""
    edges: dict[str, Any] = {}

    def send(k: int, i: int) -> Any:
        cid = IDS[(k * 7919 + i) & MASK]
        return writer.do(TabAdd(id=cid, n=1, tab=f"tab{k}", op=i + 1) if tab else Add(id=cid, n=1))

    def opened() -> None:
        edges.update(threads=ThreadClocks(), start=Counts.of(getattr(lith, "metrics", None)))
        if profile:
            edges["spy"] = Spy(os.getpid(), seconds)

    def closed() -> None:
        edges.update(cores=edges["threads"].cores(), counts=Counts.of(getattr(lith, "metrics", None)) - edges["start"])

    return await produce(send, producers, warmup=warmup, seconds=seconds, opened=opened, closed=closed), edges


async def naive(path: Path, sync: str, producers: int, warmup: float, seconds: float) -> dict[str, float]:
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 30})

    @event.listens_for(engine.sync_engine, "connect")
    def pragmas(conn: Any, _record: Any) -> None:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {sync}")

    async def send(k: int, i: int) -> None:
        cmd = Add(id=IDS[(k * 7919 + i) & MASK], n=1)
        async with engine.begin() as conn:
            await conn.execute(ADD, {"cid": cmd.id, "n": cmd.n})

    load = await produce(send, producers, warmup=warmup, seconds=seconds)
    await engine.dispose()
    assert load.cost is not None
    return figures_of(load, load.cost.cores * load.seconds, per_tx=1.0, others=load.cost.others)


def floor_batch(path: str, sync: str) -> Callable[[], None]:
    """For pyperf's workers: one batch of the floor, `BATCH` commands and their COMMIT."""
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=512)
    conn.execute(f"PRAGMA synchronous = {sync}")
    execute, ids = conn.cursor().execute, itertools.cycle(IDS)

    def batch() -> None:
        execute("BEGIN IMMEDIATE")
        for _ in range(BATCH):
            execute("SAVEPOINT cmd")
            execute(SQL, (1, next(ids)))
            execute("RELEASE cmd")
        execute("COMMIT")

    return batch


def floor(path: Path, sync: str, flags: list[str]) -> dict[str, float]:
    """The floor is a micro-benchmark, one function in one thread: pyperf times its batch."""
    setup = f"from bench.writer import floor_batch; batch = floor_batch({str(path)!r}, {sync!r})"
    mean, sd = perf.timeit(f"floor {sync}", [setup], "batch()", flags, path.with_suffix(".json"))
    conn = sqlite3.connect(path)
    total = conn.execute("SELECT sum(count) FROM counter").fetchone()[0] or 0
    conn.close()
    if not total or total % BATCH:  # whole batches, and some: the timed statement wrote
        raise AssertionError(f"{total} increments in the floor's file")
    return {"rate": BATCH / mean, "wall_us": mean / BATCH * 1e6, "sd_pct": sd / mean * 100, "per_tx": float(BATCH)}


def run_one(variant: str, tmp: Path, sync: str, producers: int, warmup: float, seconds: float,
            profile: bool, flags: list[str]) -> dict[str, float]:
    path = fresh_db(tmp, migrations=variant in ("ours", "tab", "uvloop", TRACED))
    try:
        if variant == "floor":
            return floor(path, sync, flags)
        if variant == "naive":
            return asyncio.run(naive(path, sync, producers, warmup, seconds))
        coro = ours(path, sync, producers, warmup, seconds, tab=variant == "tab", profile=profile and variant == "ours",
                    traced=variant == TRACED)
        if variant == "uvloop":
            import uvloop

            return uvloop.run(coro)
        return asyncio.run(coro)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--producers", default="", help="comma-separated producer counts (default 1,50,200)")
    ap.add_argument("--sync", default="NORMAL,FULL", help="synchronous settings, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {','.join(VARIANTS)}, or {TRACED}")
    ap.add_argument("--seconds", type=float, default=0.0, help="the window of each run (default 1.6)")
    ap.add_argument("--profile", action="store_true", help="py-spy over ours' window at the last producer count")


def measure(args: argparse.Namespace) -> harness.Result:
    producers = [int(p) for p in (args.producers or ("50" if args.smoke else "1,50,200")).split(",")]
    syncs = ["NORMAL"] if args.smoke else [s.strip().upper() for s in args.sync.split(",")]
    variants = ["ours", "floor"] if args.smoke else args.variants.split(",")
    warmup, seconds = (0.1, 0.2) if args.smoke else (0.3, 1.0) if args.quick else (0.4, args.seconds or 1.6)
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-writer-"))
    runs: dict[str, dict[str, float]] = {}
    try:
        for sync in syncs:
            for p in producers:
                for v in variants:
                    if v == "floor" and p != producers[0]:
                        continue  # one thread, no producers: once per setting
                    key = f"{v} {sync} {'-' if v == 'floor' else p}"
                    runs[key] = run_one(v, tmp, sync, p, warmup, seconds, args.profile and p == producers[-1],
                                        perf.mode(args))
                    r = runs[key]
                    print(f"  {key:<22} {number(r['rate']):>9} cmd/s  {r['per_tx']:6.1f}/tx  "
                          f"{cpu(r)} µs/cmd  p50 {r.get('p50_ms', NAN):6.3f} ms  "
                          f"others {r.get('others', NAN):.2f} cores", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = table(runs, syncs, producers, variants, seconds)
    return harness.Result(headline(runs, syncs, producers), text, {"runs": runs})


def headline(runs: dict[str, dict[str, float]], syncs: list[str], producers: list[int]) -> dict[str, float]:
    top, out = producers[-1], {}
    for sync in syncs:
        s = sync.lower()
        for v in ("ours", "tab", "uvloop", "naive", TRACED):
            if f"{v} {sync} {top}" in runs:
                out[f"{v}_{s}_{top}_cmd_s"] = runs[f"{v} {sync} {top}"]["rate"]
        if f"ours {sync} {top}" in runs:
            out[f"ours_{s}_{top}_cpu_us"] = runs[f"ours {sync} {top}"]["cpu_us"]
            out[f"ours_{s}_{top}_p50_ms"] = runs[f"ours {sync} {top}"]["p50_ms"]
        if f"floor {sync} -" in runs:
            out[f"floor_{s}_cmd_s"] = runs[f"floor {sync} -"]["rate"]
    return out


def cpu(r: dict[str, float]) -> str:
    """CPU per command, or the floor's wall time per command (one thread) and its spread."""
    if "wall_us" in r:
        return f"{r['wall_us']:.1f} wall ± {r['sd_pct']:.0f}%"
    return f"{r['cpu_us']:.1f}"


def table(runs: dict[str, dict[str, float]], syncs: list[str], producers: list[int], variants: list[str],
          seconds: float) -> str:
    lines = [f"Windows of {seconds} s. Latency: from `do()` to its return, as the caller sees it. CPU: every thread "
             "of the process per command (ours: event loop + writer thread); the floor's is pyperf's wall time per "
             "command, ± its standard deviation.\n",
             "| sync | P | variant | commands/s | per transaction | commit ms (busy) | p50 / p99 ms | CPU µs/command "
             "| ours / floor, wall | lith (Go) at 200 |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for sync in syncs:
        floor_rate = runs.get(f"floor {sync} -", {}).get("rate", NAN)
        for p in producers:
            for v in variants:
                r = runs.get(f"{v} {sync} {'-' if v == 'floor' else p}")
                if r is None or (v == "floor" and p != producers[0]):
                    continue
                split = f" ({r['loop_us']:.1f} + {r['writer_us']:.1f})" if "loop_us" in r else ""
                go = LITH_GO.get(sync) if p == 200 and v == "ours" else None
                vs_floor = "" if v == "floor" else f"{ratio(floor_rate, r['rate']):.1f}×"
                lith = f"{go[0]:,} ({go[1]})" if go else ""
                commit = f"{r['commit_ms']:.2f} ({r['busy']:.0%})" if "commit_ms" in r else ""
                lines.append(
                    f"| {sync} | {'–' if v == 'floor' else p} | {v} | {number(r['rate'])} | {r['per_tx']:.1f} "
                    f"| {commit} "
                    f"| {number(r.get('p50_ms', NAN), 3)} / {number(r.get('p99_ms', NAN), 3)} "
                    f"| {cpu(r)}{split} "
                    f"| {vs_floor} | {lith} |")
    return "\n".join(lines)


def draw(ours: list[harness.Result], theirs: list[harness.Result], rev: str, args: argparse.Namespace) -> list[Path]:
    runs = {k: {"rate": median([r.data["runs"][k]["rate"] for r in ours if k in r.data["runs"]])}
            for k in ours[-1].data["runs"]}  # the median of the rounds
    fig, ax = plot.figure("Writer: commands/s against producers (closed loop, in process)", "producers",
                          "commands/s")
    for sync, colour in (("NORMAL", "tab:blue"), ("FULL", "tab:orange")):
        points = sorted((int(k.split()[2]), r["rate"]) for k, r in runs.items() if k.startswith(f"ours {sync} "))
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=colour, label=f"ours, {sync}")
        if f"floor {sync} -" in runs:
            ax.axhline(runs[f"floor {sync} -"]["rate"], color=colour, ls="--", lw=1, label=f"raw sqlite3 floor, {sync}")
        if sync in LITH_GO:
            ax.plot([200], [LITH_GO[sync][0]], "x", color=colour, ms=8, label=f"lith (Go), {sync}, {LITH_GO[sync][1]}")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    caption = conditions.caption(f"python -m bench.writer{' --quick' if args.quick else ''} --plot")
    return [plot.save(fig, "writer-producers", caption)]


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments, plot=draw)
