"""The dashboard's cost: the server's CPU with 0, 1, 10 and 50 dashboards watching a kanban board's load.

The kanban example (`examples/kanban`, a board seeded with `--cards` cards) runs as its own
uvicorn with the deploy's flags, its dashboard and metrics behind its operator's password. Over
every run the same modest load: `--tabs` tabs watch the board (zstd) while as many producers
move cards at `--rate` moves/s in all. Each run adds W dashboard streams (zstd), opened before
the warm-up, then measures one window:

  server cores       the uvicorn process's CPU per second of the window
  first watcher      cores with one watcher − cores with none, in ms of CPU per second: the
                     shared part (sampling, rendering, the plots), paid once however many watch
  each more          (cores with W watchers − cores with one) / (W − 1), in ms per second:
                     what each further watcher's compression and sending adds
  dashboard renders  renders per second of the dashboard's two views, from the app's own
                     `lith_hub_renders_total{view=...}` (scraped just outside the window)
  frames, bytes      dashboard frames per watcher per second, and compressed bytes per frame

With nobody watching the dashboard's renders must be zero; watched, they stay one per tick for
the numbers (and one a second for the plots) however many watch: every watcher shares them,
and pays only its own compression and sending. `--against` has no meaning here (an older
library has no dashboard).

    python -m bench.dashboard                  # 0, 1, 10, 50 watchers, 10 s windows
    python -m bench.dashboard --quick --watchers 0,1,50
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from .kanban import BOARD, OPERATOR, layout, seed
from .lib import client, harness
from .lib.load import produce
from .lib.metrics import Counts
from .lib.proc import Window
from .lib.server import Server
from .lib.stats import NAN, number

VIEWS = ("lith-dashboard/numbers", "lith-dashboard/plots")


BASIC = "Basic " + base64.b64encode(":".join(OPERATOR).encode()).decode()  # the operator's, as a browser sends it


def renders(port: int) -> dict[str, float]:
    """lith_hub_renders_total by view, from the app's metrics, scraped as its operator."""
    answer = httpx.get(f"http://127.0.0.1:{port}/lith/metrics", auth=OPERATOR, timeout=30)
    answer.raise_for_status()
    return Counts.parse(answer.text).by("lith_hub_renders_total", "view")


class Watchers:
    """Streams of one kind, counted: events (frames and keep-alives) and body bytes."""

    def __init__(self) -> None:
        self.streams: list[client.SseStream] = []
        self.frames = 0

    def on_event(self, stream: client.SseStream, event: bytes, at: float) -> None:
        if not event.startswith(b":"):
            self.frames += 1

    async def open(self, port: int, path: str, tab: str, authorization: str = "") -> None:
        stream = await client.open_stream(port, path, "zstd", self.on_event, tab, authorization=authorization)
        self.streams.append(stream)
        await asyncio.wait_for(stream.opened, 30)

    def bytes(self) -> int:
        return sum(s.body for s in self.streams)

    def close(self) -> None:
        for s in self.streams:
            s.close()


async def run(port: int, pid: int, watchers: int, args: argparse.Namespace, cards: list[int], lanes: list[int],
              warmup: float, seconds: float) -> dict[str, float]:
    tabs, dashboards = Watchers(), Watchers()
    names = [f"tab-{i:03d}" for i in range(args.tabs)]
    for tab in names:
        await tabs.open(port, f"/lith/stream?views=board/{BOARD},outcome/{tab}&tab={tab}", tab)
    for i in range(watchers):
        tab = f"dash-{i:03d}"
        await dashboards.open(port, f"/lith/dashboard/stream?views={','.join(VIEWS)}&tab={tab}", tab, BASIC)
    posters = [await client.Poster.connect(port) for _ in names]
    ops = iter(range(1, 1 << 62))
    edges: dict[str, Any] = {}

    async def send(k: int, i: int) -> None:
        rng = random.Random(k * 7919 + i)
        body = json.dumps({"tab": names[k], "op": next(ops), "card_id": rng.choice(cards),
                           "lane_id": rng.choice(lanes), "position": rng.randrange(0, 60)}).encode()
        status = await posters[k].post("/cards/move", body)
        if status != 204:
            raise RuntimeError(f"POST answered {status}")

    def opened() -> None:  # the scrape first, so that the window does not carry it
        edges.update(renders=renders(port), frames=dashboards.frames, bytes=dashboards.bytes(),
                     server=Window.open(pid))

    def closed() -> None:
        edges.update(s=edges["server"].close(), renders1=renders(port), frames1=dashboards.frames,
                     bytes1=dashboards.bytes())

    done = await produce(send, args.tabs, warmup=warmup, seconds=seconds, rate=args.rate, opened=opened,
                         closed=closed)
    for p in posters:
        p.close()
    tabs.close()
    dashboards.close()
    s = edges["s"]
    rendered = sum(edges["renders1"].get(v, 0.0) - edges["renders"].get(v, 0.0) for v in VIEWS)
    frames = edges["frames1"] - edges["frames"]
    return {
        "moves_s": done.rate, "server_cores": s.cores, "dashboard_renders_s": rendered / s.seconds,
        "frames_per_watcher_s": frames / s.seconds / watchers if watchers else NAN,
        "bytes_per_frame": (edges["bytes1"] - edges["bytes"]) / frames if frames else NAN,
        "others": s.others, "errors": float(sum(done.errors.values())),
    }


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--watchers", default="0,1,10,50", help="dashboard streams per run, comma-separated")
    ap.add_argument("--rate", type=float, default=100.0, help="card moves per second, in all")
    ap.add_argument("--tabs", type=int, default=20, help="tabs watching the board (one producer each)")
    ap.add_argument("--cards", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=0.0, help="the window of each run (default 10)")


def measure(args: argparse.Namespace) -> harness.Result:
    counts = [0, 1, 2] if args.smoke else [int(w) for w in args.watchers.split(",")]
    if args.smoke:
        args.tabs, args.cards, args.rate = 4, 20, 20.0
    warmup, seconds = (0.5, 1.0) if args.smoke else (2.0, 5.0) if args.quick else (3.0, args.seconds or 10.0)
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-dashboard-"))
    results: dict[int, dict[str, float]] = {}
    try:
        template = tmp / "seeded.db"
        seed(template, args.cards)
        for watchers in counts:
            db = tmp / f"{watchers}.db"
            shutil.copy(template, db)
            cards, lanes = layout(db)
            env = {"KANBAN_DB": str(db), "KANBAN_OPERATOR_PASSWORD": OPERATOR[1]}
            with Server("examples.kanban.app:app", env=env, access_log=False, ready=f"/boards/{BOARD}",
                        log=tmp / f"{watchers}.log") as server:
                results[watchers] = r = client.run(run(server.port, server.pid, watchers, args, cards, lanes,
                                                       warmup, seconds))
            print(f"  {watchers} watchers: {r['server_cores']:.3f} server cores, {r['dashboard_renders_s']:.1f} "
                  f"dashboard renders/s, {r['moves_s']:.0f} moves/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    none = results[0]["server_cores"] if 0 in results else NAN
    one = results[1]["server_cores"] if 1 in results else NAN
    figures: dict[str, float] = {}
    for watchers, r in results.items():
        r["first_ms_s"] = (one - none) * 1e3 if watchers == 1 else NAN
        r["each_ms_s"] = (r["server_cores"] - one) / (watchers - 1) * 1e3 if watchers > 1 else NAN
        figures[f"cores_{watchers}"] = r["server_cores"]
        figures[f"renders_s_{watchers}"] = r["dashboard_renders_s"]
    figures["first_watcher_ms_s"] = (one - none) * 1e3
    if max(results) > 1:
        figures["each_more_ms_s"] = results[max(results)]["each_ms_s"]
    return harness.Result(figures, table(results, args), {"runs": {str(k): v for k, v in results.items()}})


def table(results: dict[int, dict[str, float]], args: argparse.Namespace) -> str:
    keys = list(results)
    rows = [("moves/s", "moves_s", 0), ("server cores", "server_cores", 3),
            ("the first watcher: server ms CPU per s (over none)", "first_ms_s", 1),
            ("each more: server ms CPU per s (over one)", "each_ms_s", 2),
            ("dashboard renders/s", "dashboard_renders_s", 1), ("frames per watcher per s", "frames_per_watcher_s", 1),
            ("bytes per dashboard frame", "bytes_per_frame", 0), ("others' cores", "others", 2),
            ("errors", "errors", 0)]
    lines = [f"{args.tabs} tabs on a {args.cards}-card board, {args.rate:g} moves/s offered; columns: dashboard "
             "watchers.\n", "| figure | " + " | ".join(str(k) for k in keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {label} | " + " | ".join(number(results[k][key], d) for k in keys) + " |" for label, key, d in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
