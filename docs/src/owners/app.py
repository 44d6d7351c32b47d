"""Who sent a command: its owner is the signed-in user and its team the app's to say, never
what the page sends."""

import os
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Form, Request
from pydantic import Field
from starlette.middleware.sessions import SessionMiddleware

from fastapi_lith import FromServer, Lith, TabCommand, Tx, Writer


# --8<-- [start:identity]
def current_user(request: Request) -> str | None:
    """The principal: the user the signed session cookie names, or None."""
    return request.session.get("user")


lith = Lith("tasks.db", migrations=Path(__file__).parent / "migrations", identity=current_user)
app = FastAPI()
app.add_middleware(SessionMiddleware, secret_key=os.environ["SESSION_SECRET"])
app.include_router(lith.router)
# --8<-- [end:identity]

TEAMS = {"alice": "design", "bob": "sales"}


# --8<-- [start:command]
def team_of(user: str | None = Depends(lith.principal)) -> str:
    return TEAMS.get(user or "", "guests")


class AddTask(TabCommand):
    title: str = Field(min_length=1, max_length=80)
    owner: Annotated[str, FromServer()]         # the principal: lith.principal
    team: Annotated[str, FromServer(team_of)]   # any FastAPI dependency

    def apply(self, tx: Tx) -> int:
        cur = tx.execute("INSERT INTO task (title, owner, team) VALUES (:title, :owner, :team)",
                         {"title": self.title, "owner": self.owner, "team": self.team})
        tx.touch(f"tasks:{self.owner}")
        self.say(f"Added {self.title}.")
        return cur.lastrowid or 0


lith.command(app, "/tasks", AddTask)
# --8<-- [end:command]


# --8<-- [start:route]
@app.post("/tasks/new")
async def new_task(cmd: Annotated[AddTask, Depends(lith.body(AddTask))], writer: Writer = Depends(lith.writer)) -> int:
    return await writer.do(cmd)  # the new task's id
# --8<-- [end:route]


@app.post("/sign-in", status_code=204, dependencies=[Depends(lith.same_origin)])
async def sign_in(request: Request, user: str = Form()) -> None:
    """A stand-in for the app's real sign-in, which checks a password first."""
    request.session["user"] = user
