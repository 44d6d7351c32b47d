"""The kanban board over HTTP: 200 tabs watch a 200-card board while 200 people move cards.

The example app (`examples/kanban`) runs as its own uvicorn, started with the deploy's flags
(access log off: a line per POST would be CPU the figures carry), on a board seeded by
`python -m examples.kanban.seed DB --cards 200` (about 146 KB per board event). This process is
the load, on the raw asyncio client (bench/lib/client.py), so its own CPU is printed too.

  streams    one per tab, `GET /lith/stream?views=board/1,outcome/{tab}&tab={tab}` with
             `Accept-Encoding` zstd or br, decoded and split into events; a stream the server
             ends is reopened at once, as Datastar's `retry: 'always'` would, and counted
  producers  producer i acts as tab i: `POST /cards/move` with the JSON the page sends, on its
             own keep-alive connection, every op unique; it sends its next move once the POST
             returned and its tab's stream showed that op (`data-signals:done`), paced so all
             of them together offer the run's rate. The rate achieved is what the server holds.

Figures over a window after a warm-up: moves/s, post→frame latency (writing the POST to
decoding the acting tab's event that carries its op), post→204, board frames per tab per
second, compressed bytes per frame, server cores and CPU per board frame, MiB per stream, and
lost moves; and the server's own view, scraped from its metrics as the example's operator
(`GET /lith/metrics`): renders and ticks per second, late ticks, frames and bytes sent, and the
writer's commands per batch and busy share. Beside them, the ceiling: the same MoveCard
commands from 200 producers through `await writer.do(cmd)` in one process, no HTTP.

    python -m bench.kanban                          # 5 runs of 20 s and the ceiling: about 3 minutes
    python -m bench.kanban --quick --plot           # bench/plots/kanban-latency.svg
    python -m bench.kanban --runs zstd@800 --workers 2 --profile
    python -m bench.kanban --quick --against main --runs zstd@800,zstd@40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .lib import client, conditions, harness, plot
from .lib.checkout import LIBRARY, child_env
from .lib.load import produce
from .lib.metrics import Counts
from .lib.proc import Window
from .lib.profile import Spy
from .lib.server import Server
from .lib.stats import NAN, median, number, percentile, ratio

BOARD = 1
DONE = b'data-signals:done="'
# lith (Go), 200 tabs on its 200-card board (DESIGN.md): cores and bytes per frame by encoding,
# and its kanban's post→frame p95.
LITH = {"zstd": {"cores": 2.7, "bytes": 3162}, "br": {"cores": 5.2, "bytes": 1010}}
LITH_P95_MS = 98.0
OPERATOR = ("operator", "bench")  # the example's operator: KANBAN_OPERATOR_PASSWORD, set for the server


def seed(path: Path, cards: int) -> None:
    subprocess.run([sys.executable, "-m", "examples.kanban.seed", str(path), "--cards", str(cards)],
                   cwd=LIBRARY, env=child_env(), check=True, capture_output=True)


def layout(path: Path) -> tuple[list[int], list[int]]:
    """The card ids and lane ids of the board (read only)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        lanes = [r[0] for r in conn.execute("SELECT id FROM lane WHERE board_id = ? ORDER BY position", (BOARD,))]
        cards = [r[0] for r in conn.execute(
            "SELECT card.id FROM card JOIN lane ON lane.id = card.lane_id WHERE lane.board_id = ?", (BOARD,))]
    finally:
        conn.close()
    return cards, lanes


class Tabs:
    """The tabs' streams: what they received, and the op each producer waits to see."""

    def __init__(self, port: int, encoding: str) -> None:
        self.port, self.encoding = port, encoding
        self.streams: list[client.SseStream] = []
        self.waiting: dict[str, tuple[int, asyncio.Future[float]]] = {}
        self.board_frames = self.outcomes = self.reconnects = 0
        self.board_at: dict[str, float] = {}  # when each tab's last board event was decoded
        self.closing = False

    def on_event(self, stream: client.SseStream, event: bytes, at: float) -> None:
        head = event[:120]
        if b'id="outcome"' in head:
            self.outcomes += 1
            i = event.find(DONE)
            if i >= 0:
                op = int(event[i + len(DONE):event.index(b'"', i + len(DONE))])
                waiting = self.waiting.get(stream.tab)
                if waiting is not None and op >= waiting[0] and not waiting[1].done():
                    waiting[1].set_result(at)
        # A board frame: the whole board, or its patches' events, which decode together.
        elif not event.startswith(b":") and self.board_at.get(stream.tab) != at:
            self.board_at[stream.tab] = at
            self.board_frames += 1

    async def open(self, tab: str) -> client.SseStream:
        path = f"/lith/stream?views=board/{BOARD},outcome/{tab}&tab={tab}"
        stream = await client.open_stream(self.port, path, self.encoding, self.on_event, tab)
        stream.on_end = self.ended
        self.streams.append(stream)
        return stream

    def ended(self, stream: client.SseStream) -> None:
        if not self.closing:
            self.reconnects += 1
            asyncio.get_running_loop().create_task(self.open(stream.tab))

    def totals(self) -> tuple[int, int]:
        """Body bytes decoded so far, and the frames they carried (a board's patches are one)."""
        return sum(s.body for s in self.streams), self.board_frames + self.outcomes


async def scrape(port: int) -> Counts | None:
    """The server's metrics as its operator reads them; None from a library that has no scrape."""
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", auth=OPERATOR, timeout=30) as http:
        answer = await http.get("/lith/metrics")
    return Counts.parse(answer.text) if answer.status_code == 200 else None


def served(m: Counts | None, seconds: float) -> dict[str, float]:
    """What the server says it did over the window."""
    if m is None:
        return {}
    frames = m.get("lith_stream_frames_total")
    return {"renders_s": m.total("lith_hub_renders_total") / seconds,
            "ticks_s": m.get("lith_hub_ticks_total") / seconds,
            "late_ticks": m.get("lith_hub_late_ticks_total"), "frames_sent_s": frames / seconds,
            "sent_bytes_per_frame": m.get("lith_stream_bytes_total", stage="sent") / frames if frames else NAN,
            "per_batch": m.mean("lith_writer_batch_size"), "batch_ms": m.mean("lith_writer_commit_seconds") * 1e3,
            "tick_ms": m.mean("lith_hub_tick_seconds") * 1e3, "render_ms": m.mean("lith_hub_render_seconds") * 1e3,
            "writer_busy": m.get("lith_writer_commit_seconds_sum") / seconds,
            # zstd writes compressed per frame sent: 1 when every stream compresses its own.
            "cohort_compressed_per_frame": (m.get("lith_stream_cohort_writes_total", done="compressed") / frames
                                            if frames else NAN)}


async def load(server: Server, encoding: str, rate: float, tabs_n: int, cards: list[int], lanes: list[int],
               warmup: float, seconds: float, profile: bool) -> dict[str, Any]:
    tabs = Tabs(server.port, encoding)
    rss0 = Window.open(server.pid).close().rss_mib
    gate = asyncio.Semaphore(32)
    names = [f"{encoding}-{i:03d}" for i in range(tabs_n)]

    async def open_one(tab: str) -> None:
        async with gate:
            await asyncio.wait_for((await tabs.open(tab)).opened, 30)

    await asyncio.gather(*(open_one(t) for t in names))
    posters = [await client.Poster.connect(server.port) for _ in names]
    ops = iter(range(1, 1 << 62))
    post_ms: list[float] = []
    frame_ms: list[float] = []
    lost = [0]
    edges: dict[str, Any] = {}

    async def send(k: int, i: int) -> None:
        rng = random.Random(k * 7919 + i)
        op, tab = next(ops), names[k]
        body = json.dumps({"tab": tab, "op": op, "card_id": rng.choice(cards), "lane_id": rng.choice(lanes),
                           "position": rng.randrange(0, 60)}, separators=(",", ":")).encode()
        seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        tabs.waiting[tab] = (op, seen)
        t0 = time.perf_counter()
        status = await posters[k].post("/cards/move", body)
        t1 = time.perf_counter()
        if status != 204:
            raise RuntimeError(f"POST answered {status}")
        try:
            at = await asyncio.wait_for(seen, 10)
        except TimeoutError:
            lost[0] += "server" in edges
            raise
        if "server" in edges:
            post_ms.append((t1 - t0) * 1e3)
            frame_ms.append((at - t0) * 1e3)

    def opened() -> None:
        edges.update(server=Window.open(server.pid), client=Window.open(), totals=tabs.totals(),
                     board=tabs.board_frames, scraped=asyncio.ensure_future(scrape(server.port)))
        if profile:
            edges["spy"] = Spy(server.pid, seconds, subprocesses=server.workers > 1)

    def closed() -> None:
        edges.update(s=edges["server"].close(), c=edges["client"].close(), totals1=tabs.totals(),
                     board1=tabs.board_frames, scraped1=asyncio.ensure_future(scrape(server.port)))

    done = await produce(send, tabs_n, warmup=warmup, seconds=seconds, rate=rate, opened=opened, closed=closed)
    tabs.closing = True
    for s in tabs.streams:
        s.close()
    for p in posters:
        p.close()
    s, c = edges["s"], edges["c"]
    before, after = await edges["scraped"], await edges["scraped1"]
    metrics = served(after - before if before is not None and after is not None else None, s.seconds)
    body = edges["totals1"][0] - edges["totals"][0]
    frames = edges["totals1"][1] - edges["totals"][1]
    board = edges["board1"] - edges["board"]
    if profile:
        spy = edges["spy"]
        print(f"\nprofile of the server, {encoding} at {rate:g}/s ({spy.command}):\n{spy.summary()}\n")
    return {
        "moves_s": done.rate, "p50_ms": percentile(frame_ms, 50), "p95_ms": percentile(frame_ms, 95),
        "post_p50_ms": percentile(post_ms, 50), "board_frames_per_tab_s": board / s.seconds / tabs_n,
        "bytes_per_frame": body / frames if frames else NAN, "server_cores": s.cores,
        "server_ms_per_board_frame": s.cores * s.seconds / board * 1e3 if board else NAN,
        "mib_per_stream": (s.rss_mib - rss0) / tabs_n, "client_cores": c.cores, "others": s.others,
        "waiting": s.waiting, "lost": float(lost[0]), "reconnects": float(tabs.reconnects),
        "errors": float(sum(done.errors.values())), **metrics,
    }


def one_run(tmp: Path, template: Path, encoding: str, rate: float, args: argparse.Namespace, warmup: float,
            seconds: float) -> dict[str, Any]:
    db = tmp / f"{encoding}-{rate:g}.db"
    shutil.copy(template, db)
    cards, lanes = layout(db)
    env = {"KANBAN_DB": str(db), "KANBAN_OPERATOR_PASSWORD": OPERATOR[1]}
    if args.workers > 1:  # one scrape over every worker (docs/metrics.md): a fresh folder per run
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(dir=tmp, prefix="metrics-")
    with Server("examples.kanban.app:app", env=env, workers=args.workers, access_log=False,
                ready=f"/boards/{BOARD}", log=tmp / f"{encoding}-{rate:g}.log") as server:
        result: dict[str, Any] = client.run(load(server, encoding, rate, args.tabs, cards, lanes, warmup, seconds,
                                                 args.profile))
        return result


async def ceiling(db: str, producers: int, warmup: float, seconds: float) -> dict[str, float]:
    """A child process: the example's writer alone, MoveCard from a closed loop of producers."""
    import os

    os.environ["KANBAN_DB"] = db  # the example's Lith reads it at import
    from examples.kanban.commands import MoveCard
    from examples.kanban.live import lith

    cards, lanes = layout(Path(db))
    await lith.writer.start()
    ops = iter(range(1, 1 << 62))

    def send(k: int, i: int) -> Any:
        rng = random.Random(k * 7919 + i)
        return lith.writer.do(MoveCard(tab=f"ceiling-{k:03d}", op=next(ops), card_id=rng.choice(cards),
                                       lane_id=rng.choice(lanes), position=rng.randrange(0, 60)))

    done = await produce(send, producers, warmup=warmup, seconds=seconds)
    await lith.writer.close()
    assert done.cost is not None
    return {"moves_s": done.rate, "cpu_us": ratio(done.cost.cores, done.rate) * 1e6, "p50_ms": done.p50_ms}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", default="",
                    help="ENCODING@RATE, comma-separated (default: zstd at 40, 200, 400, 800 and br at 800)")
    ap.add_argument("--tabs", type=int, default=200)
    ap.add_argument("--cards", type=int, default=200)
    ap.add_argument("--workers", type=int, default=1, help="uvicorn --workers")
    ap.add_argument("--seconds", type=float, default=0.0, help="the window of each run (default 20)")
    ap.add_argument("--no-ceiling", action="store_true", help="leave out the writer alone")
    ap.add_argument("--profile", action="store_true", help="py-spy over the server during each window")


def measure(args: argparse.Namespace) -> harness.Result:
    if args.smoke:
        args.tabs, args.cards = 10, 20
    spec = args.runs or ("zstd@40" if args.smoke else "zstd@40,zstd@800,br@800" if args.quick
                         else "zstd@40,zstd@200,zstd@400,zstd@800,br@800")
    runs = [(e, float(r)) for e, r in (x.split("@") for x in spec.split(","))]
    warmup, seconds = (0.5, 1.0) if args.smoke else (2.0, 6.0) if args.quick else (3.0, args.seconds or 20.0)
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-kanban-"))
    results: dict[str, dict[str, Any]] = {}
    try:
        template = tmp / "seeded.db"
        seed(template, args.cards)
        for encoding, rate in runs:
            key = f"{encoding}@{rate:g}"
            results[key] = r = one_run(tmp, template, encoding, rate, args, warmup, seconds)
            print(f"  {key}: {r['moves_s']:.0f} moves/s, post→frame p50/p95 {r['p50_ms']:.0f}/{r['p95_ms']:.0f} ms, "
                  f"{r['server_cores']:.2f} server cores, {r['bytes_per_frame']:,.0f} B/frame, client "
                  f"{r['client_cores']:.2f} cores, others {r['others']:.2f}, lost {r['lost']:.0f}", flush=True)
        if not args.no_ceiling and not args.smoke:
            db = tmp / "ceiling.db"
            shutil.copy(template, db)
            results["ceiling"] = harness.answer(harness.child("ceiling", db=str(db), producers=args.tabs,
                                                              warmup=warmup, seconds=seconds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, float] = {}
    for key, r in results.items():
        if key == "ceiling":
            figures["ceiling_moves_s"] = r["moves_s"]
            continue
        k = key.replace("@", "_")
        for name in ("moves_s", "p50_ms", "p95_ms", "post_p50_ms", "server_ms_per_board_frame", "bytes_per_frame"):
            figures[f"{k}_{name}"] = r[name]
    return harness.Result(figures, table(results, args), {"runs": results})


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    keys = [k for k in results if k != "ceiling"]
    rows = [("moves/s", "moves_s", 0), ("post→frame p50 ms", "p50_ms", 0), ("post→frame p95 ms", "p95_ms", 0),
            ("post→204 p50 ms", "post_p50_ms", 0), ("board frames per tab per s", "board_frames_per_tab_s", 1),
            ("bytes per frame", "bytes_per_frame", 0), ("server cores", "server_cores", 2),
            ("server ms CPU per board frame", "server_ms_per_board_frame", 3), ("MiB per stream", "mib_per_stream", 2),
            ("server threads waiting for a CPU (cores)", "waiting", 2), ("client cores", "client_cores", 2),
            ("others' cores", "others", 2), ("lost moves", "lost", 0), ("reconnects", "reconnects", 0),
            ("server: renders/s", "renders_s", 1), ("server: ticks/s", "ticks_s", 1),
            ("server: late ticks", "late_ticks", 0),
            ("server: frames sent/s", "frames_sent_s", 0), ("server: bytes sent per frame", "sent_bytes_per_frame", 0),
            ("server: commands per batch", "per_batch", 1), ("server: batch ms, mean", "batch_ms", 1),
            ("server: tick ms, mean", "tick_ms", 1), ("server: render ms, mean", "render_ms", 1),
            ("server: writer busy", "writer_busy", 2),
            ("server: zstd writes compressed for cohorts per frame", "cohort_compressed_per_frame", 3)]
    lines = [f"{args.tabs} tabs, {args.workers} server process(es); rows: offered moves/s by encoding.\n",
             "| figure | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {label} | " + " | ".join(number(results[k].get(key, NAN), d) for k in keys) + " |"
              for label, key, d in rows]
    z, b = LITH["zstd"], LITH["br"]
    lines.append(f"\nlith (Go), 200 tabs: zstd {z['cores']} cores and {z['bytes']:,} B/frame, "
                 f"br {b['cores']} cores and {b['bytes']:,} B/frame; its kanban's p95 {LITH_P95_MS:.0f} ms.")
    if "ceiling" in results:
        c = results["ceiling"]
        lines.append(f"The ceiling, the writer alone in process: {c['moves_s']:,.0f} moves/s, "
                     f"{c['cpu_us']:.0f} µs CPU per move.")
    return "\n".join(lines)


def draw(ours: list[harness.Result], theirs: list[harness.Result], rev: str, args: argparse.Namespace) -> list[Path]:
    fig, ax = plot.figure("Kanban over HTTP, 200 tabs, zstd: post→frame latency",
                          "moves/s offered", "post→frame ms")
    for results, label, colour in ((ours, "ours", "tab:blue"), (theirs, rev, "tab:grey")):
        if not results:
            continue
        for q, style in (("p95_ms", "o-"), ("p50_ms", "o:")):
            points = sorted((float(k.split("@")[1]), median([r.data["runs"][k][q] for r in results]))
                            for k in results[-1].data["runs"] if k.startswith("zstd@"))
            if points:
                ax.plot(*zip(*points, strict=True), style, color=colour, label=f"{label}, {q[:3]}")
    ax.plot([800], [LITH_P95_MS], "x", color="tab:red", ms=8, label="lith (Go), p95, 200 tabs")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    caption = conditions.caption(f"python -m bench.kanban{' --quick' if args.quick else ''} --plot")
    return [plot.save(fig, "kanban-latency", caption)]


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments, plot=draw, children={"ceiling": ceiling})
