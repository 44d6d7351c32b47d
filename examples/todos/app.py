"""Todos: each person's own list behind a sign-in, and one line that everyone sees change.

    uvicorn examples.todos.app:app        # then open http://127.0.0.1:8000/

Who sees what (docs/access.md). A signed session cookie (Starlette's `SessionMiddleware`,
keyed by `TODOS_SECRET`) says who is asking, and `identity=` hands that to the library:

* a tab watches only its own person's list: the view `todos/{principal}` is private to the
  principal it names, and the page's stream URL is signed for the views it rendered;
* a todo's owner is the signed-in person, whatever the page sends (`FromServer()`);
* signing out ends that person's streams at once, in every tab (`lith.revoke`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import StringConstraints
from starlette.middleware.sessions import SessionMiddleware

from fastapi_lith import (
    Db,
    FromServer,
    Lith,
    Rejected,
    SecurityHeaders,
    TabCommand,
    Tx,
    new_tab,
    pending,
    send,
    tab_signals,
)

from .signin import person, signed_in, signin_routes

HERE = Path(__file__).parent
# Unset, every start makes a new one: sessions and stream tokens then last until the restart.
SECRET = os.environ.get("TODOS_SECRET") or secrets.token_urlsafe(32)
# The counter example's stylesheet, and the rules of a list and a sign-out button.
STYLE = (HERE.parent / "counter" / "counter.css").read_text() + (HERE / "todos.css").read_text()

# --8<-- [start:identity]
lith = Lith(
    os.environ.get("TODOS_DB", "todos.db"),
    migrations=HERE / "migrations",
    identity=signed_in,  # the stream route and FromServer() fields ask it on every request
    secret=SECRET,  # signs each page's stream URL: a tab watches only what its page rendered
    outcome_hint="Nothing added from this tab yet.",
)
# --8<-- [end:identity]

todo = sa.table("todo", sa.column("id"), sa.column("owner"), sa.column("title"), sa.column("done"))
MINE = sa.select(todo.c.id, todo.c.title, todo.c.done).where(todo.c.owner == sa.bindparam("owner")).order_by(todo.c.id)
ADD = todo.insert().values(owner=sa.bindparam("owner"), title=sa.bindparam("title"))
TOGGLE = (
    todo.update()
    .where(todo.c.id == sa.bindparam("todo"), todo.c.owner == sa.bindparam("me"))
    .values(done=1 - todo.c.done)
)
OPEN = (
    sa.select(person.c.name, sa.func.count(todo.c.id).label("open"))
    .join(todo, (todo.c.owner == person.c.id) & (todo.c.done == 0))
    .group_by(person.c.id)
    .order_by(person.c.name)
)
Title = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=120)]


# --8<-- [start:commands]
class AddTodo(TabCommand):
    """Add a todo to the signed-in person's list: `owner` comes from the session, never the page."""

    title: Title
    owner: Annotated[int, FromServer()]

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"owner": self.owner, "title": self.title})
        tx.touch(f"todos:{self.owner}", "everyone")
        self.say(f"Added “{self.title}”.")


class ToggleTodo(TabCommand):
    """Tick a todo or untick it: only one of the signed-in person's own."""

    todo: int
    owner: Annotated[int, FromServer()]

    def apply(self, tx: Tx) -> None:
        if tx.execute(TOGGLE, {"todo": self.todo, "me": self.owner}).rowcount == 0:
            raise Rejected("That todo is not on your list.")
        tx.touch(f"todos:{self.owner}", "everyone")
# --8<-- [end:commands]


# --8<-- [start:views]
@lith.view("todos/{principal}", topics={"todos:{principal}"})
def my_todos(db: Db, principal: int) -> h.Element:
    """One person's list: rendered once per person, shared by all of their tabs."""
    rows = db.all(MINE, {"owner": principal})
    return h.ul("#todos")[
        (h.li(".done" if row["done"] else None)[
            h.button({"data-on:click": send("/toggle", todo=row["id"])}, pending(), aria_label="toggle")[
                "☑" if row["done"] else "☐"
            ],
            " ", row["title"],
        ] for row in rows)
    ]


@lith.view("everyone", topics={"everyone"})
def everyone(db: Db) -> h.Element:
    """What every signed-in tab sees: who has how many open todos."""
    rows = db.all(OPEN)
    return h.p("#everyone")[", ".join(f"{r['name']}: {r['open']} open" for r in rows) or "Nobody has an open todo."]
# --8<-- [end:views]


app = FastAPI(lifespan=lith.lifespan, docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(SecurityHeaders, datastar_url=lith.datastar_url)
app.add_middleware(SessionMiddleware, secret_key=SECRET, same_site="lax", session_cookie="todos")
lith.install(app)
app.include_router(signin_routes(lith, title="Todos", style=STYLE))  # /signin, /signup, /signout
lith.command(app, "/add", AddTodo)
lith.command(app, "/toggle", ToggleTodo)


@app.get("/", response_class=HTMLResponse, include_in_schema=False, response_model=None)
async def page(me: int | None = Depends(lith.principal)) -> Response | str:
    if me is None:
        return RedirectResponse("/signin", status_code=303)
    tab = new_tab()
    return str(h.html(lang="en")[
        h.head[h.meta(charset="utf-8"), h.title["Todos"], h.style[STYLE]],
        h.body(tab_signals(tab, title=""),
               data_init=lith.connect("todos/{principal}", "everyone", "outcome/{tab}", tab=tab))[
            lith.datastar(),
            h.h1["Your todos"],
            h.form(method="post", action="/signout")[h.button(".quiet")["Sign out"]],
            await lith.render("everyone"),
            await lith.render("todos/{principal}"),
            h.form({"data-on:submit": send("/add")}, method="dialog")[
                h.input(data_bind="title", aria_label="new todo", placeholder="a new todo"),
                h.button(pending())["Add"],
            ],
            await lith.render("outcome/{tab}", tab=tab),
        ],
    ])
