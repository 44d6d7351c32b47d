"""The hub: lith's kanban run, in process, no HTTP.

A `Lith` app on a temporary SQLite file with one view, `board/{board_id}`, rendering a 200-card
board of about 145 KB with htpy; each card is a `fragment` keyed by its row (and two inner
parts keyed by what they show), so a re-render after a few moves renders only those cards.
200 `Stream`s watch `board/1`, each with a consumer taking frames as they come and formatting
each frame's SSE event; 200 producers send 800 `Move` commands/s in all through
`await writer.do(cmd)`. The hub ticks on its own 50 ms timer, under `lith.lifespan()`.

  normal        synchronous=NORMAL, the 200 keeping-up streams
  full          synchronous=FULL, the same
  uvloop        NORMAL on uvloop
  no-streams    the producers and no stream: the commit latency the writer gives alone
  stalled-same  NORMAL and 50 more streams on board/1 that never read (they skip; the 200
                others take every frame)
  rule-on       NORMAL and 50 stalled streams, each alone on board n (2..51), with 25 `Bump`s/s
                each so every one of those boards changes every tick: the hub renders each once
                and stops, since nobody can take a newer frame
  rule-off      the same boards, but a consumer takes and drops each of their frames: what the
                hub would render without that rule

Figures from the app's metrics (`lith.metrics`, sampled at the window's edges): ticks/s,
renders per tick, unchanged renders, frames/s the streams took, late ticks, tick mean and p95
(from the histogram's buckets); frames lost by the keeping-up streams (`Stream.skipped`); CPU
cores of the process and per thread; commit latency around `writer.do`; and whether every
stream ends on the database's board (the fragment cache exact, byte for byte).

    python -m bench.hub                     # 30 s windows: about 3 minutes
    python -m bench.hub --quick --only normal,rule-on,rule-off
    python -m bench.hub --only normal --profile
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sqlite3
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import htpy as h
from datastar_py.sse import ServerSentEventGenerator
from markupsafe import Markup
from pydantic import Field

from examples.kanban.synthetic import LANE_TITLES, LANES, make_cards
from fastapi_lith import Command, Db, Frame, Lith, Stream, Tx, fragment

from .lib import harness
from .lib.load import produce
from .lib.metrics import Counts
from .lib.proc import ThreadClocks, Window
from .lib.profile import Spy
from .lib.stats import NAN, number

# lith (Go) on this board, 4-vCPU VPS (DESIGN.md)
LITH = {"ticks_s": 19.8, "renders_per_tick": 1.00, "frames_s": 3960, "cores": 0.55, "tick_p95_ms": 1.1}
LITH_COMMIT_MS = {"NORMAL": "0.3–0.5", "FULL": "2.7–5.5"}

CARDS = make_cards(200)
EXTRA = {c["id"]: c for c in CARDS}  # what a card shows beyond its row: fixed per card


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SCHEMA = (
    "CREATE TABLE cards (id INTEGER PRIMARY KEY, lane TEXT NOT NULL, position INTEGER NOT NULL,"
    " title TEXT NOT NULL, body TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 1);\n"
    + "".join(f"INSERT INTO cards VALUES ({c['id']}, {_q(c['lane'])}, {c['position']}, {_q(c['title'])},"
              f" {_q(c['description'])}, 1);\n" for c in CARDS)
    + "CREATE TABLE boards (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1);\n"
    + "".join(f"INSERT INTO boards (id) VALUES ({n});\n" for n in range(1, 65))
)
MOVE = "UPDATE cards SET lane = ?, position = ?, version = version + 1 WHERE id = ?"
BOARD = "SELECT id, lane, position, title, body, version FROM cards ORDER BY lane, position, id"
BUMP = "UPDATE boards SET version = version + 1 WHERE id = ?"


class Move(Command):
    card: int = Field(ge=1, le=200)
    lane: Literal["todo", "doing", "review", "done"]
    position: int = Field(ge=0, le=1000)

    def apply(self, tx: Tx) -> None:
        tx.execute(MOVE, (self.lane, self.position, self.card))
        tx.touch("board:1")


class Bump(Command):
    """A board's own version changes (its header), not its cards: board n renders next tick."""

    board: int = Field(ge=1, le=64)

    def apply(self, tx: Tx) -> None:
        tx.execute(BUMP, (self.board,))
        tx.touch(f"board:{self.board}")


@fragment(maxsize=1024)
def card_text(cid: int, title: str, body: str) -> h.Fragment:
    extra = EXTRA[cid]
    return h.fragment[
        h.header(class_="card-header")[
            h.h3(class_="card-title")[title], h.span(class_="card-points")[str(extra["points"])]
        ],
        h.p(class_="card-description")[body],
        h.ul(class_="card-tags")[[h.li(class_=f"tag tag-{t}")[t] for t in extra["tags"]]],
    ]


@fragment(maxsize=1024)
def card_footer(cid: int, lane: str) -> h.Element:
    return h.footer(class_="card-footer")[
        h.span(class_="card-assignee")[f"@{EXTRA[cid]['assignee']}"],
        h.nav(class_="card-moves")[[
            h.button({"data-on:click": f"@post('/cards/{cid}/move?lane={to}')"})[LANE_TITLES[to]]
            for to in LANES if to != lane
        ]],
    ]


@fragment(maxsize=4096)
def card(row: sqlite3.Row) -> h.Element:
    """One card, cached by its row; a moved card renders one `<article>` around cached parts."""
    cid = row["id"]
    return h.article(id=f"card-{cid}", class_=f"card card-{row['lane']}", data_version=str(row["version"]))[
        card_text(cid, row["title"], row["body"]) + card_footer(cid, row["lane"])
    ]


def clear_fragments() -> None:
    for fn in (card, card_text, card_footer):
        fn.cache_clear()  # type: ignore[union-attr]


def board_view(db: Db, board_id: int) -> h.Element:
    """The whole board, `#board-{n}`: 4 lanes of 200 cards, each lane's cards joined once."""
    version = db.scalar("SELECT version FROM boards WHERE id = ?", (board_id,))
    by_lane: dict[str, list[Markup]] = {lane: [] for lane in LANES}
    for row in db.all(BOARD):
        by_lane[row["lane"]].append(card(row))
    return h.main(id=f"board-{board_id}", class_="board", data_version=str(version))[[
        h.section(id=f"lane-{lane}", class_=f"lane lane-{lane}")[
            h.h2(class_="lane-title")[LANE_TITLES[lane], " ", h.span(class_="lane-count")[str(len(cards))]],
            h.div(class_="lane-cards")[Markup("").join(cards)],
        ] for lane, cards in by_lane.items()
    ]]


@dataclass(frozen=True)
class Scenario:
    sync: str = "NORMAL"
    keepers: int = 200  # streams on board/1 whose consumers take every frame
    stalled_same: int = 0  # streams on board/1 that never read
    alone: int = 0  # streams each alone on board n = 2.., with Bumps at 25/s each
    alone_read: bool = False  # those streams' frames taken and dropped
    loop: str = "asyncio"


SCENARIOS = {
    "normal": Scenario(), "full": Scenario(sync="FULL"), "uvloop": Scenario(loop="uvloop"),
    "no-streams": Scenario(keepers=0), "stalled-same": Scenario(stalled_same=50),
    "rule-on": Scenario(alone=50), "rule-off": Scenario(alone=50, alone_read=True),
}


FORMATTED: weakref.WeakKeyDictionary[Frame, bytes] = weakref.WeakKeyDictionary()


def sse_event(frame: Frame) -> bytes:
    """A frame's Datastar event, formatted once however many streams take it, as the transport does."""
    event = FORMATTED.get(frame)
    if event is None:
        event = FORMATTED[frame] = str(ServerSentEventGenerator.patch_elements(frame.html)).encode()
    return event


async def consume(stream: Stream, last: dict[str, str] | None = None) -> None:
    """Take frames as they come, formatting each one's SSE event as the transport would."""
    while frames := await stream.next():
        for frame in frames:
            sse_event(frame)
        if last is not None:
            last[stream.tab] = frames[-1].html


async def run(sc: Scenario, folder: Path, warmup: float, seconds: float, rate: float, profile: bool) -> dict[str, Any]:
    (folder / "migrations").mkdir(parents=True)
    (folder / "migrations" / "0001_cards.sql").write_text(SCHEMA)
    lith = Lith(folder / "board.db", migrations=folder / "migrations", synchronous=sc.sync,  # type: ignore[arg-type]
                same_origin_only=False)
    lith.view("board/{board_id}", topics={"board:{board_id}"})(board_view)
    clear_fragments()
    last: dict[str, str] = {}
    edges: dict[str, Any] = {}
    async with lith.lifespan():
        hub, writer = lith.hub, lith.writer
        metrics = getattr(lith, "metrics", None)  # made after the start: sampled at the window's edges only, no sampler
        keepers = [Stream(f"keep-{i}") for i in range(sc.keepers)]
        stalled = [Stream(f"stall-{i}") for i in range(sc.stalled_same)]
        alone = [Stream(f"alone-{n}") for n in range(2, 2 + sc.alone)]
        for s in keepers + stalled:
            await hub.open(s, ["board/1"])
        for n, s in enumerate(alone, start=2):
            await hub.open(s, [f"board/{n}"])
        html_bytes = len((await hub.render("board/1")).encode())
        tasks = [asyncio.create_task(consume(s, last)) for s in keepers]
        tasks += [asyncio.create_task(consume(s)) for s in alone if sc.alone_read]

        def move(k: int, i: int) -> Any:
            rng = random.Random(k * 7919 + i)
            return writer.do(Move(card=rng.randint(1, 200), lane=rng.choice(LANES), position=rng.randint(0, 60)))  # type: ignore[arg-type]

        def bump(k: int, i: int) -> Any:  # one producer per alone board
            return writer.do(Bump(board=2 + k))

        def opened() -> None:
            edges.update(start=Counts.of(metrics), lost=sum(s.skipped for s in keepers), window=Window.open(),
                         threads=ThreadClocks())
            if profile:
                edges["spy"] = Spy(os.getpid(), seconds)

        def closed() -> None:
            edges.update(counts=Counts.of(metrics) - edges["start"],
                         lost=sum(s.skipped for s in keepers) - edges["lost"],
                         figures=edges["window"].close(), cores=edges["threads"].cores())

        # Bumps at 25/s per alone board: each of those boards changes every 50 ms tick.
        bumps = [produce(bump, sc.alone, warmup=warmup, seconds=seconds, rate=25.0 * sc.alone)] if sc.alone else []
        load, *_ = await asyncio.gather(
            produce(move, 200, warmup=warmup, seconds=seconds, rate=rate, opened=opened, closed=closed), *bumps)
        for _ in range(400):  # let the last commits render and be taken, then compare
            cached = await hub.render("board/1")
            if not any(s.holds("board/1") for s in keepers) and all(last.get(s.tab) == cached for s in keepers):
                break
            await asyncio.sleep(lith.tick)
        clear_fragments()
        fresh = await hub.render("board/1")
    await asyncio.gather(*tasks)
    c, f, cores = edges["counts"], edges["figures"], edges["cores"]
    wall = f.seconds
    ticks, renders = c.get("lith_hub_ticks_total"), c.total("lith_hub_renders_total")
    if profile:
        print(f"\nprofile, {sc}:\n{edges['spy'].summary()}\n")
    return {
        "ticks_s": ticks / wall, "renders_per_tick": renders / ticks if ticks else NAN,
        "renders_s": renders / wall, "unchanged_s": c.get("lith_hub_unchanged_total") / wall,
        "frames_s": c.get("lith_stream_frames_total") / wall, "late_ticks": c.get("lith_hub_late_ticks_total"),
        "lost": float(edges["lost"]), "cores": f.cores, "loop": cores.get("loop", NAN),
        "readers": cores.get("readers", NAN), "writer": cores.get("writer", NAN), "waiting": f.waiting,
        "others": f.others, "tick_mean_ms": c.mean("lith_hub_tick_seconds") * 1e3,
        "tick_p95_ms": c.quantile("lith_hub_tick_seconds", 0.95) * 1e3, "commit_p50_ms": load.p50_ms,
        "commit_p99_ms": load.p99_ms, "commands_s": load.rate, "html_bytes": float(html_bytes),
        "cache_exact": float(cached == fresh),
        "streams_current": float(sum(1 for s in keepers if last.get(s.tab) == fresh)),
        "errors": float(sum(load.errors.values())),
    }


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default="", help=f"scenarios, of {','.join(SCENARIOS)}")
    ap.add_argument("--seconds", type=float, default=0.0, help="the window (default 30)")
    ap.add_argument("--rate", type=float, default=800.0, help="Moves/s on board 1")
    ap.add_argument("--profile", action="store_true", help="py-spy over each window")


def measure(args: argparse.Namespace) -> harness.Result:
    names = args.only.split(",") if args.only else ["normal"] if args.smoke else list(SCENARIOS)
    warmup, seconds = (0.3, 0.8) if args.smoke else (1.0, 5.0) if args.quick else (2.0, args.seconds or 30.0)
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-hub-"))
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            sc = SCENARIOS[name]
            coro = run(sc, tmp / name, warmup, seconds, args.rate, args.profile)
            if sc.loop == "uvloop":
                import uvloop

                results[name] = r = uvloop.run(coro)
            else:
                results[name] = r = asyncio.run(coro)
            print(f"  {name}: {r['ticks_s']:.1f} ticks/s, {r['renders_per_tick']:.2f} renders/tick, "
                  f"{r['frames_s']:,.0f} frames/s, lost {r['lost']:.0f}, {r['cores']:.2f} cores, tick p95 "
                  f"{r['tick_p95_ms']:.1f} ms, commit p50 {r['commit_p50_ms']:.2f} ms, exact {bool(r['cache_exact'])}, "
                  f"current {r['streams_current']:.0f}, others {r['others']:.2f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {f"{n}_{k}": results[n][k] for n in results
               for k in ("frames_s", "cores", "tick_p95_ms", "commit_p50_ms", "renders_s")}
    return harness.Result(figures, table(results, seconds), {"runs": results})


def table(results: dict[str, dict[str, Any]], seconds: float) -> str:
    names = list(results)
    rows = [("ticks/s", "ticks_s", 2, LITH["ticks_s"]),
            ("renders per tick", "renders_per_tick", 3, LITH["renders_per_tick"]),
            ("renders/s", "renders_s", 1, None), ("unchanged renders/s", "unchanged_s", 1, None),
            ("frames/s taken (every stream)", "frames_s", 0, LITH["frames_s"]), ("late ticks", "late_ticks", 0, None),
            ("frames lost, keeping-up streams", "lost", 0, 0), ("CPU cores, process", "cores", 3, LITH["cores"]),
            ("… event loop thread", "loop", 3, None), ("… reader threads", "readers", 3, None),
            ("… writer thread", "writer", 3, None), ("threads waiting for a CPU (cores)", "waiting", 3, None),
            ("others' cores", "others", 2, None), ("tick mean ms", "tick_mean_ms", 2, None),
            ("tick p95 ms (buckets)", "tick_p95_ms", 2, LITH["tick_p95_ms"]),
            ("commit p50 ms", "commit_p50_ms", 3, None),
            ("commit p99 ms", "commit_p99_ms", 3, None), ("commands/s", "commands_s", 0, None),
            ("board bytes", "html_bytes", 0, 142_067), ("fragment cache exact", "cache_exact", 0, None),
            ("streams ending on the current board", "streams_current", 0, None)]
    lines = [f"Windows of {seconds:g} s.\n", "| figure | " + " | ".join(names) + " | lith (Go) |",
             "|---|" + "---:|" * len(names) + "---:|"]
    for label, key, digits, lith in rows:
        lines.append(f"| {label} | " + " | ".join(number(results[n][key], digits) for n in names)
                     + f" | {'' if lith is None else f'{lith:,}'} |")
    lines.append(f"\nlith's commit p50: {LITH_COMMIT_MS['NORMAL']} ms NORMAL, {LITH_COMMIT_MS['FULL']} ms FULL.")
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(__doc__, measure, arguments=arguments)
