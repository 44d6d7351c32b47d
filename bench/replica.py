"""Replication benchmark: what Litestream costs the writer, what a dead disk loses, restore time.

1. **Writer with replication on and off, same run.** The writer benchmark's command (one
   `UPDATE counter ... WHERE id = :id` over 1,000 rows, see bench/writer.py) from P producers
   in a closed loop, `synchronous=NORMAL`, interleaved:
     off           the writer alone, SQLite's automatic checkpoint at 1,000 pages
     on            what `Lith(replica=...)` runs: Litestream replicating to a file:// replica
                   (another folder on this disk), the writer's automatic checkpoint raised to
                   10,000 pages so that Litestream checkpoints
     on, ckpt 1000 the same with the writer's automatic checkpoint left at SQLite's 1,000
   Medians of the repeats; ratios against `off`.
2. **Recovery point.** 4 producers append a sequence through the writer with Litestream
   running (sync interval 1 s); at a random moment Litestream and the writer are killed
   (SIGKILL, then the process abandons the database), the replica is restored and compared:
   how many acknowledged commands were lost, and how long before the kill the oldest lost
   one was acknowledged.
3. **Restore time for a 50 MB database**, from a file:// replica and from moto's S3 server on
   127.0.0.1: `litestream restore` of the latest state, median of 3.

    python bench/replica.py            # about 3 minutes (--reps 5: about 5)
    python bench/replica.py --quick    # about 1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from conditions import OtherLoad, percentile, print_conditions  # noqa: E402
from writer import IDS, SCHEMA, Add, _IDS_MASK  # noqa: E402

from fastapi_lith import Command, Tx, Writer  # noqa: E402
from fastapi_lith.ops import litestream  # noqa: E402
from fastapi_lith.ops.replica import Replica  # noqa: E402

VARIANTS = {"off": (False, 1000), "on": (True, litestream.WRITER_CHECKPOINT_PAGES), "on, ckpt 1000": (True, 1000)}


def fresh(tmp: Path, name: str, schema: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"{name.replace(', ', '-').replace(' ', '')}-", dir=tmp))
    (folder / "migrations").mkdir()
    (folder / "migrations" / "0001.sql").write_text(schema)
    return folder / "bench.db"


async def writer_run(path: Path, replicate: bool, checkpoint: int, producers: int, warmup: float, duration: float) -> dict[str, Any]:
    writer = Writer(path, migrations=path.parent / "migrations", wal_autocheckpoint=checkpoint)
    await writer.start()
    replica = None
    if replicate:
        replica = Replica(path, f"file://{path.parent / 'replica'}", check_every=None)
        replica.prepare()
        await replica.start()
    running, measuring = True, False
    latencies: list[float] = []

    async def producer(k: int) -> None:
        i = k * 7919
        while running:
            cmd = Add(id=IDS[i & _IDS_MASK], n=1)
            i += 1
            t0 = time.perf_counter()
            await writer.do(cmd)
            if measuring:
                latencies.append(time.perf_counter() - t0)

    tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
    await asyncio.sleep(warmup)
    c0, cpu0, t0, others = writer.commands, time.process_time(), time.perf_counter(), OtherLoad()
    ls0 = process_cpu(replica.pid) if replica else 0.0
    measuring = True
    await asyncio.sleep(duration)
    measuring = False
    t1, cpu1, c1, other = time.perf_counter(), time.process_time(), writer.commands, others.stop()
    ls1 = process_cpu(replica.pid) if replica else 0.0
    running = False
    await asyncio.gather(*tasks)
    await writer.close()
    if replica is not None:
        await replica.stop()
    wal = Path(f"{path}-wal")
    n = c1 - c0
    return {
        "rate": n / (t1 - t0),
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "cpu_us": (cpu1 - cpu0) / n * 1e6,
        "litestream_us": (ls1 - ls0) / n * 1e6,
        "wal_mb": wal.stat().st_size / 1e6 if wal.exists() else 0.0,
        "other_cores": other,
    }


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of another process so far, from /proc."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_writer(tmp: Path, producers: list[int], reps: int, warmup: float, duration: float) -> None:
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rep in range(reps):
        for p in producers:
            order = list(VARIANTS)
            random.Random(rep * 31 + p).shuffle(order)  # interleaved, in a different order each round
            for name in order:
                replicate, checkpoint = VARIANTS[name]
                path = fresh(tmp, name, SCHEMA)
                r = asyncio.run(writer_run(path, replicate, checkpoint, p, warmup, duration))
                results.setdefault((name, p), []).append(r)
                shutil.rmtree(path.parent, ignore_errors=True)
    print(f"## Writer with replication on and off ({reps} rounds of {duration:.1f} s, medians)\n")
    print("| P | variant | commands/s | vs off | p50 ms | p99 ms | CPU µs/command: app | Litestream | WAL at the end MB | other cores |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in producers:
        base = statistics.median(r["rate"] for r in results[("off", p)])
        for name in VARIANTS:
            rs = results[(name, p)]
            rate = statistics.median(r["rate"] for r in rs)
            print(f"| {p} | {name} | {rate:,.0f} | {rate / base:.2f}x | "
                  f"{statistics.median(r['p50_ms'] for r in rs):.2f} | {statistics.median(r['p99_ms'] for r in rs):.2f} | "
                  f"{statistics.median(r['cpu_us'] for r in rs):.1f} | {statistics.median(r['litestream_us'] for r in rs):.1f} | "
                  f"{statistics.median(r['wal_mb'] for r in rs):.1f} | "
                  f"{statistics.median(r['other_cores'] for r in rs):.2f} |")  # fmt: skip
    print()


# -- the recovery point -------------------------------------------------------------------------


class Append(Command):
    def apply(self, tx: Tx) -> int:
        n = tx.scalar("SELECT coalesce(max(n), 0) + 1 FROM seq")
        tx.execute("INSERT INTO seq (n, payload) VALUES (?, randomblob(500))", (n,))
        return n


RPO_CHILD = """
import asyncio, os, sys, time
sys.path[:0] = sys.argv[3:5]
from replica import Append
from fastapi_lith import Writer
from fastapi_lith.ops import litestream
from fastapi_lith.ops.replica import Replica

async def main():
    path = sys.argv[1]
    writer = Writer(path, migrations=os.path.dirname(path) + "/migrations", wal_autocheckpoint=litestream.WRITER_CHECKPOINT_PAGES)
    await writer.start()
    replica = Replica(path, sys.argv[2], check_every=None)
    replica.prepare()
    await replica.start()
    while replica.pid is None:
        await asyncio.sleep(0.01)
    print("pid", replica.pid, flush=True)
    async def producer():
        while True:
            n = await writer.do(Append())
            print(n, time.monotonic(), flush=True)
    await asyncio.gather(*(producer() for _ in range(4)))

asyncio.run(main())
"""


def bench_recovery_point(tmp: Path, runs: int) -> None:
    rows = []
    for run in range(runs):
        path = fresh(tmp, "rpo", "CREATE TABLE seq (n INTEGER PRIMARY KEY, payload BLOB NOT NULL);")
        url = f"file://{path.parent / 'replica'}"
        child = subprocess.Popen(
            [sys.executable, "-c", RPO_CHILD, str(path), url, str(HERE.parent), str(HERE)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        pid = int(child.stdout.readline().split()[1])
        deadline = time.monotonic() + 2.0 + random.random() * 2.0
        acked: dict[int, float] = {}
        for line in child.stdout:
            n, at = line.split()
            acked[int(n)] = float(at)
            if time.monotonic() > deadline:
                break
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        child.send_signal(signal.SIGKILL)
        child.wait()
        for line in child.stdout.read().splitlines():  # acknowledged before the kill, read after it
            n, at = line.split()
            acked[int(n)] = float(at)
        out = path.parent / "restored.db"
        t0 = time.perf_counter()
        litestream.restore(url, out)
        restore_s = time.perf_counter() - t0
        with sqlite3.connect(out) as conn:
            k = conn.execute("SELECT count(*) FROM seq").fetchone()[0]
        lost = [at for n, at in acked.items() if n > k]
        rows.append((len(acked), len(lost), killed_at - min(lost) if lost else 0.0, restore_s))
        shutil.rmtree(path.parent, ignore_errors=True)
    print(f"## Recovery point: kill -9 under load, sync interval 1 s ({runs} runs)\n")
    print("| run | acknowledged | lost | oldest lost, s before the kill | restore s |")
    print("|---|---|---|---|---|")
    for i, (a, lost, window, restore_s) in enumerate(rows, 1):
        print(f"| {i} | {a:,} | {lost:,} | {window:.2f} | {restore_s:.2f} |")
    print(f"\nmedian oldest lost {statistics.median(r[2] for r in rows):.2f} s, worst {max(r[2] for r in rows):.2f} s\n")


# -- restore time --------------------------------------------------------------------------------


def big_database(path: Path, mb: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE doc (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO doc (body) VALUES (randomblob(1000))", [()] * (mb * 1000))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def bench_restore(tmp: Path, mb: int, reps: int, s3: bool) -> None:
    path = fresh(tmp, "restore", "")
    big_database(path, mb)
    size = path.stat().st_size
    targets = {"file://": f"file://{path.parent / 'replica'}"}
    moto = None
    env = dict(os.environ)
    if s3:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        while True:
            try:
                httpx.put(f"http://127.0.0.1:{port}/lith")  # the bucket
                break
            except httpx.TransportError:
                time.sleep(0.05)
        targets["s3 (moto, 127.0.0.1)"] = f"s3://lith/bench?endpoint=http://127.0.0.1:{port}&region=us-east-1"
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"})
        os.environ.pop("AWS_CA_BUNDLE", None)
    print(f"## Restore time, {size / 1e6:.0f} MB database (median of {reps})\n")
    print("| replica | first upload s | restore s | restored MB |")
    print("|---|---|---|---|")
    try:
        for name, url in targets.items():
            replica = Replica(path, url, check_every=None)
            replica.prepare()

            async def upload() -> float:
                t0 = time.perf_counter()
                await replica.start()
                while (pos := litestream.replica_position(url)) is None or pos.txid < 1:
                    await asyncio.sleep(0.1)
                took = time.perf_counter() - t0
                await replica.stop()
                return took

            first = asyncio.run(upload())
            times = []
            for i in range(reps):
                out = path.parent / f"restored-{i}.db"
                t0 = time.perf_counter()
                litestream.restore(url, out)
                times.append(time.perf_counter() - t0)
                restored = out.stat().st_size
                out.unlink()
            print(f"| {name} | {first:.2f} | {statistics.median(times):.2f} | {restored / 1e6:.1f} |")
    finally:
        if moto is not None:
            moto.terminate()
        os.environ.clear()
        os.environ.update(env)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", default="1,50")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rpo-runs", type=int, default=5)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--no-s3", action="store_true", help="skip the restore from moto's S3 server")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="writer,rpo,restore")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.duration, args.rpo_runs = 2, 2.0, 3
    print_conditions(loop="asyncio")
    print(f"litestream {litestream.VERSION} ({litestream.find_binary()})\n")
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="lith-bench-replica-") as tmp:
        if "writer" in only:
            bench_writer(Path(tmp), [int(p) for p in args.producers.split(",")], args.reps, 1.0, args.duration)
        if "rpo" in only:
            bench_recovery_point(Path(tmp), args.rpo_runs)
        if "restore" in only:
            bench_restore(Path(tmp), args.mb, 3, not args.no_s3)


if __name__ == "__main__":
    main()
