"""Restart gap: SIGTERM to exit of `uvicorn --workers N`, and where the time goes.

The unit's command line (uvloop, httptools, `--timeout-graceful-shutdown 10`, deploy/logging.json
for millisecond timestamps) serving the counter example, with S streams open (identity, each
has had its first frame) and nothing else in flight. SIGTERM goes to the parent alone, as
systemd's `KillMode=mixed` sends it. Measured per run, from the parent's SIGTERM:

  parent     the parent logs "Received SIGTERM" (its supervision loop wakes every 0.5 s)
  children   the last worker logs "Shutting down" (the parent has passed SIGTERM on)
  drained    the last worker logs "Application shutdown complete" (streams ended, writer
             drained, hub stopped)
  exit       the parent process has exited
  app        drained - children: what the app holds (its streams, the writer's drain, the hub)

Then the start: from the new process's spawn to its port answering, as `Restarts, from the
browser's side` in docs/deploying.md describes.

    python bench/restart.py                    # 2 workers, 4 streams, 5 runs
    python bench/restart.py --workers 1 --streams 0 --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from conditions import load_average, print_conditions

ROOT = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start(port: int, workers: int, db: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """The unit's ExecStart, as far as it applies here; returns the process and seconds to answer."""
    cmd = [
        sys.executable, "-m", "uvicorn", "examples.counter.app:app",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--loop", "uvloop", "--http", "httptools", "--timeout-graceful-shutdown", "10",
        "--no-server-header", "--log-config", str(ROOT / "deploy" / "logging.json"),
    ]  # fmt: skip
    env = {**os.environ, "COUNTER_DB": str(db), "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    while not answers(port):
        if proc.poll() is not None:
            raise SystemExit(f"uvicorn exited with {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.02)
    return proc, time.monotonic() - began


def open_streams(port: int, count: int) -> list[threading.Thread]:
    """`count` streams, each returned once it has had its first frame and read on until it ends."""
    ready = threading.Barrier(count + 1)

    def read(i: int) -> None:
        url = f"http://127.0.0.1:{port}/lith/stream?views=counter&tab=bench{i}"
        with httpx.stream("GET", url, headers={"Accept-Encoding": "identity"}, timeout=None) as r:
            told = False
            for chunk in r.iter_raw():
                if not told and b"datastar-patch-elements" in chunk:
                    told = True
                    ready.wait()

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    if count:
        ready.wait(timeout=30)
    return threads


def lines_after(log: Path, offset: int) -> list[tuple[float, str, str]]:
    """(unix time, logger, message) of each line written after `offset`."""
    text = log.read_text()[offset:]
    found = []
    for stamp, _level, name, message in STAMP.findall(text):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found.append((at, name, message))
    return found


def run_once(port: int, workers: int, streams: int, db: Path, log: Path) -> dict[str, float]:
    proc, startup = start(port, workers, db, log)
    threads = open_streams(port, streams)
    offset = len(log.read_text())
    sent = time.time()
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    exit_s = time.monotonic() - began
    for t in threads:
        t.join(timeout=10)
    events = lines_after(log, offset)

    def last(message: str) -> float:
        times = [at for at, _, m in events if m.startswith(message)]
        return max(times) - sent if times else float("nan")

    row = {
        "parent": last("Received SIGTERM") if workers > 1 else 0.0,
        "children": last("Shutting down"),
        "drained": last("Application shutdown complete"),
        "exit": exit_s,
    }
    # What the app holds: from its worker being told to stop to its lifespan's end.
    return {**row, "app": row["drained"] - row["children"], "start": startup}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print_conditions(loop="uvloop", workers=args.workers, streams=args.streams, runs=args.runs)
    with tempfile.TemporaryDirectory(prefix="lith-bench-restart-") as tmp:
        db, log, port = Path(tmp) / "counter.db", Path(tmp) / "uvicorn.log", free_port()
        rows = [run_once(port, args.workers, args.streams, db, log) for _ in range(args.runs)]
    print(f"{'seconds from SIGTERM':<28}" + "".join(f"{k:>10}" for k in rows[0]))
    for i, row in enumerate(rows, 1):
        print(f"{'run ' + str(i):<28}" + "".join(f"{v:>10.3f}" for v in row.values()))
    print(f"{'median':<28}" + "".join(f"{statistics.median(r[k] for r in rows):>10.3f}" for k in rows[0]))
    print("\n(start: spawn to the port answering, the next release's side of the gap)")
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
