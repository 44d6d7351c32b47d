"""The counter with its dashboard, for the dashboard tests: `GET /lith/dashboard` for an operator.

An operator sends `X-Operator: yes` (the app's own guard; anyone else gets 403); the same guard
keeps the metrics scrape, which the tests read the renders from. DASHBOARD_DB names the file.
"""

from __future__ import annotations

import os

from fastapi import Depends, FastAPI, Header, HTTPException

from examples.counter.app import HERE, Add, counter_view
from fastapi_lith import Lith

lith = Lith(os.environ["DASHBOARD_DB"], migrations=HERE / "migrations", same_origin_only=False)
lith.view("counter", topics={"counter"})(counter_view)


def operator(x_operator: str | None = Header(None)) -> None:
    if x_operator != "yes":
        raise HTTPException(403, "operators only")


app = FastAPI()
app.include_router(lith.router)
app.include_router(lith.dashboard_router, dependencies=[Depends(operator)])
app.include_router(lith.metrics_router, dependencies=[Depends(operator)])
lith.command(app, "/add", Add)
