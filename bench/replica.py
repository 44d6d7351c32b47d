"""Replication: what Litestream costs the writer, what a dead disk loses, how long a restore takes.

1. Writer with replication on and off, same run: the writer scenario's command from P
   closed-loop producers, NORMAL, interleaved:
     off            the writer alone, SQLite's automatic checkpoint at 1,000 pages
     on             what `Lith(replica=...)` runs: Litestream replicating to a file:// replica,
                    the writer's automatic checkpoint raised so that Litestream checkpoints
     on, ckpt 1000  the same with the writer's checkpoint left at SQLite's 1,000 pages
2. Recovery point: 4 producers append a sequence in an app with a replica (`Lith(replica=...)`,
   sync interval 1 s); at a random moment Litestream and the app's process are killed
   (SIGKILL), the replica is restored and compared: acknowledged commands lost, and how long
   before the kill the oldest lost one was acknowledged.
3. Restore time of a 50 MB database, from a file:// replica and from moto's S3 server on
   127.0.0.1: the restore an app does before it opens a missing file (`Replica.prepare()`:
   `litestream restore`, then the file fsynced into place), median of 3.

    python -m bench.replica            # about 3 minutes
    python -m bench.replica --quick    # about a minute
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi_lith import Command, Lith, Tx, Writer
from fastapi_lith.ops import Replica

from .lib import harness
from .lib.load import produce
from .lib.proc import Usage, Window
from .lib.stats import median, ratio
from .writer import IDS, MASK, SCHEMA, Add

CHECKPOINT_WITH_REPLICA = 10_000  # pages: what a Lith's writer checkpoints at while a replica runs (docs/backups.md)
VARIANTS = {"off": (False, 1000), "on": (True, CHECKPOINT_WITH_REPLICA), "on, ckpt 1000": (True, 1000)}


def fresh(tmp: Path, schema: str) -> Path:
    folder = Path(tempfile.mkdtemp(dir=tmp))
    (folder / "migrations").mkdir()
    (folder / "migrations" / "0001.sql").write_text(schema)
    return folder / "bench.db"


async def writer_run(path: Path, replicate: bool, checkpoint: int, producers: int, warmup: float,
                     seconds: float) -> dict[str, float]:
    writer = Writer(path, migrations=path.parent / "migrations", wal_autocheckpoint=checkpoint)
    await writer.start()
    replica = None
    if replicate:
        replica = Replica(path, f"file://{path.parent / 'replica'}", check_every=None)
        replica.prepare()
        await replica.start()
    edges: dict[str, Any] = {}

    def opened() -> None:
        edges.update(w=Window.open(), ls=Usage.of(replica.pid).cpu if replica and replica.pid else 0.0)

    def closed() -> None:
        edges.update(f=edges["w"].close(), ls1=Usage.of(replica.pid).cpu if replica and replica.pid else 0.0)

    load = await produce(lambda k, i: writer.do(Add(id=IDS[(k * 7919 + i) & MASK], n=1)), producers, warmup=warmup,
                         seconds=seconds, opened=opened, closed=closed)
    await writer.close()
    if replica is not None:
        await replica.stop()
    f, n = edges["f"], max(1, load.done)
    return {"rate": load.rate, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms, "cpu_us": f.cores * f.seconds / n * 1e6,
            "litestream_us": (edges["ls1"] - edges["ls"]) / n * 1e6, "others": f.others}


class Append(Command):
    def apply(self, tx: Tx) -> int:
        n = tx.scalar("SELECT coalesce(max(n), 0) + 1 FROM seq")
        tx.execute("INSERT INTO seq (n, payload) VALUES (:n, randomblob(500))", {"n": n})
        return int(n)


def restore(url: str, out: Path) -> bool:
    """The replica's latest state into the missing file `out`, as an app's start restores it."""
    return Replica(out, url, check_every=None).prepare()


async def appender(path: str, url: str) -> None:
    """A child: an app with a replica, printing each acknowledged number until killed."""
    lith = Lith(path, migrations=os.path.dirname(path) + "/migrations", replica=url, replica_check_every=None)
    async with lith.lifespan(ticks=False):
        replica = lith.replica
        assert replica is not None
        while replica.pid is None:
            await asyncio.sleep(0.01)
        print("pid", replica.pid, flush=True)

        async def producer() -> None:
            while True:
                print(await lith.writer.do(Append()), time.monotonic(), flush=True)

        await asyncio.gather(*(producer() for _ in range(4)))


def recovery_point(tmp: Path, seconds: float) -> dict[str, float]:
    path = fresh(tmp, "CREATE TABLE seq (n INTEGER PRIMARY KEY, payload BLOB NOT NULL);")
    url = f"file://{path.parent / 'replica'}"
    child = harness.child("appender", path=str(path), url=url)
    litestream_pid = int(child.stdout.readline().split()[1])
    deadline = time.monotonic() + seconds * (1 + random.random())
    acked: dict[int, float] = {}
    for line in child.stdout:
        n, at = line.split()
        acked[int(n)] = float(at)
        if time.monotonic() > deadline:
            break
    killed_at = time.monotonic()
    os.kill(litestream_pid, signal.SIGKILL)  # the two processes this run started, by their pids
    child.send_signal(signal.SIGKILL)
    child.wait()
    for line in child.stdout.read().splitlines():  # acknowledged before the kill, read after it
        parts = line.split()
        if len(parts) == 2:  # the last line may be cut short by the kill
            acked[int(parts[0])] = float(parts[1])
    out = path.parent / "restored.db"
    restore(url, out)
    with sqlite3.connect(out) as conn:
        kept = conn.execute("SELECT count(*) FROM seq").fetchone()[0]
    lost = [at for n, at in acked.items() if n > kept]
    shutil.rmtree(path.parent, ignore_errors=True)
    return {"acknowledged": float(len(acked)), "lost": float(len(lost)),
            "oldest_lost_s": killed_at - min(lost) if lost else 0.0}


def restore_times(tmp: Path, mb: int, reps: int, s3: bool) -> dict[str, float]:
    path = fresh(tmp, "")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE doc (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO doc (body) VALUES (randomblob(1000))", [()] * (mb * 1000))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    targets = {"file": f"file://{path.parent / 'replica'}"}
    moto = None
    env = dict(os.environ)
    if s3:
        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                httpx.put(f"http://127.0.0.1:{port}/lith")  # the bucket
                break
            except httpx.TransportError:
                time.sleep(0.05)  # moto's port is not open yet: nothing else to wait on
        targets["s3"] = f"s3://lith/bench?endpoint=http://127.0.0.1:{port}&region=us-east-1"
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"})
        os.environ.pop("AWS_CA_BUNDLE", None)  # Litestream refuses one; moto speaks plain HTTP here
    out: dict[str, float] = {"mb": path.stat().st_size / 1e6}
    try:
        for name, url in targets.items():
            replica = Replica(path, url, check_every=None)
            replica.prepare()

            async def upload(replica: Replica = replica) -> None:
                await replica.start()  # once Litestream has opened the database
                await replica.stop()  # it uploads what is left, then exits

            asyncio.run(upload())
            times = []
            for i in range(reps):
                restored = path.parent / f"restored-{i}.db"
                t0 = time.perf_counter()
                if not restore(url, restored):
                    raise AssertionError(f"{url} held no copy to restore")
                times.append(time.perf_counter() - t0)
                with sqlite3.connect(restored) as check:
                    rows = check.execute("SELECT count(*) FROM doc").fetchone()[0]
                if rows != mb * 1000:
                    raise AssertionError(f"restored {rows} rows of {mb * 1000}")
                restored.unlink()
            out[f"{name}_restore_s"] = median(times)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait()
        os.environ.clear()
        os.environ.update(env)
    return out


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--producers", default="1,50")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rpo-runs", type=int, default=5)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--no-s3", action="store_true", help="leave out the restore from moto's S3 server")


def measure(args: argparse.Namespace) -> harness.Result:
    producers = [50] if args.smoke else [int(p) for p in args.producers.split(",")]
    reps, seconds, rpo_runs, mb = (1, 0.3, 1, 2) if args.smoke else (2, 1.0, 2, args.mb) if args.quick \
        else (args.reps, args.seconds, args.rpo_runs, args.mb)
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="lith-bench-replica-") as folder:
        tmp = Path(folder)
        for rep in range(reps):
            for p in producers:
                order = list(VARIANTS)
                random.Random(rep * 31 + p).shuffle(order)  # interleaved, in another order each round
                for name in order:
                    path = fresh(tmp, SCHEMA)
                    run = asyncio.run(writer_run(path, *VARIANTS[name], p, 0.5, seconds))
                    runs.setdefault(f"{name} P={p}", []).append(run)
                    shutil.rmtree(path.parent, ignore_errors=True)
        rpo = [recovery_point(tmp, 0.5 if args.smoke else 2.0) for _ in range(rpo_runs)]
        restore = restore_times(tmp, mb, 1 if args.smoke else 3, not (args.no_s3 or args.smoke))
    med = {k: {f: median([r[f] for r in rs]) for f in rs[0]} for k, rs in runs.items()}
    lines = [f"Writer, {reps} rounds of {seconds:g} s, medians:\n",
             "| P | variant | commands/s | / off | p50 ms | p99 ms | CPU µs/command: app | Litestream "
             "| others' cores |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in producers:
        base = med[f"off P={p}"]["rate"]
        for name in VARIANTS:
            m = med[f"{name} P={p}"]
            lines.append(f"| {p} | {name} | {m['rate']:,.0f} | {ratio(m['rate'], base):.2f} | {m['p50_ms']:.2f} "
                         f"| {m['p99_ms']:.2f} | {m['cpu_us']:.1f} | {m['litestream_us']:.1f} | {m['others']:.2f} |")
    lines += ["", "Recovery point, kill -9 under load, sync interval 1 s:", "",
              "| run | acknowledged | lost | oldest lost, s before the kill |", "|---|---:|---:|---:|"]
    lines += [f"| {i} | {r['acknowledged']:,.0f} | {r['lost']:,.0f} | {r['oldest_lost_s']:.2f} |"
              for i, r in enumerate(rpo, 1)]
    lines += ["", f"Restore of a {restore['mb']:.0f} MB database: "
              + ", ".join(f"{k.split('_')[0]} {v:.2f} s" for k, v in restore.items() if k.endswith("_restore_s"))]
    p = producers[-1]
    figures = {f"off_{p}_cmd_s": med[f"off P={p}"]["rate"], f"on_{p}_cmd_s": med[f"on P={p}"]["rate"],
               "oldest_lost_s": max(r["oldest_lost_s"] for r in rpo), "file_restore_s": restore["file_restore_s"]}
    return harness.Result(figures, "\n".join(lines), {"writer": med, "rpo": rpo, "restore": restore})


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments, children={"appender": appender})
