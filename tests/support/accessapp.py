"""Who may watch what, served for the access tests: sessions, per-user views, a team view.

A session is a row (`POST /signin`), named by the `X-Session` header; signing out deletes the
row and revokes the user's streams. `X-Session: expired` makes the identity itself refuse (401).
Settings from the environment: ACCESS_DB, ACCESS_SECRET (comma-separated keys, oldest first;
unset for none), ACCESS_MAX_AGE.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import htpy as h
import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import HTMLResponse, PlainTextResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import Command, Db, Lith, Tx, Writer, new_tab

MIGRATION = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, user TEXT NOT NULL);
CREATE TABLE tasks (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL);
CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE members (team INTEGER NOT NULL, user TEXT NOT NULL, PRIMARY KEY (team, user));
"""

folder = Path(tempfile.mkdtemp(prefix="lith-accessapp-"))
(folder / "0001_access.sql").write_text(MIGRATION)
secret = os.environ.get("ACCESS_SECRET")


async def session_db() -> AsyncIterator[AsyncConnection]:
    async for conn in lith.db():
        yield conn


SESSION_USER = sa.text("SELECT user FROM sessions WHERE id = :id")


async def current_user(
    x_session: str | None = Header(None), db: AsyncConnection = Depends(session_db)
) -> str | None:
    """The app's own identity: a server-side session, as a signed cookie would name it."""
    if x_session is None:
        return None
    if x_session == "expired":
        raise HTTPException(401, "the session expired: sign in again", headers={"WWW-Authenticate": "Session"})
    return (await db.execute(SESSION_USER, {"id": x_session})).scalar()


lith = Lith(
    os.environ.get("ACCESS_DB", str(folder / "access.db")),
    migrations=folder,
    same_origin_only=False,
    identity=current_user,
    secret=secret.split(",") if secret else None,
    stream_max_age=float(os.environ.get("ACCESS_MAX_AGE", str(24 * 3600))),
)


class SignIn(Command):
    session: str
    user: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?)", (self.session, self.user))


class SignOut(Command):
    session: str

    def apply(self, tx: Tx) -> str | None:
        user = tx.scalar("SELECT user FROM sessions WHERE id = ?", (self.session,))
        tx.execute("DELETE FROM sessions WHERE id = ?", (self.session,))
        return user


class AddTask(Command):
    owner: str
    title: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO tasks (owner, title) VALUES (?, ?)", (self.owner, self.title))
        tx.touch(f"tasks:{self.owner}")


class AddNote(Command):
    text: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO notes (text) VALUES (?)", (self.text,))
        tx.touch("board")


class Membership(Command):
    team: int
    user: str
    member: bool

    def apply(self, tx: Tx) -> None:
        if self.member:
            tx.execute("INSERT OR IGNORE INTO members VALUES (?, ?)", (self.team, self.user))
        else:
            tx.execute("DELETE FROM members WHERE team = ? AND user = ?", (self.team, self.user))
        tx.touch(f"team:{self.team}")


@lith.view("board", topics={"board"})
def board(db: Db) -> h.Element:
    return h.ul(id="board")[(h.li[row["text"]] for row in db.all("SELECT text FROM notes ORDER BY id"))]


@lith.view("tasks/{principal}", topics={"tasks:{principal}"})
def tasks(db: Db, principal: str) -> h.Element:
    rows = db.all("SELECT title FROM tasks WHERE owner = ? ORDER BY id", (principal,))
    return h.ul(id="tasks")[(h.li[row["title"]] for row in rows)]


def is_member(db: Db, principal: str | None, team: int) -> bool:
    return db.scalar("SELECT 1 FROM members WHERE team = ? AND user = ?", (team, principal)) is not None


@lith.view("team/{team}", topics={"team:{team}"}, access=is_member)
def team(db: Db, team: int) -> h.Element:
    rows = db.all("SELECT user FROM members WHERE team = ? ORDER BY user", (team,))
    return h.ul(id=f"team-{team}")[(h.li[row["user"]] for row in rows)]


app = FastAPI(lifespan=lith.lifespan)
lith.install(app)


@app.get("/connect", response_class=PlainTextResponse)
async def connect(keys: str, tab: str, principal: Any = Depends(lith.principal)) -> str:
    """The stream URL a page rendered for this session would open."""
    expression = lith.connect(*keys.split(","), tab=tab)
    return expression.split("'")[1]


LOADS = {"page": 0}


@app.get("/page", response_class=HTMLResponse)
async def page(keys: str, principal: Any = Depends(lith.principal)) -> str:
    """A page of `keys` for the session (Playwright sends `X-Session` with every request), and
    how many times it was loaded: a stream it opens may be refused."""
    LOADS["page"] += 1
    tab = new_tab()
    return str(h.html[h.body(data_init=lith.connect(*keys.split(","), tab=tab))[
        lith.datastar(), h.p(id="loads")[LOADS["page"]],
    ]])


@app.get("/loads")
async def loads() -> dict[str, int]:
    return LOADS


@app.post("/signin", status_code=204)
async def sign_in(cmd: SignIn, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@app.post("/signout", status_code=204)
async def sign_out(cmd: SignOut, writer: Writer = Depends(lith.writer)) -> None:
    user = await writer.do(cmd)
    if user is not None:
        await lith.revoke(user)


@app.post("/revoke/{user}")
async def revoke(user: str) -> dict[str, int]:
    return {"ended": await lith.revoke(user)}


for path, command in (("/tasks", AddTask), ("/notes", AddNote), ("/members", Membership)):
    lith.command(app, path, command)
