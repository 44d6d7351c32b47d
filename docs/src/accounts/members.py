"""Accounts with members: a team's account is open to its members only.

    SESSION_SECRET=... uvicorn members:app --app-dir docs/src/accounts

Who is signed in comes from a signed session cookie (the app's own sign-in puts the user's id
in it); who is a member of which account lives in the app's own directory database.
"""

import os
import secrets
from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.middleware.sessions import SessionMiddleware

from fastapi_lith import Accounts, Command, Db, Lith, TabCommand, Tx, Writer, new_tab, send, tab_signals

HERE = Path(__file__).parent


# --8<-- [start:identity]
def signed_in(request: Request) -> str:
    """The app's identity: the user its sign-in put in the signed session cookie."""
    user = request.session.get("user")
    if not isinstance(user, str):
        raise HTTPException(401, "Sign in first.")
    return user
# --8<-- [end:identity]


# --8<-- [start:admits]
# Memberships live outside the accounts' files, in a database of the app's own, so that they
# can be read before an account's file is opened.
directory = Lith("directory.db", migrations=HERE / "directory")
IS_MEMBER = text("SELECT 1 FROM member WHERE account = :account AND user = :user")


# scope="function": the connection goes back once the check is done, not when the response
# ends, which for a stream is when the tab closes.
async def is_member(user: str, account: str, db: AsyncConnection = Depends(directory.db, scope="function")) -> bool:
    """The principal and the account's name come first; FastAPI fills in any other parameter."""
    return (await db.execute(IS_MEMBER, {"account": account, "user": user})).first() is not None


accounts = Accounts(
    "accounts",
    migrations=HERE / "migrations",
    identity=signed_in,                   # who is asking: 401 before any account is looked at
    admits=is_member,                     # a non-member gets the 404 of an account that does not exist
)
# --8<-- [end:admits]


class Join(Command):
    account: str
    user: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT OR IGNORE INTO member (account, user) VALUES (:account, :user)", self.model_dump())


class Add(TabCommand):
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})
        tx.touch("counter")


@accounts.view("counter", topics={"counter"})
def counter(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar("SELECT count FROM counter")]


app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(SessionMiddleware, secret_key=os.environ["SESSION_SECRET"], same_site="lax")
app.include_router(directory.router)
app.include_router(accounts.router)
accounts.command("/add", Add)             # a member's command; anyone else's is a 404


# --8<-- [start:members]
@app.post("/accounts")
async def create(
    user: str = Depends(accounts.principal), writer: Writer = Depends(directory.writer)
) -> RedirectResponse:
    """A new account, its creator its first member. The server names it: a name the user chose
    would, when taken, tell them that an account of that name exists."""
    name = secrets.token_hex(8)
    await writer.do(Join(account=name, user=user))
    await accounts.create(name)
    return RedirectResponse(f"/a/{name}/", status_code=303)


class Invite(BaseModel):
    user: str = Field(min_length=1, max_length=100)


@accounts.router.post("/members", status_code=204)
async def invite(invite: Invite, writer: Writer = Depends(directory.writer)) -> None:
    """A member adds another: on accounts.router, only a member gets this far."""
    await writer.do(Join(account=accounts.account().name, user=invite.user))
# --8<-- [end:members]


@accounts.router.get("/", response_class=HTMLResponse)
async def board(user: str = Depends(accounts.principal)) -> str:
    tab = new_tab()
    return str(
        h.html[
            h.head[h.title["Team"], h.script(type="module", src=accounts.datastar_url)],
            h.body(tab_signals(tab), data_init=accounts.connect("counter", "outcome/{tab}", tab=tab))[
                h.h1[f"{user} in {accounts.account().name}"],
                await accounts.render("counter"),
                h.button({"data-on:click": send(accounts.url("/add"), n=1)})["Add one"],
                await accounts.render("outcome/{tab}", tab=tab),
            ],
        ]
    )
