"""Accounts with members, served by uvicorn in tests/app/test_members.py.

alice is a member of acme, bob of globex. `MEMBERS_DIR` is the accounts' folder, `ADMITS` is
`sync` or `async` (which kind of `admits` the accounts take). `GET /pool` says what the pool
has opened, how often the identity ran, and whether `admits` ran on the event loop.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from fastapi_lith import Accounts, Command, Db, Tx

MEMBERS = {"alice": {"acme"}, "bob": {"globex"}}
seen: dict[str, list[bool] | int] = {"identity": 0, "admits_on_loop": []}


def signed_in(x_user: str | None = Header(None)) -> str:
    """The tests' stand-in for a session: the `X-User` header, 401 without it."""
    count = seen["identity"]
    assert isinstance(count, int)
    seen["identity"] = count + 1
    if not x_user:
        raise HTTPException(401, "Sign in first.")
    return x_user


def on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def member_sync(user: str, account: str) -> bool:
    ran = seen["admits_on_loop"]
    assert isinstance(ran, list)
    ran.append(on_loop())
    return account in MEMBERS.get(user, set())


async def member_async(user: str, account: str) -> bool:
    await asyncio.sleep(0)  # a real await: the check may wait on the app's own database
    return member_sync(user, account)


accounts = Accounts(
    os.environ["MEMBERS_DIR"],
    migrations=Path(__file__).parent / "commands_migrations",
    identity=signed_in,
    admits={"sync": member_sync, "async": member_async}[os.environ["ADMITS"]],
)


class Note(Command):
    text: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (:text)", {"text": self.text})
        tx.touch("notes")


@accounts.view("notes", topics={"notes"})
def notes(db: Db) -> Markup:
    return Markup('<ul id="notes">{}</ul>').format(
        Markup("").join(Markup("<li>{}</li>").format(row["text"]) for row in db.all("SELECT text FROM note"))
    )


accounts.command("/note", Note)


@accounts.router.get("/", response_class=HTMLResponse)
async def page(user: str = Depends(accounts.principal)) -> str:
    return f"<h1>{user} in {accounts.account().name}</h1>{await accounts.render('notes')}"


app = FastAPI()
app.include_router(accounts.router)


@app.get("/pool")
async def pool() -> dict[str, object]:
    return {"open": accounts.open_names(), "opened": accounts.opened, **seen}
