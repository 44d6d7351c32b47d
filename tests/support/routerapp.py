"""An app written as the design card says, `app.include_router(lith.router)` and routes taking
`Depends(lith.writer)`, in the way `ROUTER_APP_WAY` names: `router` (that line alone),
`lifespan` (`FastAPI(lifespan=lith.lifespan)` too) or `install` (`lith.install(app)`). Command
routes sit on the app and on two APIRouters, one included before its routes are declared and
one after. Served by uvicorn in tests/test_app.py.
"""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from pydantic import Field

from fastapi_lith import Command, Db, Lith, Rejected, TabCommand, Tx, Writer
from fastapi_lith.engine.hub import Hub

STARTS = 0


def counting_hub(*args: object, **kwargs: object) -> Hub:
    """The engine's hub, counted: one start of the engine builds one."""
    global STARTS
    STARTS += 1
    return Hub(*args, **kwargs)  # type: ignore[arg-type]


lith = Lith(
    os.environ["ROUTER_APP_DB"], migrations=os.environ["ROUTER_APP_MIGRATIONS"], hub=counting_hub,
    same_origin_only=False, max_body=1024,
)
WAY = os.environ["ROUTER_APP_WAY"]


@lith.view("counter", topics={"counter"})
def counter(db: Db) -> Markup:
    return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter"))


class Add(TabCommand):
    n: int = Field(1, ge=1, le=100)
    padding: str = ""

    def apply(self, tx: Tx) -> None:
        if self.n == 13:
            raise Rejected("13 is unlucky")
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})
        tx.touch("counter")
        self.say(f"added {self.n}")


class Plain(Command):
    """Not a tab's command: its `Rejected` is a 409."""

    n: int

    def apply(self, tx: Tx) -> None:
        raise Rejected(f"no {self.n}")


app = FastAPI(lifespan=lith.lifespan) if WAY == "lifespan" else FastAPI()
if WAY == "install":
    lith.install(app)
else:
    app.include_router(lith.router)

early = APIRouter(prefix="/early")
app.include_router(early)  # included before its routes are declared


@app.post("/add", status_code=204)
async def add(cmd: Add, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@app.post("/plain", status_code=204)
async def plain(cmd: Plain, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


@early.post("/add", status_code=204)
async def early_add(cmd: Add, writer: Writer = Depends(lith.writer)) -> None:
    await writer.do(cmd)


late = APIRouter(prefix="/late")
lith.command(late, "/add", Add)
app.include_router(late)  # included after


@app.get("/boards/{board_id}")
async def board(board_id: int) -> HTMLResponse:  # unbounded on purpose: lith.render checks it
    return HTMLResponse(await lith.render("board/{board_id}", board_id=board_id))


@lith.view("board/{board_id}")
def board_view(db: Db, board_id: int) -> Markup:
    return Markup('<p id="board">{}</p>').format(board_id)


@app.get("/starts")
async def starts() -> int:
    return STARTS
