"""Command routes made by `lith.command`: a tab command, a plain one, and one behind the app's
own dependency. Served by uvicorn in tests/test_commands.py."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException

from fastapi_lith import Command, Lith, Rejected, TabCommand, Tx

lith = Lith(os.environ["COMMANDS_DB"], migrations=Path(__file__).parent / "commands_migrations")


class AddNote(TabCommand):
    text: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
        self.say(f"Noted: {self.text}.")


class Purge(Command):
    confirm: bool

    def apply(self, tx: Tx) -> None:
        tx.execute("DELETE FROM note")
        if not self.confirm:
            raise Rejected("Say confirm to purge.")


def admin(x_admin: str | None = Header(None)) -> None:
    if x_admin != "yes":
        raise HTTPException(401, "admins only")


app = FastAPI(lifespan=lith.lifespan)
lith.install(app)
lith.command(app, "/notes", AddNote)
lith.command(app, "/purge", Purge, dependencies=[Depends(admin)])


class Deferred(TabCommand):
    """A sync `apply` that hands back a coroutine (a helper it forgot to await): refused."""

    text: str

    def apply(self, tx: Tx) -> object:
        return self.insert(tx)

    async def insert(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))


lith.command(app, "/deferred", Deferred)
