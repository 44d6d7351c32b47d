"""A board of 200 cards (about 142 KB of HTML) served for the stream tests.

Settings come from the environment so each test starts the server it needs:
STREAM_DB, STREAM_KEEPALIVE, STREAM_HIBERNATE, STREAM_SEND_TIMEOUT, STREAM_ENCODING (force one),
STREAM_HTTP_MIDDLEWARE (an `@app.middleware("http")` around every route).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.responses import HTMLResponse

from fastapi_lith import Command, Db, Lith, Tx, Writer, fragment
from fastapi_lith.engine.encoders import Encoder, ZstdEncoder, make_encoder

LOREM = (
    "Collect the numbers from every region, check them against last quarter, note what moved and "
    "why, ask finance about the two outliers, draft a summary for the leads, agree on next steps "
    "with the owners, update the roadmap page, and close the loop with support about the tickets "
    "that customers raised during the launch week; keep the tone short and concrete, link each "
    "claim to its source, and flag anything that still needs a decision before the review meeting "
    "on Thursday so nobody is surprised by it. "
)
MIGRATION = f"""
CREATE TABLE cards (id INTEGER PRIMARY KEY, lane INTEGER NOT NULL, position INTEGER NOT NULL,
                    title TEXT NOT NULL, body TEXT NOT NULL);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
INSERT INTO cards SELECT i, i % 4, i / 4, 'Card ' || i || ': ' || substr('{LOREM}', 1 + i % 50, 30 + i % 30),
       'Details for card ' || i || '. ' || substr('{LOREM}{LOREM}', 1 + (i * 37) % 400, 520) FROM n;
"""

folder = Path(tempfile.mkdtemp(prefix="lith-streamapp-"))
(folder / "0001_cards.sql").write_text(MIGRATION)
lith = Lith(
    os.environ.get("STREAM_DB", str(folder / "board.db")),
    migrations=folder,
    keepalive=float(os.environ.get("STREAM_KEEPALIVE", "15")),
    hibernate_after=float(os.environ.get("STREAM_HIBERNATE", "30")),
    send_timeout=float(os.environ.get("STREAM_SEND_TIMEOUT", "10")),
    same_origin_only=False,
)

cards = sa.table("cards", sa.column("id"), sa.column("lane"), sa.column("position"), sa.column("title"))
MOVE = cards.update().where(cards.c.id == sa.bindparam("card")).values(lane=sa.bindparam("to"))
RENAME = cards.update().where(cards.c.id == sa.bindparam("card")).values(title=sa.bindparam("title"))
ALL = "SELECT * FROM cards ORDER BY lane, position, id"


class Move(Command):
    card: int
    to: int

    def apply(self, tx: Tx) -> None:
        tx.execute(MOVE, {"card": self.card, "to": self.to})
        tx.touch("board")


class Rename(Command):
    card: int
    title: str

    def apply(self, tx: Tx) -> None:
        tx.execute(RENAME, {"card": self.card, "title": self.title})
        tx.touch("board")


class Hold(Command):
    """Rename a card once the test lets it: holds the writer while a shutdown begins."""

    card: int
    title: str
    folder: str

    def apply(self, tx: Tx) -> None:
        (Path(self.folder) / "started").touch()
        for _ in range(3000):  # the test creates "go"; give up after half a minute
            if (Path(self.folder) / "go").exists():
                break
            time.sleep(0.01)
        tx.execute(RENAME, {"card": self.card, "title": self.title})
        tx.touch("board")


@fragment()
def card(row: sqlite3.Row) -> h.Element:
    return h.article(id=f"card-{row['id']}", class_="card")[h.h3[row["title"]], h.p[row["body"]]]


@lith.view("board", topics={"board"})
def board(db: Db) -> h.Element:
    rows = db.all(ALL)
    return h.main(id="board")[
        (h.section(id=f"lane-{lane}")[h.h2[f"Lane {lane}"], [card(r) for r in rows if r["lane"] == lane]] for lane in range(4))
    ]


app = FastAPI(lifespan=lith.lifespan)
if os.environ.get("STREAM_HTTP_MIDDLEWARE"):  # a function middleware, as many apps have one

    @app.middleware("http")
    async def mark(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers["x-app-middleware"] = "seen"
        return response


lith.install(app)  # the stream route, the body limit, errors as HTML for Datastar
app.include_router(lith.metrics_router, dependencies=[Depends(lith.unguarded)])  # a test app on 127.0.0.1
ENCODERS: weakref.WeakSet[Encoder] = weakref.WeakSet()  # open streams' encoders, for /stats


async def recorded_encoder(accept_encoding: str | None = Header(None)) -> Encoder:
    if "STREAM_ENCODING" in os.environ:
        encoder = make_encoder(os.environ["STREAM_ENCODING"])
    else:
        encoder = await lith.encoder(accept_encoding)
    ENCODERS.add(encoder)
    return encoder


app.dependency_overrides[lith.encoder] = recorded_encoder


@app.post("/move", status_code=204)
async def move(cmd: Move, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@app.post("/rename", status_code=204)
async def rename(cmd: Rename, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@app.post("/hold", status_code=204)
async def hold(cmd: Hold, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@app.get("/stats")
async def stats() -> dict[str, int]:
    # A zstd encoder that has sent a frame and holds no compressor ended its frame while idle.
    hibernating = sum(1 for e in ENCODERS if isinstance(e, ZstdEncoder) and e._sent and e.hibernating)
    return {
        "streams": len(lith.hub.streams),
        "instances": len(lith.hub.instances),
        "hibernating": hibernating,
        "rss_kib": rss_kib(),
        "tasks": len(asyncio.all_tasks()),
    }


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    return str(
        h.html[
            h.head[h.script(type="module", src=lith.datastar_url)],
            h.body(data_init=lith.connect("board", tab="page"))[await lith.render("board")],
        ]
    )


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
