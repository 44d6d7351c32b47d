"""The account from the host name, `acme.example.com`, instead of the path."""

from pathlib import Path

import htpy as h
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse

from fastapi_lith import Accounts, Db


# --8<-- [start:host]
def account_from_host(request: Request) -> str:
    """A FastAPI dependency: `acme.example.com` is account `acme`."""
    host = request.headers.get("host", "").split(":")[0]
    name, dot, _ = host.partition(".")
    if not dot:
        raise HTTPException(404, "no account in this host name")
    return name


accounts = Accounts(
    "accounts",
    migrations=Path(__file__).parent / "migrations",
    account=account_from_host,            # instead of the {account} path parameter
    prefix="",                            # so routes keep their own paths: GET / is the board
)
# --8<-- [end:host]


@accounts.view("counter", topics={"counter"})
def counter(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar("SELECT count FROM counter")]


app = FastAPI()
app.include_router(accounts.router)


@accounts.router.get("/", response_class=HTMLResponse)
async def board() -> str:
    return f"<h1>{accounts.account().name}</h1>{await accounts.render('counter')}"
