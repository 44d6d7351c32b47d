"""The counter: one table, one command, one shared view. Run: `uvicorn examples.counter.app:app`."""

import os
from pathlib import Path

import htpy as h
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import Db, Lith, SecurityHeaders, TabCommand, Tx, new_tab, pending, send, tab_signals

HERE = Path(__file__).parent
RANGE = "Pick a number from 1 to 100."  # the app's own wording of pydantic's errors, by type
WORDING = {"greater_than_equal": RANGE, "less_than_equal": RANGE, "int_parsing": "Type a whole number.",
           "json_invalid": "The page sent something unreadable: reload it and try again."}
lith = Lith(os.environ.get("COUNTER_DB", "counter.db"), migrations=HERE / "migrations",
            messages=lambda error: WORDING.get(error["type"]), outcome_hint="No clicks from this tab yet.")
ADD = "UPDATE counter SET count = count + :n WHERE id = 1"
COUNT = "SELECT count FROM counter WHERE id = 1"


class Add(TabCommand):
    """Add `n` to the counter; the tab that asked is told the new total."""
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        total = tx.scalar(COUNT)
        tx.touch("counter")
        self.say(f"You added {self.n}: {total}.")
        return total


@lith.view("counter", topics={"counter"})
def counter_view(db: Db) -> h.Element:  # every tab shows it; each also gets "outcome/{tab}"
    return h.p("#counter.count")[db.scalar(COUNT)]


# A production app serves no API docs: its routes are the page and its commands.
app = FastAPI(lifespan=lith.lifespan, docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(SecurityHeaders, datastar_url=lith.datastar_url)  # CSP, nosniff, no framing
lith.install(app)  # the stream route, the body limit, errors as HTML for Datastar
lith.command(app, "/add", Add)


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = new_tab()
    return str(h.html(lang="en")[
        h.head[h.meta(charset="utf-8"), h.title["Counter"], h.style[(HERE / "counter.css").read_text()]],
        h.body(tab_signals(tab, n=1), data_init=lith.connect("counter", "outcome/{tab}", tab=tab))[
            lith.datastar(), h.h1["Counter"], await lith.render("counter"),
            # `dialog`: without Datastar, Enter does not reload the page.
            h.form({"data-on:submit": send("/add")}, method="dialog")[
                h.input(type="number", data_bind="n", aria_label="amount"), h.button(pending())["Add"]
            ],
            await lith.render("outcome/{tab}", tab=tab),
        ],
    ])
