"""The counter: one table, one command, a shared view and a per-tab view.

    uvicorn examples.counter.app:app
"""

import os
import secrets
from pathlib import Path

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import Command, Db, Lith, Tx, Writer

# The app's own wording for validation errors, by pydantic's error type; others keep pydantic's.
WORDING = {
    "greater_than_equal": "Pick a number from 1 to 100.",
    "less_than_equal": "Pick a number from 1 to 100.",
    "int_parsing": "Type a whole number.",
    "json_invalid": "The page sent something unreadable: reload it and try again.",
}

lith = Lith(
    os.environ.get("COUNTER_DB", "counter.db"),
    migrations=Path(__file__).parent / "migrations",
    messages=lambda error: WORDING.get(error["type"]),
)

# Statements are built once, at import: the writer compiles each one once and reuses it.
counter = sa.table("counter", sa.column("id"), sa.column("count"))
outcome = sa.table("outcome", sa.column("tab"), sa.column("op"), sa.column("message"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)
# Plain SQL that SQLite and PostgreSQL both speak: `text` binds its parameters for either.
RECORD = sa.text(
    "INSERT INTO outcome (tab, op, message) VALUES (:tab, :op, :message)"
    " ON CONFLICT (tab) DO UPDATE SET op = excluded.op, message = excluded.message"
)
LAST = sa.select(outcome.c.op, outcome.c.message).where(outcome.c.tab == sa.bindparam("tab"))


class Add(Command):
    """Add `n` to the counter. `tab` and `op` are the page's signals: who asked, and which click."""

    n: int = Field(1, ge=1, le=100)
    tab: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    op: int = 0

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        total = tx.scalar(COUNT)
        tx.execute(RECORD, {"tab": self.tab, "op": self.op, "message": f"You added {self.n}: {total}."})
        tx.touch("counter", f"tab:{self.tab}")
        return total


@lith.view("counter", topics={"counter"})
def counter_view(db: Db) -> h.Element:
    return h.p("#counter.count")[db.scalar(COUNT)]


@lith.view("outcome/{tab}", topics={"tab:{tab}"})
def outcome_view(db: Db, tab: str) -> h.Element:
    last = db.first(LAST, {"tab": tab})
    # `done` tells the page which of its clicks has landed: the button is pending until then.
    return h.div("#outcome", {"data-signals:done": str(last["op"] if last else 0)})[
        h.p(".message")[last["message"] if last else "No clicks from this tab yet."],
        h.div("#lith-error"),
    ]


app = FastAPI(lifespan=lith.lifespan)
lith.install(app)  # the stream route, the body limit, errors as HTML for Datastar


@app.post("/add", status_code=204, include_in_schema=False)
async def add(cmd: Add, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 32rem; margin: 4rem auto; color: #1f2328; }
.count { font-size: 4rem; font-weight: 700; margin: 0; }
form { display: flex; gap: .5rem; align-items: center; }
input { width: 5rem; font: inherit; padding: .3rem; }
button { font: inherit; padding: .4rem 1rem; border: 0; border-radius: .4rem; background: #2563eb; color: white; cursor: pointer; }
button.pending { opacity: .5; cursor: progress; }
.message { color: #57606a; }
.lith-error { color: #b42318; background: #fef3f2; border-radius: .4rem; padding: .2rem .8rem; }
.lith-error ul { margin: 0; padding-left: 1rem; }
"""


SHOW_NOTICE = "document.getElementById('no-datastar').hidden = false"


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = secrets.token_urlsafe(9)
    return str(
        h.html(lang="en")[
            h.head[
                h.meta(charset="utf-8"),
                h.title["Counter"],
                h.style[STYLE],
                # Nothing here works without Datastar: if it cannot load, say so.
                h.script(type="module", src=lith.datastar_url, onerror=SHOW_NOTICE),
            ],
            h.body(
                data_signals=f"{{tab: '{tab}', op: 0, done: 0, n: 1}}",
                data_init=lith.connect("counter", "outcome/{tab}", tab=tab),
            )[
                h.p("#no-datastar", role="alert", hidden=True)["Datastar did not load: reload to try again."],
                h.h1["Counter"],
                await lith.render("counter"),
                # `dialog`: without Datastar, Enter does not reload the page.
                h.form({"data-on:submit": "$op = $op + 1; @post('/add')"}, method="dialog")[
                    h.input(type="number", data_bind="n", aria_label="amount"),
                    h.button({"data-class:pending": "$op != $done", "data-attr:aria-busy": "$op != $done"})[
                        "Add"
                    ],
                ],
                await lith.render("outcome/{tab}", tab=tab),
            ],
        ]
    )
