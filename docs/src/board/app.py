"""Cards on boards: views with parameters, cached fragments, raw SQL, bulk imports."""

import sqlite3
from pathlib import Path
from typing import Annotated

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI, Path as PathParam
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import Command, Db, Lith, Rejected, Tx, Writer, fragment

lith = Lith("board.db", migrations=Path(__file__).parent / "migrations")
app = FastAPI()
app.include_router(lith.router)

card = sa.table("card", sa.column("id"), sa.column("board_id"), sa.column("title"), sa.column("lane"))


# --8<-- [start:view]
CARDS = sa.select(card.c.id, card.c.title, card.c.lane).where(card.c.board_id == sa.bindparam("board_id"))


@lith.view("board/{board_id}", topics={"board:{board_id}"})
def board(db: Db, board_id: int) -> h.Element:
    rows = db.all(CARDS, {"board_id": board_id})
    return h.ul(id=f"board-{board_id}")[(card_html(row) for row in rows)]
# --8<-- [end:view]


# --8<-- [start:fragment]
@fragment()
def card_html(row: sqlite3.Row) -> h.Element:
    return h.li(id=f"card-{row['id']}", class_="card")[row["title"]]
# --8<-- [end:fragment]


# --8<-- [start:command]
INSERT_CARD = "INSERT INTO card (board_id, title, lane) VALUES (:board_id, :title, :lane)"


class AddCard(Command):
    board_id: int
    title: str
    lane: str = "todo"

    def apply(self, tx: Tx) -> None:
        tx.execute(INSERT_CARD, {"board_id": self.board_id, "title": self.title, "lane": self.lane})
        tx.touch(f"board:{self.board_id}")    # only board/<this id> renders
# --8<-- [end:command]


# --8<-- [start:raw]
class RenameCard(Command):
    card_id: int
    title: str

    def apply(self, tx: Tx) -> None:
        row = tx.first("SELECT board_id FROM card WHERE id = ?", (self.card_id,))
        if row is None:          # rolls this command back; the route answers 409 with the reason
            raise Rejected("That card was deleted a moment ago, so nothing changed.")
        tx.execute("UPDATE card SET title = :title WHERE id = :id", {"title": self.title, "id": self.card_id})
        tx.touch(f"board:{row['board_id']}")
# --8<-- [end:raw]


# --8<-- [start:route]
lith.command(app, "/cards/rename", RenameCard)
# --8<-- [end:route]


# --8<-- [start:import]
class NewCard(BaseModel):
    board_id: int
    title: str
    lane: str


class ImportCards(Command):
    cards: list[NewCard]

    def apply(self, tx: Tx) -> int:
        n = tx.executemany(INSERT_CARD, (card.model_dump() for card in self.cards))
        tx.touch(*{f"board:{card.board_id}" for card in self.cards})
        return n


async def import_cards(writer: Writer, cards: list[NewCard], chunk: int = 1000) -> int:
    imported = 0
    for start in range(0, len(cards), chunk):
        imported += await writer.do(ImportCards(cards=cards[start : start + chunk]))
    return imported
# --8<-- [end:import]


# --8<-- [start:read]
COUNT = sa.select(sa.func.count()).select_from(card).where(card.c.board_id == sa.bindparam("board_id"))


BoardId = Annotated[int, PathParam(ge=1, le=2**63 - 1)]  # a URL's id, in SQLite's range: else 422


@app.get("/boards/{board_id}/count.json")
async def count(board_id: BoardId, conn: AsyncConnection = Depends(lith.db)) -> dict[str, int]:
    return {"count": await conn.scalar(COUNT, {"board_id": board_id})}
# --8<-- [end:read]


# --8<-- [start:stats]
@app.get("/stats.json", include_in_schema=False)
async def stats() -> dict[str, object]:
    c = lith.hub.counters
    return {
        "ticks": c.ticks,
        "renders": c.renders,
        "frames": c.frames,
        "skipped": c.skipped,
        "render_errors": c.render_errors,
        "tick_ms": c.tick_percentiles(),
        "commands": lith.writer.commands,
    }
# --8<-- [end:stats]
