"""The counter with its metrics, for the metrics tests: `GET /lith/metrics` for an operator only.

An operator sends `X-Operator: yes` (the app's own guard; anyone else gets 403). Each response
names the process that served it (`X-Pid`), so a test with `--workers 2` knows where its
streams live. METRICS_DB names the file; METRICS_HIBERNATE_AFTER (seconds) how soon an idle
stream frees its compressor.
"""

from __future__ import annotations

import os

from fastapi import Depends, FastAPI, Header, HTTPException

from examples.counter.app import HERE, Add, counter_view
from fastapi_lith import Lith
from tests.support.workersapp import NamesProcess

lith = Lith(
    os.environ["METRICS_DB"], migrations=HERE / "migrations", same_origin_only=False,
    hibernate_after=float(os.environ.get("METRICS_HIBERNATE_AFTER", 30)),
)
lith.view("counter", topics={"counter"})(counter_view)


def operator(x_operator: str | None = Header(None)) -> None:
    if x_operator != "yes":
        raise HTTPException(403, "operators only")


served = FastAPI()
served.include_router(lith.router)
served.include_router(lith.metrics_router, dependencies=[Depends(operator)])
lith.command(served, "/add", Add)
app = NamesProcess(served)
