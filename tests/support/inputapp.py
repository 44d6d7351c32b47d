"""Hand-written command routes and an upload form: what a client can send them, and what the
page is told. Served by uvicorn in tests/web/test_input.py."""

from __future__ import annotations

import os
from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, File, Form, Query, UploadFile
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from fastapi_lith import (
    Command,
    Db,
    Lith,
    MaxBody,
    Rejected,
    TabCommand,
    Tx,
    Writer,
    form_fields,
    new_tab,
    pending,
    send_form,
    tab_signals,
)

lith = Lith(os.environ["INPUT_DB"], migrations=Path(__file__).parent / "input_migrations", max_body=4096)
UPLOAD_LIMIT = 64 * 1024  # this route's own limit, above the app's 4 KiB
AVATAR_LIMIT = 1024


class AddNote(TabCommand):
    text: str = Field(min_length=1, max_length=100_000)

    def apply(self, tx: Tx) -> int:
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
        tx.execute("INSERT INTO note (text) VALUES (:text)", {"text": self.text})
        self.say(f"Noted: {self.text}.")
        return len(self.text)


class Purge(Command):
    confirm: bool

    def apply(self, tx: Tx) -> None:
        if not self.confirm:
            raise Rejected("Say confirm to purge.")
        tx.execute("DELETE FROM note")


class SaveUpload(TabCommand):
    title: str = Field(min_length=1, max_length=20)
    name: str
    size: int

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO upload (title, name, size) VALUES (:title, :name, :size)",
                   {"title": self.title, "name": self.name, "size": self.size})
        tx.touch("uploads")
        self.say(f"Saved {self.title} ({self.size} bytes).")


app = FastAPI(lifespan=lith.lifespan)
lith.install(app)
lith.command(app, "/notes", AddNote)
lith.command(app, "/big-notes", AddNote, max_body=UPLOAD_LIMIT)


@app.post("/notes/by-hand")
async def add_note_by_hand(cmd: AddNote, writer: Writer = Depends(lith.writer)) -> int:
    """Lets `Rejected` propagate, as a hand-written route does."""
    return await writer.do(cmd)


@app.post("/purge/by-hand")
async def purge_by_hand(cmd: Purge, writer: Writer = Depends(lith.writer)) -> str:
    await writer.do(cmd)
    return "purged"


@app.post("/boards/{board}/notes", status_code=204)
async def add_note_to_a_board(
    cmd: AddNote, board: int, copies: int = Query(1, ge=1, le=3), writer: Writer = Depends(lith.writer)
) -> None:
    """A path and a query parameter beside the command: a refusal names them as the page does."""
    await writer.do(cmd)


class AddTags(TabCommand):
    tags: list[str] = Field(max_length=3)

    def apply(self, tx: Tx) -> None:
        self.say(f"Tagged {', '.join(self.tags)}.")


lith.command(app, "/tags", AddTags)


@app.post("/notes/form", status_code=204)
async def add_note_from_a_form(text: str = Form(), tab: str = Form(), op: int = Form(0),
                               writer: Writer = Depends(lith.writer)) -> None:
    """A form's fields, urlencoded or multipart, made into the command in the route."""
    await writer.do(AddNote(tab=tab, op=op, text=text))


@app.post("/upload", status_code=204, dependencies=[Depends(MaxBody(UPLOAD_LIMIT))])
async def upload(
    file: UploadFile = File(),
    title: str = Form(),
    tab: str = Form(),
    op: int = Form(0),
    writer: Writer = Depends(lith.writer),
) -> None:
    data = await file.read()  # slow work (a scan, a resize) belongs here, before the writer
    await writer.do(SaveUpload(tab=tab, op=op, title=title, name=file.filename or "", size=len(data)))


@app.post("/avatar", dependencies=[Depends(MaxBody(AVATAR_LIMIT))])
async def avatar(file: UploadFile = File()) -> dict[str, int]:
    """An upload kept out of the database (a file store's): no writer, its own limit all the same."""
    return {"size": len(await file.read())}


class Preview(BaseModel):
    tab: str
    op: int
    text: str = Field(max_length=20)


@app.post("/notes/preview", response_class=HTMLResponse)
async def preview(draft: Preview) -> str:
    """A page's own route, no writer and no guard: Datastar sends it the tab's signals all the same."""
    return f"<p id=\"preview\">{len(draft.text)} characters</p>"


@lith.view("uploads", topics={"uploads"})
def uploads_view(db: Db) -> h.Element:
    rows = db.all("SELECT title, size FROM upload ORDER BY id")
    return h.ul("#uploads")[(h.li[f"{row['title']}: {row['size']}"] for row in rows)]


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    tab = new_tab()
    return str(h.html[h.body(tab_signals(tab), data_init=lith.connect("uploads", "outcome/{tab}", tab=tab))[
        lith.datastar(),
        h.form({"data-on:submit": send_form("/upload")}, enctype="multipart/form-data")[
            form_fields(tab),
            h.input(name="title", aria_label="title"),
            h.input(type="file", name="file", aria_label="file"),
            h.button(pending())["Upload"],
        ],
        await lith.render("uploads"),
        await lith.render("outcome/{tab}", tab=tab),
    ]])
