from pathlib import Path

import htpy as h
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from pydantic import Field

from fastapi_lith import Db, Lith, Rejected, TabCommand, Tx, new_tab, send, tab_signals

# Set before the app starts: Lith looks for a provider when its lifespan begins.
provider = TracerProvider(resource=Resource.create({"service.name": "counter"}))
provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))  # an OTLPSpanExporter() in production
trace.set_tracer_provider(provider)

# The counter of the first page, with its migrations.
lith = Lith("counter.db", migrations=Path(__file__).parent.parent / "counter" / "migrations")
LIMIT = 10

counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)


class Add(TabCommand):
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        if tx.scalar(COUNT) + self.n > LIMIT:
            raise Rejected(f"The counter stops at {LIMIT}.")  # its span's status is an error
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")
        self.say(f"Added {self.n}.")


@lith.view("counter", topics={"counter"})
def counter_view(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar(COUNT)]


app = FastAPI()
app.include_router(lith.router)
lith.command(app, "/add", Add)
FastAPIInstrumentor.instrument_app(app)  # each request's server span: a command's spans are its children


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    tab = new_tab()
    return str(
        h.html[
            h.body(tab_signals(tab), data_init=lith.connect("counter", "outcome/{tab}", tab=tab))[
                lith.datastar(),
                await lith.render("counter"),
                h.button({"data-on:click": send("/add", n=1)})["Add one"],
                await lith.render("outcome/{tab}", tab=tab),
            ],
        ]
    )
