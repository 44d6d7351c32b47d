"""A shared kanban board that several people edit at once.

    KANBAN_DB=kanban.db uvicorn examples.kanban.app:app

Each change is a command posted by Datastar and applied by the one writer; every open tab
sees it within a tick. See `commands.py` for what can change, `views.py` for what is shown,
and `page.py` for the page around them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import Writer, WriterClosed
from fastapi_lith.writer import same_origin_reason

from . import schema as s
from .commands import (
    LEAVE_GRACE,
    AddCard,
    AddLane,
    CommandError,
    DeleteCard,
    DeleteLane,
    EditCard,
    Heartbeat,
    Leave,
    MoveCard,
    Rejected,
    RenameLane,
    Startup,
    Sweep,
    TabCommand,
)
from .live import lith
from .page import Visit, boards_page, not_found, page
from .views import first_paint

DEMO_CARDS = 12  # the board a first start shows, so `make run` has something on it
BEACON_MAX_BYTES = 1024


class Sweeps:
    """Timers that re-render a board's presence list when a departed viewer's grace ends.

    Nothing else would: a view re-renders when a commit touches its topic, not when time
    passes, and the next heartbeat may be ten seconds away.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def later(self, board_id: int, delay: float) -> None:
        task = asyncio.create_task(self._sweep(board_id, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(self, board_id: int, delay: float) -> None:
        await asyncio.sleep(delay)
        with suppress(WriterClosed):  # shutting down: the next process starts clean anyway
            await lith.writer.do(Sweep(board_id=board_id))

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


sweeps = Sweeps()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Lith's lifespan, plus a demo board on an empty database."""
    async with lith.lifespan(app):
        await lith.writer.do(Startup(demo_cards=DEMO_CARDS))
        try:
            yield
        finally:
            sweeps.cancel()


app = FastAPI(title="Kanban", lifespan=lifespan)
lith.install(app)  # the stream route, the body limit, errors as HTML for Datastar


async def run(cmd: TabCommand, writer: Writer) -> None:
    """Apply `cmd`; if the board changed under it, record why as the tab's outcome instead.

    A `CommandError` rolled the command back in its savepoint, its outcome row included, so
    the reason goes in by a second, tiny command. Success and failure then reach the tab the
    same way, through its outcome view, which also moves `done` to this op so the button that
    sent it stops pending. The route answers 204 either way: Datastar ignores the body of an
    error response, and the outcome is already on its way down the stream.
    """
    try:
        await writer.do(cmd)
    except CommandError as exc:
        await writer.do(Rejected(tab=cmd.tab, op=cmd.op, message=str(exc)))


# -- commands ----------------------------------------------------------------------------------


@app.post("/cards", status_code=204, include_in_schema=False)
async def add_card(cmd: AddCard, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/cards/edit", status_code=204, include_in_schema=False)
async def edit_card(cmd: EditCard, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/cards/move", status_code=204, include_in_schema=False)
async def move_card(cmd: MoveCard, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/cards/delete", status_code=204, include_in_schema=False)
async def delete_card(cmd: DeleteCard, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/lanes", status_code=204, include_in_schema=False)
async def add_lane(cmd: AddLane, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/lanes/rename", status_code=204, include_in_schema=False)
async def rename_lane(cmd: RenameLane, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


@app.post("/lanes/delete", status_code=204, include_in_schema=False)
async def delete_lane(cmd: DeleteLane, writer: Writer = Depends(lith.writer)) -> None:
    await run(cmd, writer)


# -- presence ----------------------------------------------------------------------------------


@app.post("/presence/heartbeat", status_code=204, include_in_schema=False)
async def heartbeat(cmd: Heartbeat, writer: Writer = Depends(lith.writer)) -> None:
    try:
        await writer.do(cmd)
    except CommandError as exc:
        raise HTTPException(404, str(exc)) from None


@app.post("/presence/leave", status_code=204, include_in_schema=False)
async def leave(request: Request) -> None:
    """`navigator.sendBeacon` from a page going away.

    A beacon cannot carry `Datastar-Request`, so `Depends(lith.writer)` would refuse it; this
    route checks the origin itself and takes a small form-encoded body.
    """
    reason = same_origin_reason(request)  # a beacon cannot send Datastar-Request
    if reason:
        raise HTTPException(403, reason)
    body = await request.body()
    if len(body) > BEACON_MAX_BYTES:
        raise HTTPException(413, f"a beacon carries at most {BEACON_MAX_BYTES} bytes")
    try:
        cmd = Leave.model_validate(dict(parse_qsl(body.decode("utf-8", "replace"))))
    except ValidationError as exc:
        raise HTTPException(422, "a leave beacon needs board_id and viewer") from exc
    await lith.writer.do(cmd)
    sweeps.later(cmd.board_id, LEAVE_GRACE + 0.2)


# -- pages -------------------------------------------------------------------------------------


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def home(conn: AsyncConnection = Depends(lith.db)) -> HTMLResponse:
    """Every board, so one added later (by `seed`, say) has a way in."""
    boards = (await conn.execute(s.BOARDS)).mappings().all()
    return HTMLResponse(boards_page(boards))


@app.get("/boards/{board_id}", response_class=HTMLResponse, include_in_schema=False)
async def board_page(board_id: int, conn: AsyncConnection = Depends(lith.db)) -> HTMLResponse:
    """The board for one tab: first paint from the views, then their live stream."""
    title = await conn.scalar(s.BOARD_TITLE, {"board_id": board_id})
    if title is None:
        return HTMLResponse(not_found(board_id), status_code=404)
    visit = Visit.new(board_id, title)
    return HTMLResponse(page(visit, await first_paint(board_id, visit.tab)))
