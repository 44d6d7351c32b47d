"""The counter with its metrics, for Prometheus only: it sends the token the app was given."""

import os
import secrets
from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fastapi_lith import Db, Lith, TabCommand, Tx

lith = Lith(os.environ.get("APP_DB", "app.db"), migrations=Path(__file__).parent / "counter" / "migrations")


class Add(TabCommand):
    n: int = 1

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})
        tx.touch("counter")


@lith.view("counter", topics={"counter"})
def counter_view(db: Db) -> h.Element:
    return h.p("#counter")[db.scalar("SELECT count FROM counter WHERE id = 1")]


# --8<-- [start:route]
bearer = HTTPBearer(auto_error=False)


def operator(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """Prometheus sends `Authorization: Bearer <METRICS_TOKEN>`; anyone else gets 403."""
    token = os.environ["METRICS_TOKEN"]
    if credentials is None or not secrets.compare_digest(credentials.credentials, token):
        raise HTTPException(403, "metrics are for the operator")


app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
lith.install(app)
app.include_router(lith.metrics_router, dependencies=[Depends(operator)])  # GET /lith/metrics
# --8<-- [end:route]
lith.command(app, "/add", Add)


# --8<-- [start:read]
@app.get("/busy", dependencies=[Depends(operator)])
async def busy() -> dict[str, float | None]:
    """What the app reads of its own metrics: brought up to date, then one value each."""
    lith.metrics.sample()
    return {
        "queued": lith.metrics.value("lith_writer_queue_depth"),
        "committed": lith.metrics.value("lith_writer_commands_total", result="committed"),
        "streams": lith.metrics.value("lith_streams_open", state="awake", encoding="zstd"),
    }
# --8<-- [end:read]
