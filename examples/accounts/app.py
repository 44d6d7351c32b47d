"""One database per account: each team its own counter and notes, in its own SQLite file.

    uvicorn examples.accounts.app:app        # then open http://127.0.0.1:8000/

`ACCOUNTS_DIR` (default `accounts/`) holds one file per team, `accounts/NAME.db`.
"""

import os
from pathlib import Path
from urllib.parse import parse_qs

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import Field

from fastapi_lith import (
    ACCOUNT_NAME, Accounts, Db, Rejected, SecurityHeaders, TabCommand, Tx, Writer, new_tab, pending, send, tab_signals,
)

# --8<-- [start:accounts]
accounts = Accounts(
    os.environ.get("ACCOUNTS_DIR", "accounts"),    # accounts/NAME.db, one file per account
    migrations=Path(__file__).parent / "migrations",  # applied to each file when it opens
    max_open=50,                                   # at most 50 open, least recently used closes
    idle_after=60.0,                               # an account idle this long closes
)
# --8<-- [end:accounts]

counter = sa.table("counter", sa.column("id"), sa.column("count"))
note = sa.table("note", sa.column("id"), sa.column("text"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)
NOTES = sa.select(note.c.id, note.c.text).order_by(note.c.id.desc()).limit(20)
NEWEST = sa.select(note.c.text).order_by(note.c.id.desc()).limit(1)


# A person's click: a TabCommand carries its tab and op, and the tab's outcome view (built in,
# in every account) says what happened and releases the button that sent it.
class Add(TabCommand):
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")
        count = tx.scalar(COUNT)
        self.say(f"Added {self.n}: the count is {count}.")
        return count


class Note(TabCommand):
    text: str = Field(min_length=1, max_length=200)

    def apply(self, tx: Tx) -> None:
        if tx.scalar(NEWEST) == self.text:
            raise Rejected("That note is already the newest one.")  # the tab is told why
        tx.execute(note.insert().values(text=self.text))
        tx.touch("notes")
        self.say("Note added.")


# --8<-- [start:views]
# The same views in every account, each rendered from its own account's file: the key
# "counter" in one account and "counter" in another are two different instances.
@accounts.view("counter", topics={"counter"})
def counter_view(db: Db) -> h.Element:
    return h.p("#counter.count")[db.scalar(COUNT)]
# --8<-- [end:views]


@accounts.view("notes", topics={"notes"})
def notes_view(db: Db) -> h.Element:
    return h.ul("#notes")[(h.li[row["text"]] for row in db.all(NOTES))]


app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # no API docs in production
app.add_middleware(SecurityHeaders, datastar_url=accounts.datastar_url)  # CSP, nosniff, no framing
app.include_router(accounts.router)  # /a/{account}/..., the stream, the lifespan; routes added below too


# --8<-- [start:routes]
# Routes on accounts.router live under /a/{account}/ and know their account.
@accounts.router.post("/add", status_code=204)
async def add(cmd: Add, writer: Writer = Depends(accounts.writer)) -> None:
    await writer.do(cmd)                  # this account's writer: no other account waits on it
# --8<-- [end:routes]


accounts.command("/note", Note)           # POST /a/{account}/note: validated, applied, 204


STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 36rem; margin: 2rem auto; padding: 0 1rem; }
.count { font-size: 3rem; margin: .5rem 0; font-variant-numeric: tabular-nums; }
button { font: inherit; padding: .4rem 1rem; border: 0; border-radius: .4rem; background: #2563eb; color: white; }
input { font: inherit; padding: .3rem .5rem; }
.lith-error, .failed { color: #b42318; }
.pending { opacity: .6; }
"""


# --8<-- [start:page]
@accounts.router.get("/", response_class=HTMLResponse)
async def board() -> str:
    tab = new_tab()
    name = accounts.account().name
    note = send(accounts.url("/note"), text="$text")
    return str(
        h.html[
            h.head[h.title[name], h.style[STYLE], h.script(type="module", src=accounts.datastar_url)],
            h.body(
                tab_signals(tab, n=1, text=""),
                # This account's stream: its views and the tab's outcome (the message, `done`).
                data_init=accounts.connect("counter", "notes", "outcome/{tab}", tab=tab),
            )[
                h.h1[f"Team {name}"],
                await accounts.render("counter"),      # first paint, from this account's file
                h.button("#add", {"data-on:click": send(accounts.url("/add"), n="$n")}, pending())["Add one"],
                h.form({"data-on:submit__prevent": note})[
                    h.input("#text", {"data-bind:text": True, "placeholder": "A note"}),
                    h.button["Add note"],
                ],
                await accounts.render("outcome/{tab}", tab=tab),
                await accounts.render("notes"),
                h.p[h.a(href="/")["All teams"]],
            ],
        ]
    )
# --8<-- [end:page]


@app.get("/", response_class=HTMLResponse)
async def home() -> str:
    return str(
        h.html[
            h.head[h.title["Teams"], h.style[STYLE]],
            h.body[
                h.h1["Teams"],
                h.ul[(h.li[h.a(href=f"/a/{name}/")[name]] for name in accounts.names())],
                h.form(method="post", action="/accounts")[
                    h.input(name="name", placeholder="new-team", pattern=ACCOUNT_NAME.pattern, required=True),
                    h.button["Create"],
                ],
            ],
        ]
    )


# --8<-- [start:create]
# Creating an account is explicit: a GET of an unknown account is a 404 and makes no file.
# A plain form: `same_origin` refuses one posted from another site.
@app.post("/accounts", dependencies=[Depends(accounts.same_origin)])
async def create(request: Request) -> RedirectResponse:
    name = parse_qs((await request.body()).decode()).get("name", [""])[0]
    if not ACCOUNT_NAME.fullmatch(name):
        raise HTTPException(422, "A team name is 1 to 63 of a-z, 0-9, '-' and '_'.")
    await accounts.create(name)           # makes accounts/NAME.db and migrates it
    return RedirectResponse(f"/a/{name}/", status_code=303)
# --8<-- [end:create]
