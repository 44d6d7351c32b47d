"""A page that loads Datastar from the app itself, not from the CDN: it works offline."""

from pathlib import Path

import htpy as h
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from fastapi_lith import Lith

STATIC = Path(__file__).parent / "static"  # holds datastar.js (datastar_from_pypi.sh, or curl from the CDN)

lith = Lith("app.db", datastar_url="/static/datastar.js")
app = FastAPI()
app.include_router(lith.router)
app.mount("/static", StaticFiles(directory=STATIC), name="static")


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> str:
    return str(
        h.html[
            h.head[h.script(type="module", src=lith.datastar_url)],
            h.body(data_signals="{clicks: 0}")[
                h.button({"data-on:click": "$clicks++"})["Click"],
                h.output({"data-text": "$clicks"})["0"],
            ],
        ]
    )
