"""Notes everybody signed in sees, tasks only their owner sees, and a staff view for members.

Run it with a secret of your own in APP_SECRET:
`python -c 'import secrets; print(secrets.token_urlsafe())'` makes one.
"""

import os
from pathlib import Path
from typing import Annotated

import htpy as h
from fastapi import Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import Field
from starlette.middleware.sessions import SessionMiddleware

from fastapi_lith import Db, FromServer, Lith, TabCommand, Tx, new_tab, send, tab_signals

SECRET = os.environ["APP_SECRET"]  # signs the session cookie and the stream tokens


# --8<-- [start:identity]
async def current_user(request: Request) -> str | None:
    """The app's own sign-in: the user's name in Starlette's signed session cookie."""
    return request.session.get("user")


lith = Lith(
    "notes.db",
    migrations=Path(__file__).parent / "migrations",
    identity=current_user,  # asked on every page that takes Depends(lith.principal), every stream open
    secret=SECRET,          # pages sign what they rendered into their stream's URL
)
# --8<-- [end:identity]


# --8<-- [start:views]
@lith.view("notes", topics={"notes"})  # everybody's: the page that renders it decides who sees it
def notes(db: Db) -> h.Element:
    rows = db.all("SELECT author, text FROM notes ORDER BY id")
    return h.ul("#notes")[(h.li[f"{row['author']}: {row['text']}"] for row in rows)]


@lith.view("tasks/{principal}", topics={"tasks:{principal}"})  # one instance per user, never another's
def tasks(db: Db, principal: str) -> h.Element:
    rows = db.all("SELECT title FROM tasks WHERE owner = ? ORDER BY id", (principal,))
    return h.ul("#tasks")[(h.li[row["title"]] for row in rows)]


def is_member(db: Db, principal: str | None, team: str) -> bool:
    """Asked on every stream open: a member removed is refused at their next reconnect."""
    return db.first("SELECT 1 FROM members WHERE team = ? AND user = ?", (team, principal)) is not None


@lith.view("team/{team}", topics={"team:{team}"}, access=is_member)
def team(db: Db, team: str) -> h.Element:
    rows = db.all("SELECT user FROM members WHERE team = ? ORDER BY user", (team,))
    return h.p("#team")[f"{team}: ", ", ".join(row["user"] for row in rows)]
# --8<-- [end:views]


class AddNote(TabCommand):
    text: str = Field(min_length=1, max_length=200)
    author: Annotated[str, FromServer()]  # the signed-in user, never the page

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO notes (author, text) VALUES (?, ?)", (self.author, self.text))
        tx.touch("notes")


class AddTask(TabCommand):
    title: str = Field(min_length=1, max_length=200)
    owner: Annotated[str, FromServer()]

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO tasks (owner, title) VALUES (?, ?)", (self.owner, self.title))
        tx.touch(f"tasks:{self.owner}")


app = FastAPI()
app.add_middleware(SessionMiddleware, secret_key=SECRET, same_site="lax", https_only=False)
app.include_router(lith.router)
lith.command(app, "/notes", AddNote)  # nobody signed in: 401, a str field has no None
lith.command(app, "/tasks", AddTask)


# --8<-- [start:sign_in]
@app.post("/signin", include_in_schema=False, dependencies=[Depends(lith.same_origin)])
async def sign_in(request: Request, user: str = Form(pattern=r"^[a-z]{1,20}$")) -> RedirectResponse:
    request.session["user"] = user  # a real app checks a password or asks its identity provider
    return RedirectResponse("/", status_code=303)


@app.post("/signout", include_in_schema=False, dependencies=[Depends(lith.same_origin)])
async def sign_out(request: Request) -> RedirectResponse:
    user = request.session.pop("user", None)
    if user is not None:
        await lith.revoke(user)  # every stream of theirs ends now, in every process
    return RedirectResponse("/", status_code=303)
# --8<-- [end:sign_in]


# --8<-- [start:page]
@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page(user: str | None = Depends(lith.principal)) -> str:
    if user is None:
        return str(h.html[h.body[
            h.form(method="post", action="/signin")[h.input(name="user", aria_label="Name"), h.button["Sign in"]],
        ]])
    tab = new_tab()
    views = ["notes", "tasks/{principal}", "outcome/{tab}"]  # `{principal}` is the page's user
    return str(h.html[
        h.body(tab_signals(tab, text="", title=""), data_init=lith.connect(*views, tab=tab))[
            lith.datastar(),
            h.p["Signed in as ", h.strong("#me")[user]],
            h.form(method="post", action="/signout")[h.button["Sign out"]],
            await lith.render("notes"),
            h.form({"data-on:submit": send("/notes", text="$text")})[
                h.input(data_bind="text", aria_label="Note"), h.button["Add note"],
            ],
            await lith.render("tasks/{principal}"),
            h.form({"data-on:submit": send("/tasks", title="$title")})[
                h.input(data_bind="title", aria_label="Task"), h.button["Add task"],
            ],
            await lith.render("outcome/{tab}", tab=tab),
        ]
    ])

# --8<-- [end:page]
