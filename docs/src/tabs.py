"""A tab command: the page's `tab` and `op` come from the library, and so does the outcome view."""

from pathlib import Path

import htpy as h
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from fastapi_lith import Lith, Rejected, TabCommand, Tx, new_tab, pending, send, tab_signals

lith = Lith(
    "counter.db",
    migrations=Path(__file__).parent / "counter" / "migrations",
    outcome_hint="Nothing added from this tab yet.",   # the outcome view before the first click
)
app = FastAPI()
app.include_router(lith.router)


# --8<-- [start:command]
class Add(TabCommand):                    # brings `tab` and `op`: declare only your own fields
    n: int = 1

    def apply(self, tx: Tx) -> int:
        total = tx.scalar("SELECT count FROM counter WHERE id = 1") + self.n
        if total > 100:                   # rolls this command back; its tab is told why
            raise Rejected(f"The counter stops at 100: adding {self.n} would make {total}.")
        tx.execute("UPDATE counter SET count = ? WHERE id = 1", (total,))
        tx.touch("counter")
        self.say(f"You added {self.n}: {total}.")   # what this tab's outcome view shows
        return total
# --8<-- [end:command]


# --8<-- [start:route]
lith.command(app, "/add", Add)            # POST /add: validated, applied, answered 204
# --8<-- [end:route]


# --8<-- [start:page]
@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = new_tab()                       # one id per tab: its stream, its outcome view
    return str(h.html[h.body(tab_signals(tab, n=1), data_init=lith.connect("outcome/{tab}", tab=tab))[
        lith.datastar(),                  # the script, and a notice if it cannot load
        h.button({"data-on:click": send("/add")}, pending())["Add"],   # pending until its op lands
        await lith.render("outcome/{tab}", tab=tab),
    ]])
# --8<-- [end:page]
