"""Command routes made by `lith.command`: a tab command, a plain one, and one behind the app's
own dependency, and a page that sends them. Served by uvicorn in tests/engine/test_commands.py."""

from __future__ import annotations

import os
from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import Command, Db, Lith, Rejected, TabCommand, Tx, new_tab, pending, send, tab_signals

lith = Lith(os.environ["COMMANDS_DB"], migrations=Path(__file__).parent / "commands_migrations")


class AddNote(TabCommand):
    text: str = Field(max_length=40)

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
        self.say(f"Noted: {self.text}.")


class AddQuietly(TabCommand):
    """Says nothing: its tab's outcome shows no message, not the last command's."""

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES ('quiet')")


class Purge(Command):
    confirm: bool

    def apply(self, tx: Tx) -> None:
        tx.execute("DELETE FROM note")
        if not self.confirm:
            raise Rejected("Say confirm to purge.")


def admin(x_admin: str | None = Header(None)) -> None:
    if x_admin != "yes":
        raise HTTPException(401, "admins only")


@lith.view("note/{note_id}", topics={"notes"})
def note(db: Db, note_id: int) -> h.Element:
    row = db.first("SELECT text FROM note WHERE id = :id", {"id": note_id})
    return h.p(id=f"note-{note_id}")[row["text"] if row else "No such note."]


app = FastAPI(lifespan=lith.lifespan)
lith.install(app)
lith.command(app, "/notes", AddNote)
lith.command(app, "/notes/quiet", AddQuietly)
lith.command(app, "/purge", Purge, dependencies=[Depends(admin)])


@app.get("/notes/{note_id}", response_class=HTMLResponse)
async def note_page(note_id: int) -> str:
    """A page whose path parameter reaches the view unbounded: the render checks its range."""
    return f"<main>{await lith.render(f'note/{note_id}')}</main>"


@app.get("/notes-by-param/{note_id}", response_class=HTMLResponse)
async def note_page_by_param(note_id: int) -> str:
    return f"<main>{await lith.render('note/{note_id}', note_id=note_id)}</main>"


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    tab = new_tab()
    return str(h.html[h.body(tab_signals(tab, text=""), data_init=lith.connect("outcome/{tab}", tab=tab))[
        lith.datastar(),
        h.input(aria_label="Note", data_bind="text"),
        h.button({"data-on:click": send("/notes", text="$text")}, pending())["Add"],
        h.button({"data-on:click": send("/notes/quiet")}, pending())["Add quietly"],
        await lith.render("outcome/{tab}", tab=tab),
    ]])


class Deferred(TabCommand):
    """A sync `apply` that hands back a coroutine (a helper it forgot to await): refused."""

    text: str

    def apply(self, tx: Tx) -> object:
        return self.insert(tx)

    async def insert(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))


lith.command(app, "/deferred", Deferred)
