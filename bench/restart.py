"""The restart gap: SIGTERM to exit of `uvicorn --workers N`, and where the time goes.

The unit's command line (bench/lib/server.py: uvloop, httptools, the graceful-shutdown timeout,
deploy/logging.json for millisecond timestamps) serving the counter example, with S streams
open (identity, each past its first frame) and nothing else in flight. SIGTERM goes to the
parent alone, as systemd's `KillMode=mixed` sends it. Seconds from the SIGTERM until:

  parent     the parent logs "Received SIGTERM" (its supervision loop wakes every 0.5 s)
  children   the last worker logs "Shutting down" (the parent has passed SIGTERM on)
  drained    the last worker logs "Application shutdown complete" (streams ended, writer
             drained, hub stopped)
  exit       the parent has exited
  app        drained - children: what the app holds (its streams, the writer's drain, the hub)

and the start: from the new process's spawn to its port answering.

    python -m bench.restart                        # 2 workers, 4 streams, 5 runs
    python -m bench.restart --workers 1 --streams 0 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path

from .lib import client, harness
from .lib.server import Server
from .lib.stats import median

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$", re.M)


async def hold_streams(port: int, count: int) -> list[client.SseStream]:
    """`count` streams, each returned once it has had its first frame."""
    firsts: dict[str, asyncio.Future[None]] = {}

    def on_event(stream: client.SseStream, event: bytes, at: float) -> None:
        if b"datastar-patch-elements" in event and not firsts[stream.tab].done():
            firsts[stream.tab].set_result(None)

    streams = []
    for i in range(count):
        tab = f"bench{i}"
        firsts[tab] = asyncio.get_running_loop().create_future()
        path = f"/lith/stream?views=counter&tab={tab}"
        streams.append(await client.open_stream(port, path, "identity", on_event, tab))
    await asyncio.wait_for(asyncio.gather(*firsts.values()), 30)
    return streams


async def run_once(workers: int, streams: int, db: Path, log: Path) -> dict[str, float]:
    server = Server("examples.counter.app:app", env={"COUNTER_DB": str(db)}, workers=workers, log=log)
    await asyncio.to_thread(server.start)
    held = await hold_streams(server.port, streams)
    offset = len(log.read_text())
    sent, began = time.time(), time.monotonic()
    await asyncio.to_thread(server.stop, signal.SIGTERM, 60.0)
    exit_s = time.monotonic() - began
    for s in held:
        s.close()
    events = [(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), message)
              for stamp, _level, _name, message in STAMP.findall(log.read_text()[offset:])]

    def last(message: str) -> float:
        times = [at for at, m in events if m.startswith(message)]
        return max(times) - sent if times else float("nan")

    row = {"parent": last("Received SIGTERM") if workers > 1 else 0.0, "children": last("Shutting down"),
           "drained": last("Application shutdown complete"), "exit": exit_s}
    return {**row, "app": row["drained"] - row["children"], "start": server.started_in}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)


def measure(args: argparse.Namespace) -> harness.Result:
    runs = 1 if args.smoke else 3 if args.quick else args.runs
    workers = 1 if args.smoke else args.workers
    with tempfile.TemporaryDirectory(prefix="lith-bench-restart-") as tmp:
        db, log = Path(tmp) / "counter.db", Path(tmp) / "uvicorn.log"
        rows = [client.run(run_once(workers, args.streams, db, log)) for _ in range(runs)]
    keys = list(rows[0])
    lines = [f"{workers} worker(s), {args.streams} streams; seconds from SIGTERM "
             "(start: spawn to the port answering):\n",
             "| run | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {i} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |" for i, r in enumerate(rows, 1)]
    med = {k: median([r[k] for r in rows]) for k in keys}
    lines.append("| median | " + " | ".join(f"{med[k]:.3f}" for k in keys) + " |")
    return harness.Result({f"{k}_s": v for k, v in med.items()}, "\n".join(lines), {"runs": rows})


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
