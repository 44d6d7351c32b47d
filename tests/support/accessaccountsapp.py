"""Accounts with an identity and a secret, served for the access tests: the user is `X-User`.

ACCESS_ACCOUNTS names the folder of the account files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import htpy as h
from fastapi import Depends, FastAPI, Header
from fastapi.responses import PlainTextResponse

from fastapi_lith import Accounts, Command, Db, Tx, Writer

migrations = Path(tempfile.mkdtemp(prefix="lith-accessaccounts-"))
(migrations / "0001_tasks.sql").write_text(
    "CREATE TABLE tasks (owner TEXT NOT NULL, title TEXT NOT NULL); CREATE TABLE members (user TEXT PRIMARY KEY);"
)


async def current_user(x_user: str | None = Header(None)) -> str | None:
    return x_user


accounts = Accounts(
    os.environ["ACCESS_ACCOUNTS"], migrations=migrations, same_origin_only=False,
    identity=current_user, secret="a secret for the accounts test",
)


@accounts.view("tasks/{principal}", topics={"tasks:{principal}"})
def tasks(db: Db, principal: str) -> h.Element:
    return h.ul(id="tasks")[(h.li[r["title"]] for r in db.all("SELECT title FROM tasks WHERE owner = ?", (principal,)))]


def is_member(db: Db, principal: str | None) -> bool:
    return db.scalar("SELECT 1 FROM members WHERE user = ?", (principal,)) is not None


@accounts.view("board", topics={"board"}, access=is_member)
def board(db: Db) -> h.Element:
    return h.ul(id="board")[(h.li[r["user"]] for r in db.all("SELECT user FROM members ORDER BY user"))]


class Join(Command):
    user: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT OR IGNORE INTO members VALUES (?)", (self.user,))
        tx.touch("board")


@accounts.router.get("/connect", response_class=PlainTextResponse)
async def connect(tab: str, keys: str = "tasks/{principal}", principal: Any = Depends(accounts.principal)) -> str:
    return accounts.connect(keys, tab=tab).split("'")[1]


@accounts.router.post("/members", status_code=204)
async def join(cmd: Join, writer: Writer = Depends(accounts.writer)) -> None:
    await writer.do(cmd)


app = FastAPI()
app.include_router(accounts.router)


@app.post("/accounts/{name}", status_code=204)
async def create(name: str) -> None:
    await accounts.create(name)


@app.post("/revoke/{user}")
async def revoke(user: str) -> dict[str, int]:
    return {"ended": await accounts.revoke(user)}
