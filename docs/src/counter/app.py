from pathlib import Path

import htpy as h
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import Command, Db, Lith, Tx, new_tab

# The database is opened in the working directory; migrations are found beside this file.
lith = Lith("counter.db", migrations=Path(__file__).parent / "migrations")

# --8<-- [start:statements]
# Statements are built once, at import.
counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)
# --8<-- [end:statements]


# --8<-- [start:command]
class Add(Command):                       # a change, validated by Pydantic
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> int:       # runs on the writer, in its own savepoint
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")               # views on this topic render in the next tick
        return tx.scalar(COUNT)           # what `await writer.do(cmd)` returns
# --8<-- [end:command]


# --8<-- [start:view]
@lith.view("counter", topics={"counter"}) # a view: HTML from the database
def counter_view(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar(COUNT)]
# --8<-- [end:view]


app = FastAPI()
app.include_router(lith.router)           # the stream route, and the lifespan: migrates, starts
                                          # the writer, the readers, the hub, and guards every
                                          # route taking the writer (body limit, HTML errors)


# --8<-- [start:route]
lith.command(app, "/add", Add)            # POST /add: validated, applied by the writer, 204
# --8<-- [end:route]


# --8<-- [start:page]
@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = new_tab()                       # one id per tab
    return str(
        h.html[
            h.body(data_signals="{n: 1}", data_init=lith.connect("counter", tab=tab))[
                lith.datastar(),          # the script, and a notice if it cannot load
                await lith.render("counter"),                  # first paint, from the same view
                h.button({"data-on:click": "@post('/add')"})["Add one"],
            ],
        ]
    )
# --8<-- [end:page]
