"""The hub benchmark: lith's kanban run, in process, no HTTP.

A `Lith` app on a temp SQLite file with one view, `board/{board_id}` (topic `board:{board_id}`),
rendering a 200-card board of about 145 KB with htpy; each card's HTML is cached by
`fastapi_lith.fragment`, keyed by its `sqlite3.Row`, so a re-render after a few cards moved
re-renders only those cards. (`examples/kanban` did not exist when this was written; its view
can replace `make_board_view` below.) Two ways to build the card: "nested" (the default: the
row-keyed card is an `<article>` around two inner fragments keyed by what they show, and each
lane's cards are joined into one `Markup`) and "flat" (the row-keyed card rendered whole, each
card one htpy child); both give the same bytes, checked every run.

200 streams (`fastapi_lith.Stream`, opened with `await lith.hub.open(stream, ["board/1"])`) each
have a consumer task that takes frames as they come (`await stream.next()`); 200 producer tasks
send 800 `Move` commands/s in total (each paced at ~4/s, jittered) through `await writer.do(cmd)`:
one random card to a random lane and position, touching `board:1`. The hub ticks on its own
50 ms timer, under `async with lith.lifespan():`.

Scenarios (normal and full get the whole window, the others half of it):

  normal        synchronous=NORMAL, 200 keeping-up streams
  full          synchronous=FULL, the same
  normal-flat   NORMAL with the flat card fragments
  normal-uvloop NORMAL on uvloop (uvicorn's loop when installed)
  no-streams    NORMAL producers and no stream: the commit latency the writer gives alone
  stalled-same  NORMAL + 50 more streams on board/1 that never read (the rule cannot hold
                board/1 back: 200 other watchers take every frame; the stalled ones skip)
  rule-on       NORMAL + 50 stalled streams, each alone on board/n (n = 2..51), and 50 more
                producers (25 `Bump`s/s each of board n's own version, shown on the board) so
                every one of those boards changes every tick: with the no-render-while-pending
                rule they render once and stop
  rule-off      the same, but after each tick a drain takes and drops what those 50 streams
                hold, so they never hold a frame: what the hub would do without the rule

Figures: ticks/s (all ticks, and ticks that rendered), renders per rendering tick, renders per
changed instance per tick (changed = an instance on a topic a commit touched since the previous
tick, with a watcher that can take a frame; goal 1.00), frames/s taken by the keeping-up
streams, frames skipped, frames lost by the keeping-up streams (`stream.skipped`: offered, then
replaced before the consumer took it), CPU cores of the process (`process_time` / wall) and per
thread (event loop, reader threads that render, writer thread), tick p50/p95
(`hub.counters.tick_percentiles()` over the window), commit latency p50/p99 around
`await writer.do(cmd)`, and how starved the run was (our threads' run-queue wait from
/proc/self/task/*/schedstat, the machine's busy cores from /proc/stat): shared machines are noisy.

    python bench/hub.py                    # about 3 minutes
    python bench/hub.py --quick            # 8 s windows, about 1 minute
    python bench/hub.py --seconds 10 --only normal,rule-on,rule-off
    python bench/hub.py --profile          # py-spy on NORMAL runs (all threads, then --gil)
    python bench/hub.py --results          # also write the "## Hub" section of bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import htpy as h  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from markupsafe import Markup  # noqa: E402
from pydantic import Field  # noqa: E402

from datastar_py.sse import ServerSentEventGenerator  # noqa: E402
from fastapi_lith import Command, Db, Lith, Stream, Tx, fragment  # noqa: E402
from fastapi_lith.engine.statements import StatementCache  # noqa: E402
from fastapi_lith.engine.views import root_id  # noqa: E402
from fastapi_lith.engine.frames import sse_event  # noqa: E402
from tests.support.board import LANE_TITLES, LANES, make_cards  # noqa: E402

from conditions import load_average, one_line, percentile, print_conditions  # noqa: E402

try:
    import uvloop
except ImportError:  # pragma: no cover - optional
    uvloop = None

# -- lith's figures (Go, 4-vCPU VPS) and our goals --------------------------------------------

LITH = {
    "ticks": 19.8, "renders_per_tick": 1.00, "frames": 3960, "cores": 0.55, "tick_p95": 1.1,
    "frame_bytes": 142_067,
}
LITH_COMMIT = {"NORMAL": (0.3, 0.5), "FULL": (2.7, 5.5)}
GOALS = {"ticks": 19.5, "per_changed": 1.00, "cores": 0.5, "tick_p95": 10.0, "commit_p50_normal": 0.5}
TARGET_BYTES = 142_067

# -- the app: schema, command, view -----------------------------------------------------------

CARDS = make_cards(200)
# What a card shows beyond its row (points, assignee, tags) is fixed per card id, so caching a
# card by its row stays exact: only the row changes.
EXTRA = {c["id"]: c for c in CARDS}


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SCHEMA = (
    "CREATE TABLE cards (id INTEGER PRIMARY KEY, lane TEXT NOT NULL, position INTEGER NOT NULL,"
    " title TEXT NOT NULL, body TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 1);\n"
    + "".join(
        f"INSERT INTO cards VALUES ({c['id']}, {_q(c['lane'])}, {c['position']}, {_q(c['title'])},"
        f" {_q(c['description'])}, 1);\n"
        for c in CARDS
    )
    + "CREATE TABLE boards (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1);\n"
    + "".join(f"INSERT INTO boards (id) VALUES ({n});\n" for n in range(1, 65))
)

cards_t = sa.table(
    "cards", sa.column("id"), sa.column("lane"), sa.column("position"), sa.column("title"),
    sa.column("body"), sa.column("version"),
)
MOVE = (
    cards_t.update()
    .where(cards_t.c.id == sa.bindparam("card_id"))
    .values(lane=sa.bindparam("to_lane"), position=sa.bindparam("to_pos"), version=cards_t.c.version + 1)
)
BOARD = "SELECT id, lane, position, title, body, version FROM cards ORDER BY lane, position, id"
BOARD_VERSION = "SELECT version FROM boards WHERE id = ?"
BUMP = "UPDATE boards SET version = version + 1 WHERE id = :board"

Lane = Literal["todo", "doing", "review", "done"]


class Move(Command):
    """Move one card to a lane and position; the board (`board:{board}`) renders next tick."""

    card: int = Field(ge=1, le=200)
    lane: Lane
    position: int = Field(ge=0, le=1000)
    board: int = Field(1, ge=1)

    def apply(self, tx: Tx) -> None:
        tx.execute(MOVE, {"card_id": self.card, "to_lane": self.lane, "to_pos": self.position})
        tx.touch(f"board:{self.board}")


class Bump(Command):
    """Change a board's own version (its header), not its cards: board `n` renders next tick."""

    board: int = Field(ge=1, le=64)

    def apply(self, tx: Tx) -> None:
        tx.execute(BUMP, {"board": self.board})
        tx.touch(f"board:{self.board}")


def _moves(cid: int, lane: str) -> list[h.Element]:
    return [
        h.button({"data-on:click": f"@post('/cards/{cid}/move?lane={to}')"})[LANE_TITLES[to]]
        for to in LANES
        if to != lane
    ]


@fragment(maxsize=4096)
def card_flat(row: sqlite3.Row) -> h.Element:
    """One card, cached by its row, rendered whole by htpy when the row changes (a move
    changes lane, position and version): about 15 elements, 0.1-0.5 ms of htpy per moved card."""
    cid = row["id"]
    extra = EXTRA[cid]
    return h.article(id=f"card-{cid}", class_=f"card card-{row['lane']}", data_version=str(row["version"]))[
        h.header(class_="card-header")[
            h.h3(class_="card-title")[row["title"]],
            h.span(class_="card-points")[str(extra["points"])],
        ],
        h.p(class_="card-description")[row["body"]],
        h.ul(class_="card-tags")[[h.li(class_=f"tag tag-{t}")[t] for t in extra["tags"]]],
        h.footer(class_="card-footer")[
            h.span(class_="card-assignee")[f"@{extra['assignee']}"],
            h.nav(class_="card-moves")[_moves(cid, row["lane"])],
        ],
    ]


@fragment(maxsize=1024)
def card_text(cid: int, title: str, body: str) -> h.Fragment:
    """What a move does not change: title, points, description, tags."""
    extra = EXTRA[cid]
    return h.fragment[
        h.header(class_="card-header")[
            h.h3(class_="card-title")[title],
            h.span(class_="card-points")[str(extra["points"])],
        ],
        h.p(class_="card-description")[body],
        h.ul(class_="card-tags")[[h.li(class_=f"tag tag-{t}")[t] for t in extra["tags"]]],
    ]


@fragment(maxsize=1024)
def card_footer(cid: int, lane: str) -> h.Element:
    """The assignee and the move buttons: one of four per card, by lane."""
    return h.footer(class_="card-footer")[
        h.span(class_="card-assignee")[f"@{EXTRA[cid]['assignee']}"],
        h.nav(class_="card-moves")[_moves(cid, lane)],
    ]


@fragment(maxsize=4096)
def card_nested(row: sqlite3.Row) -> h.Element:
    """The same card, byte for byte, cached by its row; a moved card renders one `<article>`
    around two cached parts keyed by what they show, so a move costs one element."""
    cid = row["id"]
    # One Markup child, not two: htpy checks a tuple of children against a runtime Protocol.
    return h.article(id=f"card-{cid}", class_=f"card card-{row['lane']}", data_version=str(row["version"]))[
        card_text(cid, row["title"], row["body"]) + card_footer(cid, row["lane"])
    ]


CARD_FRAGMENTS = {"nested": card_nested, "flat": card_flat}
JOIN_LANES = {"nested": True, "flat": False}


def clear_fragments() -> None:
    for fn in (card_flat, card_text, card_footer, card_nested):
        fn.cache_clear()  # type: ignore[attr-defined]


def make_board_view(card: Any, join: bool) -> Any:
    def board_view(db: Db, board_id: int) -> h.Element:
        """The whole board, `#board-{n}`: 4 lanes, 200 cards, ~145 KB; unchanged cards come cached.

        "flat": each lane's cards are a list of cached `Markup` children, 200 children that htpy
        walks one by one (about 20 µs each here). "nested": each lane's cards are joined into one
        `Markup` first. A child that is a tuple or a generator would cost more still: htpy checks
        it against a runtime Protocol (about 20 µs on Python 3.11).
        """
        version = db.scalar(BOARD_VERSION, (board_id,))
        by_lane: dict[str, list[Markup]] = {lane: [] for lane in LANES}
        for row in db.all(BOARD):
            by_lane[row["lane"]].append(card(row))
        return h.main(id=f"board-{board_id}", class_="board", data_version=str(version))[
            [
                h.section(id=f"lane-{lane}", class_=f"lane lane-{lane}")[
                    h.h2(class_="lane-title")[LANE_TITLES[lane], " ", h.span(class_="lane-count")[str(len(cards))]],
                    h.div(class_="lane-cards")[Markup("").join(cards) if join else cards],
                ]
                for lane, cards in by_lane.items()
            ]
        ]

    return board_view


def make_lith(folder: Path, sync: str, cards: str = "nested") -> Lith:
    (folder / "migrations").mkdir(parents=True, exist_ok=True)
    (folder / "migrations" / "0001_cards.sql").write_text(SCHEMA)
    lith = Lith(folder / "board.db", migrations=folder / "migrations", synchronous=sync, same_origin_only=False)
    lith.view("board/{board_id}", topics={"board:{board_id}"})(make_board_view(CARD_FRAGMENTS[cards], JOIN_LANES[cards]))
    return lith


# -- scenarios ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    sync: str = "NORMAL"
    keepers: int = 200          # streams on board/1 whose consumer takes frames as they come
    rate: float = 800.0         # Moves/s on board 1, over `producers` producers
    producers: int = 200
    stalled_same: int = 0       # streams on board/1 that never read
    stalled_alone: int = 0      # streams each alone on board/n, n = 2.., never reading
    alone_rate: float = 25.0    # Moves/s per stalled board (so each changes every 50 ms tick)
    drain_alone: bool = False   # "without the rule": drain and drop those streams every tick
    cards: str = "nested"       # card fragments: "nested" (parts cached by what they show) or "flat"
    loop: str | None = None     # the event loop, when not --loop's
    half: bool = False          # runs half the window

    @property
    def describe(self) -> str:
        parts = [f"{self.sync}", f"{self.cards} card fragments", *([f"{self.loop}"] if self.loop else []), f"{self.keepers} keeping-up streams on board/1",
                 f"{self.producers} producers at {self.rate:.0f} Moves/s"]
        if self.stalled_same:
            parts.append(f"+{self.stalled_same} stalled streams on board/1")
        if self.stalled_alone:
            parts.append(
                f"+{self.stalled_alone} stalled streams alone on board/2..{self.stalled_alone + 1}, "
                f"+{self.stalled_alone} producers at {self.alone_rate:.0f} Bumps/s each (board n's own version)"
                + (", drained and dropped each tick (no rule)" if self.drain_alone else " (rule holds them)")
            )
        return ", ".join(parts)


SCENARIOS = {
    "normal": Scenario("normal", "NORMAL"),
    "full": Scenario("full", "FULL"),
    "normal-flat": Scenario("normal-flat", "NORMAL", cards="flat", half=True),
    "normal-uvloop": Scenario("normal-uvloop", "NORMAL", loop="uvloop", half=True),
    "no-streams": Scenario("no-streams", "NORMAL", keepers=0, half=True),
    "stalled-same": Scenario("stalled-same", "NORMAL", stalled_same=50, half=True),
    "rule-on": Scenario("rule-on", "NORMAL", stalled_alone=50, half=True),
    "rule-off": Scenario("rule-off", "NORMAL", stalled_alone=50, drain_alone=True, half=True),
}


class Phase:
    __slots__ = ("running", "measuring")

    def __init__(self) -> None:
        self.running = True
        self.measuring = False


def thread_clocks() -> dict[str, int]:
    """CPU clocks of the live threads, by name (MainThread, lith-reader_0, lith-writer_0...)."""
    clocks = {}
    for t in threading.enumerate():
        if t.ident is None or not t.is_alive():
            continue
        try:
            clocks[f"{t.name}#{t.ident}"] = time.pthread_getcpuclockid(t.ident)
        except (AttributeError, OSError):
            continue
    return clocks


def read_clocks(clocks: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, clock in clocks.items():
        try:
            out[name] = time.clock_gettime(clock)
        except OSError:
            continue
    return out


def run_queue_wait() -> float:
    """Seconds this process's live threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def machine_cpu() -> tuple[float, float, float]:
    """(busy, steal, total) jiffies of the whole machine, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0.0, 0.0, 0.0)
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal, steal, sum(fields[:8]))


def group(name: str) -> str:
    if name.startswith("MainThread"):
        return "loop"
    if name.startswith("lith-reader"):
        return "readers"
    if name.startswith("lith-writer"):
        return "writer"
    return "other"


async def run_scenario(sc: Scenario, tmp: Path, seconds: float, warmup: float, *, on_measure: Any = None) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"{sc.name}-", dir=tmp))
    lith = make_lith(folder, sc.sync, sc.cards)
    clear_fragments()
    loop = asyncio.get_running_loop()
    phase = Phase()
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    done = [0]
    result: dict[str, Any] = {"scenario": sc.name, "describe": sc.describe, "sync": sc.sync}

    async with lith.lifespan():
        hub, writer = lith.hub, lith.writer

        # Topics touched since the last tick began, seen by our own commit subscriber, so
        # "changed instances" does not come from the hub's own dirty set.
        touched: set[str] = set()
        writer.subscribe(touched.update)
        ticks: list[tuple[float, int, int, int]] = []  # (time, changed & takeable, ready, renders)
        drained: list[Stream] = []
        in_tick = [False]
        original_tick = hub.tick

        async def tick() -> int:
            changed = 0
            for topic in tuple(touched):
                key = "board/" + topic.split(":", 1)[1]
                instance = hub.instances.get(key)
                if instance is not None and any(not s.holds(key) for s in instance.watchers):
                    changed += 1
            touched.clear()
            r0 = hub.counters.renders
            in_tick[0] = True
            try:
                n = await original_tick()
            finally:
                in_tick[0] = False
            ticks.append((loop.time(), changed, n, hub.counters.renders - r0))
            for stream in drained:  # "without the rule": these never hold a frame
                stream.take()
            return n

        hub.tick = tick  # type: ignore[method-assign]  # the hub's timer calls self.tick()

        # -- streams
        keepers = [Stream(f"keep-{i}") for i in range(sc.keepers)]
        for s in keepers:
            await hub.open(s, ["board/1"])
        html_bytes = len((await hub.render("board/1")).encode())
        result["html_bytes"] = html_bytes
        if not 0.9 * TARGET_BYTES <= html_bytes <= 1.1 * TARGET_BYTES:
            print(f"  warning: board is {html_bytes:,} bytes, not {TARGET_BYTES:,} ±10%", flush=True)
        stalled_same = [Stream(f"stall-{i}") for i in range(sc.stalled_same)]
        for s in stalled_same:
            await hub.open(s, ["board/1"])
        alone = [Stream(f"alone-{n}") for n in range(2, 2 + sc.stalled_alone)]
        for n, s in enumerate(alone, start=2):
            await hub.open(s, [f"board/{n}"])
        if sc.drain_alone:
            drained.extend(alone)

        last_html: dict[int, str] = {}
        frame_counts = [0] * len(keepers)

        async def consumer(i: int, stream: Stream) -> None:
            while True:
                frames = await stream.next()
                if not frames:
                    return  # ended: the hub stopped
                frame_counts[i] += len(frames)
                last_html[i] = frames[-1].html
                for frame in frames:  # the transport's work: the SSE event, formatted once per frame
                    sse_event(frame)

        consumers = [asyncio.create_task(consumer(i, s)) for i, s in enumerate(keepers)]

        # -- producers
        async def producer(k: int, board: int, rate: float) -> None:
            """Board 1: Moves at `rate`; boards 2..: Bumps of the board's own version."""
            rng = random.Random(1000 * board + k)
            do, pc = writer.do, time.perf_counter
            interval = 1.0 / rate
            due = loop.time() + rng.uniform(0, interval)
            while phase.running:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:  # far behind (a stall): do not burst to catch up
                    due = loop.time()
                due += interval * rng.uniform(0.5, 1.5)
                if board == 1:
                    cmd: Command = Move(card=rng.randint(1, 200), lane=rng.choice(LANES), position=rng.randint(0, 60))
                else:
                    cmd = Bump(board=board)
                try:
                    if phase.measuring:
                        t0 = pc()
                        await do(cmd)
                        latencies.append(pc() - t0)
                        done[0] += 1
                    else:
                        await do(cmd)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors[type(exc).__name__] += 1

        per = sc.rate / sc.producers
        tasks = [asyncio.create_task(producer(k, 1, per)) for k in range(sc.producers)]
        tasks += [asyncio.create_task(producer(0, n, sc.alone_rate)) for n in range(2, 2 + sc.stalled_alone)]

        await asyncio.sleep(warmup)

        # -- the window
        clocks = thread_clocks()
        c0 = read_clocks(clocks)
        counters = hub.counters
        snap0 = dict(
            ticks=counters.ticks, renders=counters.renders, unchanged=counters.unchanged,
            frames=counters.frames, skipped=counters.skipped, errors=counters.render_errors,
            tick_len=len(counters.tick_seconds), commands=writer.commands, batches=writer.batches,
        )
        k_skip0 = [s.skipped for s in keepers]
        k_taken0 = [s.taken for s in keepers]
        ss_skip0 = sum(s.skipped for s in stalled_same)
        a0 = sum(s.skipped + s.taken for s in alone)
        ticks_i0 = len(ticks)
        rq0, m0 = run_queue_wait(), machine_cpu()
        cpu0, t0 = time.process_time(), time.perf_counter()
        phase.measuring = True
        if on_measure is not None:
            on_measure()
        await asyncio.sleep(seconds)
        phase.measuring = False
        t1, cpu1 = time.perf_counter(), time.process_time()
        rq1, m1 = run_queue_wait(), machine_cpu()
        c1 = read_clocks(clocks)
        ticks_i1 = len(ticks)
        snap1 = dict(
            ticks=counters.ticks, renders=counters.renders, unchanged=counters.unchanged,
            frames=counters.frames, skipped=counters.skipped, errors=counters.render_errors,
            tick_len=len(counters.tick_seconds), commands=writer.commands, batches=writer.batches,
        )
        k_skip = [s.skipped - a for s, a in zip(keepers, k_skip0)]
        k_taken = [s.taken - a for s, a in zip(keepers, k_taken0)]
        ss_skip = sum(s.skipped for s in stalled_same) - ss_skip0
        a1 = sum(s.skipped + s.taken for s in alone)
        tick_window = list(counters.tick_seconds)[snap0["tick_len"]:snap1["tick_len"]] \
            if snap1["tick_len"] < counters.tick_seconds.maxlen else list(counters.tick_seconds)[-(snap1["ticks"] - snap0["ticks"]):]

        # -- settle, then check what the streams hold against the database
        phase.running = False
        await asyncio.gather(*tasks)
        board1 = hub.instances.get("board/1")
        settle = time.perf_counter()
        result["settled_s"] = float("nan")
        for _ in range(200):  # up to 10 s for the last commits to render and be taken
            await asyncio.sleep(lith.tick)
            if board1 is None or (not in_tick[0] and board1 not in hub.dirty and not any(s.holds("board/1") for s in keepers)):
                result["settled_s"] = time.perf_counter() - settle
                break
        cached = await hub.render("board/1")
        clear_fragments()
        fresh = await hub.render("board/1")
        if sc.cards == "nested":  # the nested parts must give the flat card byte for byte
            rows = await hub.readers.run(lambda db: db.all(BOARD))
            result["nested_is_flat"] = all(str(card_nested(r)) == str(card_flat(r)) for r in rows)
        result["cache_exact"] = cached == fresh
        result["keepers_current"] = sum(1 for i in range(len(keepers)) if last_html.get(i) == fresh)
        result["hub_frame_current"] = board1 is None or (board1.frame is not None and board1.frame.html == fresh)
    await asyncio.gather(*consumers)
    shutil.rmtree(folder, ignore_errors=True)

    wall = t1 - t0
    d = {k: snap1[k] - snap0[k] for k in snap0}
    window = ticks[ticks_i0:ticks_i1]
    rendering = [t for t in window if t[3] > 0]
    changed_sum = sum(t[1] for t in window)
    renders_sum = sum(t[3] for t in window)
    cpu_threads: dict[str, float] = defaultdict(float)
    for name, v in c1.items():
        cpu_threads[group(name)] += v - c0.get(name, 0.0)
    pct = (lambda q: percentile(tick_window, q) * 1e3)
    result.update(
        seconds=wall,
        ticks_per_s=d["ticks"] / wall,
        rendering_ticks_per_s=len(rendering) / wall,
        renders_per_s=d["renders"] / wall,
        renders_per_rendering_tick=(sum(t[3] for t in rendering) / len(rendering)) if rendering else float("nan"),
        renders_per_changed=(renders_sum / changed_sum) if changed_sum else float("nan"),
        ticks_exact=sum(1 for t in window if t[3] == t[1]) / len(window) if window else float("nan"),
        unchanged=d["unchanged"],
        render_errors=d["errors"],
        offered_per_s=d["frames"] / wall,
        frames_per_s=sum(k_taken) / wall,
        skipped=d["skipped"],
        lost_keepers=sum(k_skip),
        keepers_with_loss=sum(1 for x in k_skip if x),
        skipped_stalled_same=ss_skip,
        alone_renders_per_s=(a1 - a0) / wall,
        board1_renders_per_s=(d["renders"] - (a1 - a0)) / wall,
        min_frames_per_keeper=min(k_taken) if k_taken else 0,
        max_frames_per_keeper=max(k_taken) if k_taken else 0,
        cores=(cpu1 - cpu0) / wall,
        cores_loop=cpu_threads["loop"] / wall,
        cores_readers=cpu_threads["readers"] / wall,
        cores_writer=cpu_threads["writer"] / wall,
        cores_other=cpu_threads["other"] / wall,
        run_queue_wait=(rq1 - rq0) / wall,
        machine_busy=(m1[0] - m0[0]) / (m1[2] - m0[2]) * (os.cpu_count() or 1) if m1[2] > m0[2] else float("nan"),
        machine_steal=(m1[1] - m0[1]) / (m1[2] - m0[2]) * (os.cpu_count() or 1) if m1[2] > m0[2] else float("nan"),
        tick_p50=pct(50), tick_p95=pct(95), tick_p99=pct(99), tick_max=max(tick_window) * 1e3 if tick_window else float("nan"),
        commit_p50=percentile(latencies, 50) * 1e3,
        commit_p99=percentile(latencies, 99) * 1e3,
        commands_per_s=done[0] / wall,
        per_batch=d["commands"] / d["batches"] if d["batches"] else float("nan"),
        errors=dict(errors),
        load=load_average(),
    )
    return result


def run(sc: Scenario, tmp: Path, seconds: float, warmup: float, loop_name: str, **kw: Any) -> dict[str, Any]:
    coro = run_scenario(sc, tmp, seconds, warmup, **kw)
    if loop_name == "uvloop":
        assert uvloop is not None, "uvloop is not installed"
        return uvloop.run(coro)
    return asyncio.run(coro)


# -- what one render costs, piece by piece ----------------------------------------------------


def micro() -> dict[str, float]:
    """Milliseconds per call, best of 7, on an in-memory copy of the board (one thread, no hub)."""
    import timeit

    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.executescript(SCHEMA)
    rows = conn.execute(BOARD).fetchall()
    clear_fragments()
    for r in rows:
        card_nested(r), card_flat(r)

    def best(fn: Any, n: int = 20) -> float:
        return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e3

    def assemble(join: bool) -> str:
        by: dict[str, list[Markup]] = {lane: [] for lane in LANES}
        for r in rows:
            by[r["lane"]].append(card_nested(r))
        return str(h.main(id="b")[[h.section(id=k)[h.div[Markup("").join(c) if join else c]] for k, c in by.items()]])

    r0 = rows[0]
    html = str(make_board_view(card_nested, True)(Db(conn, StatementCache(16)), 1))

    out = {
        "fetch 200 rows (sqlite3.Row)": best(lambda: conn.execute(BOARD).fetchall()),
        "200 fragment hits (lru_cache, Row hash)": best(lambda: [card_nested(r) for r in rows]),
        "lanes of 200 Markup children (htpy)": best(lambda: assemble(False)),
        "lanes joined into 4 Markup (htpy)": best(lambda: assemble(True)),
        "one card, flat, whole (htpy miss)": best(lambda: str(card_flat.__wrapped__(r0)), 50),  # type: ignore[attr-defined]
        "one card, nested, parts cached (miss)": best(lambda: str(card_nested.__wrapped__(r0)), 200),  # type: ignore[attr-defined]
        "htpy: tuple child (runtime Protocol check)": best(lambda: str(h.div[("a", "b")]), 200)
        - best(lambda: str(h.div["ab"]), 200),
        "datastar patch_elements event": best(lambda: str(ServerSentEventGenerator.patch_elements(html)).encode()),
        "root_id check": best(lambda: root_id(html), 200),
        "HTML compare, equal length": best(lambda: html == html[:-1] + "x", 200),
    }
    assert assemble(True) == assemble(False)
    conn.close()
    clear_fragments()
    return out


def micro_table(m: dict[str, float]) -> str:
    lines = ["| piece of one render | ms |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in m.items()]
    return "\n".join(lines)


# -- reporting ----------------------------------------------------------------------------------


def f(x: float, digits: int = 2) -> str:
    if x != x:  # nan
        return "–"
    return f"{x:,.{digits}f}"


def ratio(ours: float, theirs: float) -> str:
    if ours != ours or not theirs:
        return "–"
    return f"{ours / theirs:.2f}×"


def verdict(ok: bool, how: str) -> str:
    return f"met ({how})" if ok else f"**missed** ({how})"


LABELS = {"normal": "NORMAL", "full": "FULL", "normal-flat": "NORMAL, flat cards", "normal-uvloop": "NORMAL, uvloop"}
MAIN_COLUMNS = tuple(LABELS)


def main_table(res: dict[str, dict[str, Any]]) -> str:
    cols = [n for n in MAIN_COLUMNS if n in res]
    if not cols:
        return ""
    head = "| | " + " | ".join(LABELS[c] for c in cols) + " | lith (Go) | ours / lith | goal |"
    lines = [head, "|---|" + "---:|" * len(cols) + "---:|---:|---|"]

    def row(label: str, key: str, digits: int, lith: Any = "", goal: str = "", lith_val: float | None = None) -> None:
        vals = " | ".join(f(res[c][key], digits) for c in cols)
        r = " / ".join(ratio(res[c][key], lith_val) for c in cols) if lith_val else ""
        lines.append(f"| {label} | {vals} | {lith} | {r} | {goal} |")

    row("ticks/s (all ticks)", "ticks_per_s", 2, "19.8", "≥ 19.5", LITH["ticks"])
    row("ticks/s that rendered", "rendering_ticks_per_s", 2)
    row("renders per rendering tick", "renders_per_rendering_tick", 3, "1.00", "", LITH["renders_per_tick"])
    row("renders per changed instance per tick", "renders_per_changed", 3, "1.00", "1.00", 1.0)
    row("ticks where renders = changed instances", "ticks_exact", 3)
    row("frames/s taken (200 streams)", "frames_per_s", 0, "~3,960", "", LITH["frames"])
    row("frames/s offered by the hub", "offered_per_s", 0)
    row("frames skipped (all streams)", "skipped", 0, "0")
    row("frames lost, keeping-up streams", "lost_keepers", 0, "0", "0")
    row("CPU cores, whole process", "cores", 3, "0.55", "< 0.5 (hub)", LITH["cores"])
    row("… event loop thread", "cores_loop", 3)
    row("… reader threads (render)", "cores_readers", 3)
    row("… writer thread", "cores_writer", 3)
    row("our threads runnable, waiting for a CPU (s/s)", "run_queue_wait", 3)
    row(f"machine busy, all processes (cores of {os.cpu_count()})", "machine_busy", 2)
    row("… of which steal (cores)", "machine_steal", 2)
    row("tick p50 ms", "tick_p50", 2)
    row("tick p95 ms", "tick_p95", 2, "1.1", "< 10", LITH["tick_p95"])
    row("tick p99 ms", "tick_p99", 2)
    vals = " | ".join(f(res[c]["commit_p50"], 3) for c in cols)
    rat = " / ".join(
        f"{res[c]['commit_p50'] / LITH_COMMIT[res[c]['sync']][1]:.2f}–{res[c]['commit_p50'] / LITH_COMMIT[res[c]['sync']][0]:.2f}×"
        for c in cols
    )
    lines.append(f"| commit p50 ms | {vals} | 0.3–0.5 NORMAL, 2.7–5.5 FULL | {rat} | < 0.5 (NORMAL) |")
    row("commit p99 ms", "commit_p99", 3)
    row("Moves/s committed", "commands_per_s", 0, "800")
    row("commands per transaction", "per_batch", 1)
    row("frame bytes (HTML)", "html_bytes", 0, "142,067", "±10%", LITH["frame_bytes"])
    row("renders with unchanged HTML", "unchanged", 0)
    return "\n".join(lines)


def stalled_table(res: dict[str, dict[str, Any]]) -> str:
    names = [n for n in ("no-streams", "normal", "normal-flat", "normal-uvloop", "stalled-same", "rule-on", "rule-off") if n in res]
    if len(names) < 2:
        return ""
    lines = [
        "| scenario | cores | loop | readers | writer | renders/s | board/1 renders/s | stalled boards renders/s "
        "| skipped by stalled streams | lost by keeping-up | tick p95 ms | commit p50 ms | waiting for a CPU s/s | machine busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        r = res[n]
        stalled_skip = r["skipped_stalled_same"] if n == "stalled-same" else (
            r["skipped"] - r["lost_keepers"] - r["skipped_stalled_same"])
        lines.append(
            f"| {n} | {f(r['cores'], 3)} | {f(r['cores_loop'], 3)} | {f(r['cores_readers'], 3)} | {f(r['cores_writer'], 3)} "
            f"| {f(r['renders_per_s'], 1)} | {f(r['board1_renders_per_s'], 1)} | {f(r['alone_renders_per_s'], 1)} "
            f"| {f(stalled_skip, 0)} | {f(r['lost_keepers'], 0)} | {f(r['tick_p95'], 2)} | {f(r['commit_p50'], 3)} "
            f"| {f(r['run_queue_wait'], 3)} | {f(r['machine_busy'], 2)} |"
        )
    return "\n".join(lines)


def goals_text(res: dict[str, dict[str, Any]]) -> str:
    out = []
    n = res.get("normal")
    if n is None:
        return ""
    for name, r in ((k, res[k]) for k in MAIN_COLUMNS if k in res):
        label = LABELS[name]
        out.append(f"- {label}: ticks/s {f(r['ticks_per_s'])} vs ≥ 19.5: "
                   + verdict(r["ticks_per_s"] >= GOALS["ticks"], f"{r['ticks_per_s'] - GOALS['ticks']:+.2f}"))
        out.append(f"- {label}: renders per changed instance per tick {f(r['renders_per_changed'], 3)} vs 1.00: "
                   + verdict(abs(r["renders_per_changed"] - 1) < 0.005, f"{r['renders_per_changed'] - 1:+.3f}"))
        out.append(f"- {label}: frames lost by keeping-up streams {r['lost_keepers']} vs 0: "
                   + verdict(r["lost_keepers"] == 0, f"{r['keepers_with_loss']} of 200 streams lost any"))
        hub_cores = r["cores_readers"] + r["cores_loop"]
        out.append(f"- {label}: CPU {f(r['cores'], 3)} cores for the whole process (hub ≈ loop + readers "
                   f"{f(hub_cores, 3)}, which also counts producers and consumers on the loop) vs < 0.5: "
                   + verdict(r["cores"] < GOALS["cores"], f"whole process {r['cores'] / GOALS['cores']:.2f}× the goal"))
        out.append(f"- {label}: tick p95 {f(r['tick_p95'])} ms vs < 10 ms: "
                   + verdict(r["tick_p95"] < GOALS["tick_p95"], f"{r['tick_p95'] / GOALS['tick_p95']:.2f}× the limit"))
        if r["sync"] == "NORMAL":
            out.append(f"- {label}: commit p50 {f(r['commit_p50'], 3)} ms beside 200 streams vs < 0.5 ms: "
                       + verdict(r["commit_p50"] < GOALS["commit_p50_normal"], f"{r['commit_p50'] / GOALS['commit_p50_normal']:.2f}× the limit"))
    return "\n".join(out)


def print_result(r: dict[str, Any], elapsed: float) -> None:
    print(
        f"  [{elapsed:6.1f}s] {r['scenario']:12} {r['seconds']:.1f}s: ticks/s {r['ticks_per_s']:.2f} "
        f"(rendering {r['rendering_ticks_per_s']:.2f}), renders/s {r['renders_per_s']:.1f}, "
        f"renders/changed {r['renders_per_changed']:.3f}, frames/s {r['frames_per_s']:,.0f}, "
        f"skipped {r['skipped']}, lost(keepers) {r['lost_keepers']}, cores {r['cores']:.3f} "
        f"(loop {r['cores_loop']:.3f}, readers {r['cores_readers']:.3f}, writer {r['cores_writer']:.3f}; "
        f"waiting for a CPU {r['run_queue_wait']:.3f} s/s; machine busy {r['machine_busy']:.2f} cores), "
        f"tick p50/p95 {r['tick_p50']:.2f}/{r['tick_p95']:.2f} ms, commit p50/p99 "
        f"{r['commit_p50']:.3f}/{r['commit_p99']:.3f} ms, {r['commands_per_s']:.0f} Moves/s, "
        f"cache exact {r['cache_exact']}, nested = flat {r.get('nested_is_flat', '–')}, "
        f"streams current {r['keepers_current']}/200 (hub frame current {r['hub_frame_current']}, settled in "
        f"{r['settled_s']:.2f} s), load {r['load']}"
        + (f", errors {r['errors']}" if r["errors"] else ""),
        flush=True,
    )


INTRO = (
    "`python bench/hub.py` (in process, no HTTP): a `Lith` app on a temp SQLite file, one view "
    "`board/{board_id}` rendering 200 cards (~145 KB) with htpy, each card cached by `fastapi_lith.fragment` "
    "keyed by its `sqlite3.Row`; 200 `Stream`s on `board/1` whose consumers take frames as they come; 200 "
    "producers sending 800 `Move` commands/s in total through `await writer.do(cmd)`; the hub on its own "
    "50 ms timer under `lith.lifespan()`. `--results` rewrites *Figures*, `--profile --results` rewrites "
    "*Where the CPU goes*; *Notes* is kept."
)
SUBSECTIONS = ("Figures", "Where the CPU goes", "Notes")


def write_results(updates: dict[str, str]) -> None:
    """Replace (or append) only the "## Hub" section of bench/RESULTS.md; within it, replace the
    given subsections and keep the others."""
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(r"^## Hub\n.*?(?=^## |\Z)", re.S | re.M)
    match = pattern.search(text)
    old: dict[str, str] = {}
    if match:
        for sub in re.finditer(r"^### (.+?)\n(.*?)(?=^### |\Z)", match.group(0), re.S | re.M):
            old[sub.group(1).strip()] = sub.group(2).strip()
    old.update({k: v.strip() for k, v in updates.items()})
    body = ["## Hub", "", INTRO, ""]
    for title in SUBSECTIONS:
        if old.get(title):
            body += [f"### {title}", "", old[title], ""]
    section = "\n".join(body).rstrip() + "\n\n"
    if match:
        text = text[:match.start()] + section + text[match.end():]
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")


def main_bench(args: argparse.Namespace) -> dict[str, Any]:
    names = args.only.split(",") if args.only else list(SCENARIOS)
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-hub-"))
    found = print_conditions(
        loop=args.loop, tmpdir=tmp, **{"GIL switch interval": f"{sys.getswitchinterval() * 1e3:g} ms"},
        sources=("fastapi_lith/engine/hub.py", "fastapi_lith/engine/streams.py", "fastapi_lith/engine/views.py", "fastapi_lith/engine/writer.py", "bench/hub.py"),
    )
    print(f"window {args.seconds} s ({args.seconds / 2} s for the scenarios after full), warm-up {args.warmup} s\n", flush=True)
    res: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    m = micro()
    print("What one render costs, piece by piece (one thread, no hub, best of 7):\n" + micro_table(m) + "\n", flush=True)
    try:
        for name in names:
            sc = SCENARIOS[name]
            secs = args.seconds / 2 if sc.half else args.seconds
            print(f"  {name}: {sc.describe}", flush=True)
            loop_name = sc.loop or args.loop
            if loop_name == "uvloop" and uvloop is None:
                print("  skipped: uvloop is not installed")
                continue
            res[name] = run(sc, tmp, secs, args.warmup, loop_name)
            print_result(res[name], time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    end_load = load_average()
    table, stalled, goals = main_table(res), stalled_table(res), goals_text(res)
    print("\n" + table + "\n\n" + stalled + "\n\n" + goals)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average at the end: {end_load}")
    out = {"conditions": found, "conditions_line": one_line(found), "end_load": end_load,
           "args": vars(args), "results": res, "micro": m, "table": table, "stalled": stalled, "goals": goals}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return out


# -- profile --------------------------------------------------------------------------------------

# Where a py-spy sample's stack says the CPU went: the first rule that matches wins. py-spy's
# idle detection does not work on this VM (it reports threads blocked in epoll or in a work
# queue as running), so those leaves are counted apart as waits.
IDLE_LEAVES = ("EpollSelector.select", "_worker (concurrent/futures/thread.py:81)", "Condition.wait", "Thread.join")
RULES_MAIN = (
    ("loop: hub offers to 200 streams", ("Stream.offer",)),
    ("loop: consumer tasks (Stream.next/take, caught_up)", ("run_scenario.<locals>.consumer",)),
    ("loop: producers (Move built by pydantic, writer.do)", ("run_scenario.<locals>.producer",)),
    ("loop: writer task (batch, futures, subscribers)", ("Writer._run",)),
    ("loop: hub tick (readiness, hand-off to a reader)", ("fastapi_lith/engine/hub.py", "run_scenario.<locals>.tick")),
    ("loop: event loop (select, scheduling, wake-ups)", ("asyncio", "selectors", "uvloop")),
)
RULES_READER = (
    ("reader: datastar event formatting", ("datastar_py",)),
    ("reader: changed cards (fragment misses, htpy)", ("cached (fastapi_lith/engine/views.py",)),
    ("reader: board assembly (htpy over 200 cached cards)", ("htpy", "markupsafe")),
    ("reader: SQLite query (db.all)", ("Db.all", "Db.execute", "Db.scalar")),
    ("reader: board_view (Python: rows, lanes)", ("board_view",)),
    ("reader: view check (root_id), Instance.render (compare)", ("root_id", "View.html", "Instance.render")),
    ("reader: read transaction (BEGIN/COMMIT), pool, wake the loop", ("Readers.call", "thread.py")),
)
RULES_WRITER = (
    ("writer: SQLite (statements, COMMIT)", ("Db.execute", "cur.execute", "SqliteStore._transaction", "Writer._apply (fastapi_lith/engine/writer.py")),
    ("writer: pool, wake the loop", ("",)),
)


def summarize(raw: Path) -> tuple[str, dict[str, float]]:
    by_thread: Counter[str] = Counter()
    by_cat: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        head, _, frames = stack.partition(";")
        tname = head.split(": ", 1)[1] if ": " in head else head
        total += n
        thread = ("loop" if tname.startswith("MainThread") else "reader" if tname.startswith("lith-reader")
                  else "writer" if tname.startswith("lith-writer") else tname)
        by_thread[thread] += n
        rules = {"loop": RULES_MAIN, "reader": RULES_READER, "writer": RULES_WRITER}.get(thread, ((thread, ("",)),))
        cat = f"{thread}: other"
        leaf = frames.rsplit(";", 1)[-1] if frames else "(none)"
        if any(leaf.startswith(idle) for idle in IDLE_LEAVES):
            rules = ((f"{thread}: waiting (epoll, work queue)", ("",)),)
        # Innermost first for the reader and loop (a consumer's caught_up is hub code, but
        # belongs to the consumer; an offer is an offer wherever it is called from).
        for label, needles in rules:
            if any(nd in frames for nd in needles):
                cat = label
                break
        by_cat[cat] += n
        leaves[cat][leaf] += n
    lines = [f"{total} samples of running threads at the sampling rate.\n", "| thread | share of samples |", "|---|---:|"]
    for t, n in by_thread.most_common():
        lines.append(f"| {t} | {n / total:.1%} |")
    lines += ["", "| where | share of samples | hottest leaf frames |", "|---|---:|---|"]
    for c, n in by_cat.most_common():
        top = "; ".join(f"`{leaf}` {k / total:.1%}" for leaf, k in leaves[c].most_common(3))
        lines.append(f"| {c} | {n / total:.1%} | {top} |")
    return "\n".join(lines), {c: n / total for c, n in by_cat.items()}


def profile_target(args: argparse.Namespace) -> None:
    """The process py-spy attaches to: one NORMAL run; prints MEASURE when the window opens."""
    tmp = Path(tempfile.mkdtemp(prefix="lith-bench-hub-profile-"))
    try:
        r = run(SCENARIOS["normal"], tmp, args.seconds, args.warmup, args.loop,
                on_measure=lambda: print("MEASURE", flush=True))
        print_result(r, 0.0)
        print("RESULT " + json.dumps(r, default=str), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


PROFILE_MODES = {
    "active": ([], "every thread py-spy sees running (on this VM that includes threads runnable but "
                   "waiting for a CPU or for the GIL)"),
    "gil": (["--gil"], "only the thread holding the GIL: where the Python CPU goes"),
}


def profile_once(args: argparse.Namespace, mode: str, raw: Path) -> dict[str, Any]:
    """Start one NORMAL run in a child process; attach py-spy once its window opens."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    seconds = args.profile_seconds
    target = [sys.executable, str(Path(__file__).resolve()), "--profile-target", "--seconds", str(seconds + 2),
              "--warmup", str(args.warmup), "--loop", args.loop]
    if args.switch_interval:
        target += ["--switch-interval", str(args.switch_interval)]
    child = subprocess.Popen(target, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    result: dict[str, Any] = {}
    spy_proc = None
    for line in child.stdout:
        if line.startswith("MEASURE"):
            cmd = [spy, "record", "-r", str(args.rate), "-f", "raw", "--threads", *PROFILE_MODES[mode][0],
                   "-o", str(raw), "--pid", str(child.pid), "--duration", str(int(seconds))]
            print("$", " ".join(cmd), flush=True)
            spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
        else:
            print(line, end="", flush=True)
    child.wait()
    if spy_proc is not None:
        spy_proc.wait()
        if not raw.exists():
            print("py-spy wrote nothing:", spy_proc.stderr.read() if spy_proc.stderr else "")
    return result


def main_profile(args: argparse.Namespace) -> str:
    out_dir = Path(args.profile_dir or tempfile.mkdtemp(prefix="lith-hub-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for mode in args.profile_modes.split(","):
        raw = out_dir / f"hub-normal-{mode}.txt"
        print(f"\n== {mode}: {PROFILE_MODES[mode][1]}", flush=True)
        result = profile_once(args, mode, raw)
        if not raw.exists():
            continue
        text, _ = summarize(raw)
        head = (f"**{mode}** — py-spy `record -r {args.rate} -f raw --threads{' --gil' if mode == 'gil' else ''}` "
                f"attached for {int(args.profile_seconds)} s to one NORMAL run ({args.loop}; that run: "
                f"{f(result.get('cores', float('nan')), 3)} cores, {f(result.get('ticks_per_s', float('nan')))} ticks/s, "
                f"commit p50 {f(result.get('commit_p50', float('nan')), 3)} ms); {PROFILE_MODES[mode][1]}.\n")
        print("\n" + head + "\n" + text, flush=True)
        parts.append(head + "\n" + text)
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per main scenario")
    ap.add_argument("--quick", action="store_true", help="8 s windows")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--only", default="", help=f"scenarios, of {','.join(SCENARIOS)}")
    ap.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop"))
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="sys.setswitchinterval for the run (Python's default is 0.005 s)")
    ap.add_argument("--json", default="")
    ap.add_argument("--results", action="store_true", help="write the '## Hub' section of bench/RESULTS.md")
    ap.add_argument("--profile", action="store_true", help="py-spy one NORMAL run")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--profile-dir", default="")
    ap.add_argument("--profile-modes", default="active,gil", help=f"py-spy runs, of {','.join(PROFILE_MODES)}")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--summarize", default="", help="summarize an existing py-spy raw file")
    ap.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.quick:
        args.seconds = 8.0
        args.warmup = 1.0
    if args.summarize:
        print(summarize(Path(args.summarize))[0])
        return
    if args.profile_target:
        profile_target(args)
        return
    if args.profile:
        found = print_conditions(loop=args.loop, sources=("fastapi_lith/engine/hub.py", "bench/hub.py"))
        text = main_profile(args)
        end = load_average()
        print(f"load average at the end: {end}")
        if args.results and text:
            write_results({"Where the CPU goes": f"Conditions: {one_line(found)}. Load average at the end: {end}.\n\n" + text})
        return
    out = main_bench(args)
    if args.results:
        write_results({"Figures": results_section(out)})


def results_section(out: dict[str, Any]) -> str:
    res = out["results"]
    a = out["args"]
    parts = [
        f"Conditions: {out['conditions_line']}. Load average at the end: {out['end_load']}. "
        f"Windows: {a['seconds']:g} s for NORMAL and FULL, {a['seconds'] / 2:g} s for the others; "
        f"warm-up {a['warmup']:g} s; loop {a['loop']}.",
        "",
        "Scenarios: " + "; ".join(f"**{n}**: {r['describe']}" for n, r in res.items()) + ".",
        "",
        main_table(res),
        "",
        "Beside the rule (each stalled stream alone on its own board, every board changing every tick; "
        "rule-off drains and drops those streams after every tick, as if the hub rendered regardless):",
        "",
        stalled_table(res),
        "",
        "Goals:",
        "",
        goals_text(res),
        "",
        "What one render costs, piece by piece (one thread, no hub, best of 7, measured at the start of the run):",
        "",
        micro_table(out["micro"]),
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    main()
