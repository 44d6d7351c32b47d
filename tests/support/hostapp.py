"""A host app with its own middleware, its own handlers (validation, any HTTP error, a refusal, a model that does
not validate), pages for 400 and 404 and an HTTP error of its own, and a command route in a prefixed router behind a nested dependency:
what `lith.install(app)` must leave alone, and what it must still guard. Served by uvicorn in
tests/app/test_lith.py.
"""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from fastapi_lith import Command, Lith, Rejected, Tx, Writer

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
    return PlainTextResponse(f"the app's own 422 at {request.url.path}: {len(exc.errors())} error(s)", status_code=422)


class Maintenance(HTTPException):
    """An HTTP error of the app's own, with its own handler (over the one for every HTTPException)."""

    def __init__(self) -> None:
        super().__init__(503)


@app.exception_handler(400)
@app.exception_handler(404)
async def own_error_page(request: Request, exc: HTTPException) -> PlainTextResponse:
    return PlainTextResponse(f"the app's own {exc.status_code}", status_code=exc.status_code)


@app.exception_handler(HTTPException)
async def own_http_error(request: Request, exc: HTTPException) -> PlainTextResponse:
    return PlainTextResponse(f"the app's own {exc.status_code} at {request.url.path}: {exc.detail}", status_code=exc.status_code)


@app.exception_handler(Maintenance)
async def maintenance_handler(request: Request, exc: Maintenance) -> PlainTextResponse:
    return PlainTextResponse("down for maintenance", status_code=503)


@app.exception_handler(Rejected)
async def own_refusal(request: Request, exc: Rejected) -> PlainTextResponse:
    return PlainTextResponse(f"the app's own refusal at {request.url.path}: {exc}", status_code=409)


@app.exception_handler(ValidationError)
async def own_invalid_model(request: Request, exc: ValidationError) -> PlainTextResponse:
    return PlainTextResponse(f"the app's own invalid model at {request.url.path}: {exc.error_count()} error(s)", status_code=400)


lith.install(app)


class Note(Command):
    text: str

    def apply(self, tx: Tx) -> None:
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
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


@app.post("/nightly", status_code=204)
async def nightly(text: str) -> None:
    """Not a command route: a job's route that builds its command and applies it with the app's
    writer, outside any guard, so its errors are the app's to answer."""
    await lith.writer.do(Note.model_validate({"text": text or None}))


@app.get("/members")
async def members() -> None:
    """Not a command route: its refusal is the app's own to answer."""
    raise HTTPException(403, "Members only.")


class Text(BaseModel):
    text: str


@app.post("/echo")
async def echo(body: Text) -> int:
    """Not a command route: no body limit, the app's own errors."""
    return len(body.text)


@app.get("/builds")
async def builds() -> int:
    return BUILDS
