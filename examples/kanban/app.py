"""A shared kanban board that several people edit at once.

    KANBAN_DB=kanban.db uvicorn examples.kanban.app:app

Each change is a command posted by Datastar and applied by the one writer; every open tab
sees it within a tick. See `commands.py` for what can change, `views.py` for what is shown,
and `page.py` for the page around them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, HTTPException, Path, Request
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import SecurityHeaders

from . import schema as s
from .commands import (
    LEAVE_GRACE,
    AddCard,
    AddLane,
    DeleteCard,
    DeleteLane,
    EditCard,
    Heartbeat,
    Leave,
    MoveCard,
    RenameLane,
    Startup,
)
from .live import lith
from .page import DATASTAR_FAILED, SCRIPT, Visit, boards_page, not_found, page
from .views import first_paint

# A board id from the URL, bounded like the table's ids: 2**63 would overflow SQLite's integers
# in the app's own query (a 500); out of range is FastAPI's 422 instead.
BoardId = Annotated[int, Path(ge=1, le=2**63 - 1)]
DEMO_CARDS = 12  # the board a first start shows, so `make run` has something on it
BEACON_MAX_BYTES = 1024


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Lith's lifespan, plus a demo board on an empty database."""
    async with lith.lifespan(app):
        await lith.writer.do(Startup(demo_cards=DEMO_CARDS))
        yield


app = FastAPI(title="Kanban", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)  # no API docs in production
# CSP, nosniff, no framing; the board's own inline script and Datastar's onerror by their hashes
app.add_middleware(SecurityHeaders, datastar_url=lith.datastar_url, inline_scripts=(SCRIPT, DATASTAR_FAILED))
lith.install(app)  # the stream route, the body limit, errors as HTML for Datastar

# -- the operator's pages: the live dashboard and the Prometheus scrape -----------------------

# Unset, nobody may open them; `make run` sets one for the developer.
OPERATOR_PASSWORD = os.environ.get("KANBAN_OPERATOR_PASSWORD", "")
basic = HTTPBasic(auto_error=False)


def operator(credentials: HTTPBasicCredentials | None = Depends(basic)) -> None:
    """Who may see the app's internals: the user `operator` with the password the deploy set."""
    if credentials is None:  # the browser asks for the password, then sends it every time
        raise HTTPException(401, "sign in as the operator", headers={"WWW-Authenticate": "Basic"})
    right = credentials.username == "operator" and secrets.compare_digest(credentials.password, OPERATOR_PASSWORD)
    if not (OPERATOR_PASSWORD and right):
        raise HTTPException(403, "operators only")


app.include_router(lith.dashboard_router, dependencies=[Depends(operator)])  # GET /lith/dashboard
app.include_router(lith.metrics_router, dependencies=[Depends(operator)])  # GET /lith/metrics

# -- commands: each answers 204; its tab's outcome view says what happened, or why not --------

lith.command(app, "/cards", AddCard)
lith.command(app, "/cards/edit", EditCard)
lith.command(app, "/cards/move", MoveCard)
lith.command(app, "/cards/delete", DeleteCard)
lith.command(app, "/lanes", AddLane)
lith.command(app, "/lanes/rename", RenameLane)
lith.command(app, "/lanes/delete", DeleteLane)
lith.command(app, "/presence/heartbeat", Heartbeat)  # a board deleted meanwhile: 409, its reason


# -- presence ----------------------------------------------------------------------------------


@app.post("/presence/leave", status_code=204, include_in_schema=False, dependencies=[Depends(lith.same_origin)])
async def leave(request: Request) -> None:
    """`navigator.sendBeacon` from a page going away.

    A beacon cannot carry `Datastar-Request`, so `Depends(lith.writer)` would refuse it; this
    route checks only the origin and takes a small form-encoded body.
    """
    body = await request.body()
    if len(body) > BEACON_MAX_BYTES:
        raise HTTPException(413, f"a beacon carries at most {BEACON_MAX_BYTES} bytes")
    try:
        cmd = Leave.model_validate(dict(parse_qsl(body.decode("utf-8", "replace"))))
    except ValidationError as exc:
        raise HTTPException(422, "a leave beacon needs board_id and viewer") from exc
    await lith.writer.do(cmd)
    # The list drops the viewer when the grace ends, but only a touch makes it re-render.
    lith.touch_later(LEAVE_GRACE + 0.2, f"presence:{cmd.board_id}")


# -- pages -------------------------------------------------------------------------------------


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def home(conn: AsyncConnection = Depends(lith.db)) -> HTMLResponse:
    """Every board, so one added later (by `seed`, say) has a way in."""
    boards = (await conn.execute(s.BOARDS)).mappings().all()
    return HTMLResponse(boards_page(boards))


@app.get("/boards/{board_id}", response_class=HTMLResponse, include_in_schema=False)
async def board_page(board_id: BoardId, conn: AsyncConnection = Depends(lith.db)) -> HTMLResponse:
    """The board for one tab: first paint from the views, then their live stream."""
    title = await conn.scalar(s.BOARD_TITLE, {"board_id": board_id})
    if title is None:
        return HTMLResponse(not_found(board_id), status_code=404)
    visit = Visit.new(board_id, title)
    return HTMLResponse(page(visit, await first_paint(board_id, visit.tab)))
