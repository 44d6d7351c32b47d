"""Several processes of one app: commit → frame across them, and writers sharing one window.

    r = await commit_to_frame(target, migrations, commits=300, tick=0.05)   # r["local"], r["cross"]
    answers = together("produce", [dict(...), dict(...)])                    # in each child:
    start = await window_start()                                             #   "ready", then the start

The latency: process A sets a counter to 1, 2, 3, ... 20 to 80 ms apart; "commit" is when A's
writer tells its subscribers, "offered" is when a hub offers a stream the frame that shows the
value, in A itself (the writer's subscriber) and in a child B (through the feed: SQLite's
table, which A's ring has B read at once, or PostgreSQL's NOTIFY). Both read CLOCK_MONOTONIC. `target` is a
SQLite file or a PostgreSQL URL: `Lith` takes either.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

from markupsafe import Markup

from fastapi_lith import Command, Db, Frame, Lith, Stream, Tx

from . import harness

SET = "UPDATE counter SET count = :value WHERE id = 1"


class Set(Command):
    value: int

    def apply(self, tx: Tx) -> None:
        tx.execute(SET, {"value": self.value})
        tx.touch("counter")


class Recorder(Stream):
    """A stream that notes when the hub first offers it each value of the counter."""

    def __init__(self, tab: str) -> None:
        super().__init__(tab)
        self.offered: dict[int, float] = {}

    def offer(self, frame: Frame) -> bool:
        value = int(frame.html.rsplit(">", 2)[-2].split("<", 1)[0])
        self.offered.setdefault(value, time.monotonic())
        return super().offer(frame)


def counter_app(target: str, migrations: str, tick: float) -> Lith:
    lith = Lith(target, migrations=migrations, tick=tick)

    @lith.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter WHERE id = 1"))

    return lith


async def drain(stream: Stream) -> None:
    while await stream.next():
        pass


async def watch(target: str, migrations: str, tick: float) -> dict[str, Any]:
    """Process B (a child): one stream on the counter, recording offers until told to stop."""
    lith = counter_app(target, migrations, tick)
    stream = Recorder("b")
    try:
        async with lith.lifespan():
            await lith.hub.open(stream, ["counter"])
            print("ready", flush=True)
            taking = asyncio.create_task(drain(stream))
            await asyncio.to_thread(sys.stdin.readline)
            taking.cancel()
    except Exception as exc:  # noqa: BLE001 - a finding, reported: the app's shutdown failed
        return {"offered": stream.offered, "closing": f"{type(exc).__name__}: {exc}"}
    return {"offered": stream.offered, "closing": ""}


async def commit_to_frame(target: str, migrations: Path, commits: int, tick: float) -> dict[str, Any]:
    lith = counter_app(target, str(migrations), tick)
    committed: dict[int, float] = {}
    local = Recorder("a")
    measured, closing = False, ""
    try:
        async with lith.lifespan():  # A first: it migrates, B finds the database ready
            watcher = harness.child("watch", target=target, migrations=str(migrations), tick=tick)
            assert watcher.stdout.readline().strip() == "ready"
            await lith.hub.open(local, ["counter"])
            value = 0
            lith.writer.subscribe(lambda topics: committed.setdefault(value, time.monotonic()))
            taking = asyncio.create_task(drain(local))
            rng = random.Random(13)
            for value in range(1, commits + 1):  # noqa: B007 - the subscriber reads it
                await lith.writer.do(Set(value=value))
                await asyncio.sleep(rng.uniform(0.02, 0.08))
            await asyncio.sleep(2 * tick + 0.2)  # the last value's tick, here and in B
            taking.cancel()
            watcher.stdin.write("stop\n")
            watcher.stdin.flush()
            measured = True
    except Exception as exc:
        if not measured:
            raise
        closing = f"A: {type(exc).__name__}: {exc}"  # a finding, reported: the app's shutdown failed
    answer = harness.answer(watcher)
    offered = {int(k): v for k, v in answer["offered"].items()}
    closing = "; ".join(c for c in (closing, answer["closing"] and f"B: {answer['closing']}") if c)
    return {"closing": closing, "cross": [offered[v] - t for v, t in committed.items() if v in offered],
            "local": [local.offered[v] - t for v, t in committed.items() if v in local.offered],
            "missing": commits - sum(1 for v in committed if v in offered)}


def together(role: str, each: list[dict[str, Any]]) -> list[Any]:
    """Start one child per kwargs, wait until every one is ready, give them one start, answers."""
    procs = [harness.child(role, **kwargs) for kwargs in each]
    for proc in procs:
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"a {role} process did not start: {line!r}")
    start = f"{time.time() + 0.2}\n"
    for proc in procs:
        proc.stdin.write(start)
        proc.stdin.flush()
    return [harness.answer(p) for p in procs]


async def window_start() -> float:
    """In a child of `together`: say ready, then wait for the common start (wall clock)."""
    print("ready", flush=True)
    start = float(await asyncio.to_thread(sys.stdin.readline))
    await asyncio.sleep(max(0.0, start - time.time()))
    return start
