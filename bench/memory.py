"""Memory per tab, all-inclusive: the server's RSS growth over N open streams, divided by N.

The counter example (its `counter` view and each tab's `outcome/{tab}`, a few hundred bytes a
tab; bench/lib/tabsapp.py) under uvicorn with the deploy's flags, and N real streams from a raw
asyncio client on uvloop in this process (bench/lib/client.py), each read until its first
frames arrived. A fresh server per figure: its RSS after a warm-up (a few hundred streams opened
and closed, so the allocators hold what a stream needs) is the baseline, its RSS with N tabs
open the figure. What the warm-up freed is handed back to the system before the baseline
(`malloc_trim`), so new streams find no free memory to reuse and every checkout starts alike.

  awake       no stream idle long enough to hibernate (hibernate_after longer than the run)
  hibernated  zstd only: every stream idle past a short hibernate_after, its compressor freed
              and the memory handed back to the system (identity keeps nothing to free)

The counter's writes are small enough to go as zstd frames of their own, so its streams hold no
compressor even awake (docs/encoders.md). `--view status` watches the app's `status` view
instead, the count in about 2 KB: a zstd stream opens a window for it, which an awake tab holds.

Layers (`--layers`, 1,000 tabs, identity and zstd): tracemalloc in the server, the growth of
Python's allocations by package, per tab; "outside Python" is the RSS growth less what
tracemalloc saw (zstd's compressors, uvloop's and httptools' buffers, allocator slack).

The file limit is raised to the hard limit (each side needs a socket per tab), and what the
machine allowed is printed.

    python -m bench.memory                          # 1,000, 5,000 and 10,000 tabs
    python -m bench.memory --tabs 1000 --layers --against main
    python -m bench.memory --tabs 10000 --view status
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

from .lib import client, harness
from .lib.checkout import PRELUDE
from .lib.proc import rss
from .lib.server import Server
from .lib.stats import number

KiB = 1024
WARM = 300  # streams opened and closed before the baseline
AT_ONCE = 100  # streams being opened at a time
STARTUP_DEADLINE = 600.0  # a guard against a hang, not a measure
# The library hands what hibernated streams freed back to the system a few seconds later
# (docs/encoders.md, five at most): the hibernated figure is read once that is done.
RELEASE_SETTLE = 6.0
LAYERS = ("uvicorn", "asyncio", "anyio", "starlette", "fastapi", "sse_starlette", "fastapi_lith", "other Python")


def make_app() -> Any:
    """The server's app, in the server process only (MEMORY_SERVER set): the counter example
    with the run's hibernate_after and a probe at /bench/memory."""
    import ctypes
    import tracemalloc

    from bench.lib.tabsapp import app, lith

    lith.hibernate_after = float(os.environ["MEMORY_HIBERNATE"])
    depth = int(os.environ.get("MEMORY_TRACE", "0"))  # frames per traceback; 0: no tracing
    tracing = depth > 0
    if tracing:
        tracemalloc.start(depth)
    marks: dict[str, Any] = {}

    @app.get("/bench/memory", include_in_schema=False)
    async def probe(mark: int = 0, lines: int = 0, trim: int = 0) -> dict[str, Any]:
        """RSS, tasks and streams now; with `mark`, tracemalloc's baseline is taken; later
        calls give the growth since, by file. With `trim`, what the warm-up freed goes back
        to the system first, so every checkout's baseline holds no free memory for the tabs
        to reuse."""
        if trim:
            ctypes.CDLL(None).malloc_trim(0)
        streams = list(lith.hub.streams)
        # Read where it is, not recorded per stream: a record would be memory the figure counts.
        # A stream that hibernated (a checkout before streams said so: whose encoder holds none).
        awake = sum(1 for s in streams if s.encoder is not None
                    and not getattr(s, "hibernated", s.encoder.hibernating))
        answer: dict[str, Any] = {"rss": rss(), "tasks": len(asyncio.all_tasks()), "streams": len(streams),
                                  "awake": awake}
        if tracing:
            snapshot = tracemalloc.take_snapshot()
            if mark:
                marks["base"] = snapshot
            elif "base" in marks:
                stats = snapshot.compare_to(marks["base"], "filename")
                answer["by_file"] = {s.traceback[0].filename: s.size_diff for s in stats if s.size_diff}
                answer["traced"] = sum(s.size_diff for s in stats)
                if lines:
                    by = "traceback" if depth > 1 else "lineno"
                    top = snapshot.compare_to(marks["base"], by)[:lines]
                    answer["lines"] = [[[str(f) for f in s.traceback], s.size_diff, s.count_diff] for s in top]
        return answer

    return app


if os.environ.get("MEMORY_SERVER"):
    app = make_app()


class MemoryServer(Server):
    """The bench's server: uvicorn over the library under test, this bench's app module."""

    @property
    def command(self) -> list[str]:
        launch = PRELUDE + "; from uvicorn.main import main; main()"
        return [sys.executable, "-c", launch, self.app, "--host", "127.0.0.1", "--port", str(self.port), *self.flags]


def raise_file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def probe(port: int, query: str = "") -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /bench/memory?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"probe answered {head[:60]!r}")
    answer: dict[str, Any] = json.loads(body)
    return answer


async def open_tabs(port: int, n: int, encoding: str, prefix: str, view: str) -> list[client.SseStream]:
    """N streams of a page of `view`, each read until its first frames (both views in one write)
    arrived."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(AT_ONCE)
    streams: list[client.SseStream] = []

    async def one(i: int) -> None:
        tab = f"{prefix}{i}"
        first = loop.create_future()

        def on_event(stream: client.SseStream, event: bytes, at: float) -> None:
            if not first.done() and b"datastar-patch-elements" in event:
                first.set_result(None)

        async with gate:
            stream = await client.open_stream(port, f"/lith/stream?views={view},outcome/{tab}&tab={tab}",
                                              encoding, on_event, tab)
            streams.append(stream)
            await stream.opened
            await first

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), STARTUP_DEADLINE)
    return streams


async def until(port: int, done: Any, what: str) -> dict[str, Any]:
    """Probe the server until `done(answer)`; a deadline guards against a hang only."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STARTUP_DEADLINE
    while not done(answer := await probe(port)):
        if loop.time() > deadline:
            raise RuntimeError(f"{what}: still {answer} after {STARTUP_DEADLINE:.0f} s")
        await asyncio.sleep(0.2)  # the server's state, polled: nothing to wait on from here
    return answer


async def one_figure(
    port: int, tabs: int, encoding: str, hibernated: bool, trace: bool, view: str
) -> dict[str, Any]:
    warm = await open_tabs(port, WARM, encoding, "warm", view)
    for stream in warm:
        stream.close()
    await until(port, lambda a: a["streams"] == 0, "the warm-up streams to close")
    base = await probe(port, "trim=1&mark=1" if trace else "trim=1")
    streams = await open_tabs(port, tabs, encoding, "t", view)
    if hibernated:
        await until(port, lambda a: a["awake"] == 0, "every stream to hibernate")
        await asyncio.sleep(RELEASE_SETTLE)
    after = await probe(port)
    for stream in streams:
        stream.close()
    grown = after["rss"] - base["rss"]
    out = {"kib": grown / tabs / KiB, "tasks": (after["tasks"] - base["tasks"]) / tabs,
           "streams": after["streams"], "awake": after["awake"]}
    if trace:
        out["layers"] = layers(after["by_file"], after["traced"], grown, tabs)
    return out


def layer_of(filename: str) -> str:
    parts = Path(filename).parts
    for name in LAYERS[:-1]:
        if name in parts:
            return name
    if "asyncio" in filename or "uvloop" in filename:
        return "asyncio"
    return "other Python"


def layers(by_file: dict[str, int], traced: int, grown: int, tabs: int) -> dict[str, float]:
    """KiB per tab by package, the rest of the RSS growth outside Python."""
    out = dict.fromkeys(LAYERS, 0.0)
    for filename, size in by_file.items():
        out[layer_of(filename)] += size / tabs / KiB
    out["outside Python"] = (grown - traced) / tabs / KiB
    return out


def serve(encoding: str, hibernated: bool, tabs: int, trace: bool, http: str, view: str = "counter") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lith-bench-memory-") as folder:
        env = {"MEMORY_SERVER": "1", "COUNTER_DB": str(Path(folder) / "counter.db"),
               "MEMORY_HIBERNATE": "1" if hibernated else "3600", "MEMORY_TRACE": "1" if trace else "0"}
        with MemoryServer("bench.memory:app", env=env, access_log=False, http=http, ready="/") as server:
            result: dict[str, Any] = client.run(one_figure(server.port, tabs, encoding, hibernated, trace, view))
            return result


CASES = (("identity", False), ("zstd", False), ("zstd", True))


def name(encoding: str, hibernated: bool) -> str:
    return f"{encoding} {'hibernated' if hibernated else 'awake'}"


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tabs", type=int, nargs="+", default=[1_000, 5_000, 10_000])
    ap.add_argument("--layers", action="store_true", help="also tracemalloc's breakdown by package, at 1,000 tabs")
    ap.add_argument("--http", default="httptools", choices=("httptools", "h11"))
    ap.add_argument("--view", default="counter", choices=("counter", "status"),
                    help="the shared view every tab watches: the counter (a few hundred bytes) or the 2 KB status")


def measure(args: argparse.Namespace) -> harness.Result:
    limit = raise_file_limit()
    counts = [50] if args.smoke else [1_000] if args.quick else args.tabs
    if max(counts) + WARM + 500 > limit:  # a socket per tab in each process, and its own files
        raise SystemExit(f"{max(counts)} tabs need about {max(counts) + WARM + 500} files a process; "
                         f"the limit is {limit}")
    figures: dict[str, float] = {}
    lines = [f"Server RSS growth per tab, KiB (tasks per tab), the counter example's `{args.view}` view, "
             f"uvicorn --http {args.http}; file limit {limit}:\n",
             "| tabs | " + " | ".join(name(*case) for case in CASES) + " |", "|---:|" + "---:|" * len(CASES)]
    for tabs in counts:
        row = [number(tabs)]
        for encoding, hibernated in CASES:
            got = serve(encoding, hibernated, tabs, False, args.http, args.view)
            assert got["streams"] == tabs, got
            figures[f"{encoding}_{'hibernated' if hibernated else 'awake'}_{tabs}_kib"] = got["kib"]
            row.append(f"{got['kib']:.1f} ({got['tasks']:.2f})")
        lines.append("| " + " | ".join(row) + " |")
    if args.layers:
        tabs = 50 if args.smoke else 1_000
        lines += ["", f"By layer, KiB per tab at {number(tabs)} tabs (tracemalloc in the server):\n",
                  "| layer | identity | zstd awake |", "|---|---:|---:|"]
        traced = {enc: serve(enc, False, tabs, True, args.http, args.view)["layers"]
                  for enc in ("identity", "zstd")}
        for layer in (*LAYERS, "outside Python"):
            lines.append(f"| {layer} | {traced['identity'][layer]:.1f} | {traced['zstd'][layer]:.1f} |")
            for enc in ("identity", "zstd"):
                figures[f"layer_{enc}_{layer.replace(' ', '_')}_kib"] = traced[enc][layer]
    return harness.Result(figures, "\n".join(lines))


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
