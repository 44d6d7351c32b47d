"""A host app with its own middleware, its own validation handler, pages for 400 and 404 and an
HTTP error of its own, and a command route in a prefixed router behind a nested dependency:
what `lith.install(app)` must leave alone, and what it must still guard. Served by uvicorn in
tests/app/test_lith.py.
"""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from fastapi_lith import Command, Lith, Tx, Writer

BUILDS = 0


class CountBuilds:
    """The app's own middleware: counts how often Starlette builds it."""

    def __init__(self, app: ASGIApp) -> None:
        global BUILDS
        BUILDS += 1
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


lith = Lith(os.environ["HOST_DB"], migrations=os.environ["HOST_MIGRATIONS"], same_origin_only=False, max_body=1024)
app = FastAPI(lifespan=lith.lifespan)
app.add_middleware(CountBuilds)


@app.exception_handler(RequestValidationError)
async def own_validation_handler(request: Request, exc: RequestValidationError) -> PlainTextResponse:
    return PlainTextResponse("the app's own 422", status_code=422)


class Maintenance(HTTPException):
    """An HTTP error of the app's own, with its own handler (over the one for every HTTPException)."""

    def __init__(self) -> None:
        super().__init__(503)


@app.exception_handler(400)
@app.exception_handler(404)
async def own_error_page(request: Request, exc: HTTPException) -> PlainTextResponse:
    return PlainTextResponse(f"the app's own {exc.status_code}", status_code=exc.status_code)


@app.exception_handler(Maintenance)
async def maintenance_handler(request: Request, exc: Maintenance) -> PlainTextResponse:
    return PlainTextResponse("down for maintenance", status_code=503)


lith.install(app)


class Note(Command):
    text: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))


def checked_writer(writer: Writer = Depends(lith.writer)) -> Writer:
    return writer


router = APIRouter(prefix="/api")


@router.post("/notes", status_code=204)
async def add_note(note: Note, writer: Writer = Depends(checked_writer)) -> None:
    if note.text == "maintenance":
        raise Maintenance()
    if note.text == "missing":
        raise HTTPException(404, "No such note.")
    await writer.do(note)


app.include_router(router)


class Text(BaseModel):
    text: str


@app.post("/echo")
async def echo(body: Text) -> int:
    """Not a command route: no body limit, the app's own errors."""
    return len(body.text)


@app.get("/builds")
async def builds() -> int:
    return BUILDS
