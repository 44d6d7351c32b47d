"""A long list: one click handler on its root sends the command of the row clicked."""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import htpy as h
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import Db, Lith, Rejected, TabCommand, Tx, delegate, new_tab, send, tab_signals

lith = Lith("board.db", migrations=Path(__file__).parent / "board" / "migrations")
app = FastAPI()
app.include_router(lith.router)


class FinishCard(TabCommand):
    card_id: int = Field(ge=1)            # the row's `data-card-id`, sent as "3": pydantic makes it 3

    def apply(self, tx: Tx) -> None:
        if tx.execute("UPDATE card SET lane = 'done' WHERE id = ? AND lane = 'todo'", (self.card_id,)).rowcount == 0:
            raise Rejected("That card was finished or deleted a moment ago.")
        tx.touch("cards")
        self.say("Done.")


lith.command(app, "/cards/finish", FinishCard)


# --8<-- [start:list]
def todo_list(rows: Iterable[Any]) -> h.Element:
    """One handler on the list; each row's button carries only its card's id."""
    return h.ul("#todo", delegate("/cards/finish", "data-card-id"))[
        (h.li[row["title"], h.button({"data-card-id": str(row["id"])})["Done"]] for row in rows)
    ]
# --8<-- [end:list]


# --8<-- [start:per_row]
def todo_list_sending_per_row(rows: Iterable[Any]) -> h.Element:
    """The same list with a `send()` on every row: the whole expression, escaped, 2,000 times."""
    return h.ul("#todo")[
        (h.li[row["title"], h.button({"data-on:click": send("/cards/finish", card_id=row["id"])})["Done"]]
         for row in rows)
    ]
# --8<-- [end:per_row]


@lith.view("todo", topics={"cards"})
def todo(db: Db) -> h.Element:
    return todo_list(db.all("SELECT id, title FROM card WHERE lane = 'todo' ORDER BY id"))


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = new_tab()
    return str(h.html[h.body(tab_signals(tab), data_init=lith.connect("todo", "outcome/{tab}", tab=tab))[
        lith.datastar(),
        await lith.render("todo"),
        await lith.render("outcome/{tab}", tab=tab),
    ]])
