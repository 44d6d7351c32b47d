"""An app's own wording for validation errors."""

from pathlib import Path

from fastapi import FastAPI
from pydantic import Field

from fastapi_lith import Command, Lith, Tx

# --8<-- [start:wording]
WORDING = {
    "greater_than_equal": "Pick a number from 1 to 100.",
    "less_than_equal": "Pick a number from 1 to 100.",
    "int_parsing": "Type a whole number.",
    "json_invalid": "The page sent something unreadable: reload it and try again.",
}

lith = Lith(
    "counter.db",
    migrations=Path(__file__).parent / "counter" / "migrations",
    messages=lambda error: WORDING.get(error["type"]),
)
# --8<-- [end:wording]
app = FastAPI()
app.include_router(lith.router)


class Add(Command):
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})


lith.command(app, "/add", Add)
