"""Commands with fields the server sets: the owner is the session's principal, the team comes
from the app's own dependency, through `lith.command`, a hand-written route and a form; and
in `accounts_app`, an account's command whose team is its account. Served by uvicorn in
tests/web/test_server_fields.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import AliasChoices, ConfigDict, Field, model_validator
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response

from fastapi_lith import Accounts, Command, FromServer, Lith, TabCommand, Tx, Writer

LOCKED = {"mallory"}
TEAMS = {"alice": "red", "bob": "blue"}


def signed_in(request: Request) -> str | None:
    """The principal: the user Starlette's signed session cookie names, or None."""
    request.state.identity_runs = getattr(request.state, "identity_runs", 0) + 1
    user = request.session.get("user")
    if user in LOCKED:
        raise HTTPException(401, "This account is locked.")
    return user


MIGRATIONS = Path(__file__).parent / "owners_migrations"
lith = Lith(os.environ["OWNERS_DB"], migrations=MIGRATIONS, identity=signed_in)


def team_of(principal: str | None = Depends(lith.principal)) -> str:
    """A server field from the app's own dependency, itself built on the principal."""
    return TEAMS.get(principal or "", "guests")


class AddTask(TabCommand):
    title: str = Field(min_length=1, max_length=40)
    tags: list[str] = Field(default_factory=list, max_length=5)
    owner: Annotated[str, FromServer()]
    team: Annotated[str, FromServer(team_of)]

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO task (title, owner, team, tags) VALUES (:title, :owner, :team, :tags)",
                   {"title": self.title, "owner": self.owner, "team": self.team, "tags": ",".join(self.tags)})
        self.say(f"Added {self.title} for {self.owner}.")


class AddAliasedTask(AddTask):
    """AddTask's fields under aliases a client sends: the server's owner goes in under its alias
    too, and a form's `label` list (optional) is read as a list whatever its validation alias is."""

    title: str = Field(min_length=1, max_length=40, alias="name")
    tags: list[str] | None = Field(default_factory=list, alias="label", validation_alias=AliasChoices("label", "labels"))
    owner: Annotated[str, FromServer(), Field(validation_alias="by", serialization_alias="owner_id")]


class AddNamedTask(AddAliasedTask):
    """The same fields validated by their names, not their aliases."""

    model_config = ConfigDict(validate_by_alias=False, validate_by_name=True)


class Review(TabCommand):
    """A rule across fields, one of them the server's: its error belongs to no one field."""

    author: str
    reviewer: Annotated[str, FromServer()]

    @model_validator(mode="after")
    def not_ones_own(self) -> Review:
        if self.author == self.reviewer:
            raise ValueError("You cannot review your own task.")
        return self

    def apply(self, tx: Tx) -> None:
        self.say(f"{self.reviewer} reviewed {self.author}'s task.")


def broken_clock() -> str:
    return "soon"


def no_clock() -> None:
    return None


class Stamp(Command):
    """A server field whose dependency gives what the field refuses: the app's bug, even when
    a field of the client's is wrong too."""

    label: str = Field("", max_length=5)
    at: Annotated[int, FromServer(broken_clock)]

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO stamp (at) VALUES (:at)", {"at": self.at})


class UnsetStamp(Stamp):
    """A dependency that gives None: still the app's bug, not a sign-in to ask for."""

    at: Annotated[int, FromServer(no_clock)]


app = FastAPI()
app.add_middleware(SessionMiddleware, secret_key="a test key, long enough to sign")
app.include_router(lith.router)
lith.command(app, "/tasks", AddTask)
lith.command(app, "/stamps", Stamp)
lith.command(app, "/stamps/unset", UnsetStamp)
lith.command(app, "/reviews", Review)
lith.command(app, "/tasks/aliased", AddAliasedTask)
lith.command(app, "/tasks/named", AddNamedTask)


@app.post("/tasks/by-hand")
async def add_by_hand(
    request: Request, cmd: Annotated[AddTask, Depends(lith.body(AddTask))], writer: Writer = Depends(lith.writer)
) -> dict[str, Any]:
    await writer.do(cmd)
    return {"owner": cmd.owner, "team": cmd.team, "identity_runs": request.state.identity_runs}


@app.post("/sign-in/{user}", status_code=204)
async def sign_in(user: str, request: Request) -> Response:
    request.session["user"] = user
    return Response(status_code=204)


# -- one database per account ---------------------------------------------------------------------

accounts = Accounts(os.environ["OWNERS_ACCOUNTS"], migrations=MIGRATIONS, identity=signed_in)


def account_name(account: str) -> str:
    """The `{account}` of the route's path."""
    return account


class AddTeamTask(TabCommand):
    title: str = Field(min_length=1, max_length=40)
    owner: Annotated[str, FromServer()]
    team: Annotated[str, FromServer(account_name)]

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO task (title, owner, team, tags) VALUES (:title, :owner, :team, '')",
                   {"title": self.title, "owner": self.owner, "team": self.team})


accounts_app = FastAPI()
accounts_app.add_middleware(SessionMiddleware, secret_key="a test key, long enough to sign")
accounts_app.include_router(accounts.router)
accounts.command("/tasks", AddTeamTask)
accounts_app.post("/sign-in/{user}", status_code=204)(sign_in)


@accounts_app.post("/accounts/{name}", status_code=204)
async def create_account(name: str) -> None:
    await accounts.create(name)
