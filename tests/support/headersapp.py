"""SecurityHeaders in front of a live page, its stream and a route that sets a header of its
own; Datastar from another origin and one inline script of the app's. Served in process by
tests/web/test_headers.py."""

from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from fastapi_lith import Lith, SecurityHeaders

SCRIPT = "console.log(1)"
# A page that may be framed by its own site, with a policy and a referrer rule of its own.
OWN_HEADERS = {
    "content-security-policy": "frame-ancestors 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "SAMEORIGIN",
}

lith = Lith(os.environ["HEADERS_DB"], datastar_url="https://js.example.net/datastar.js")
app = FastAPI()
app.include_router(lith.router)
app.add_middleware(SecurityHeaders, datastar_url=lith.datastar_url, inline_scripts=[SCRIPT])


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    return f"<body>{lith.datastar()}<script>{SCRIPT}</script></body>"


@app.get("/embeddable")
async def embeddable() -> HTMLResponse:
    return HTMLResponse("<p>Frame me.</p>", headers={name.title(): value for name, value in OWN_HEADERS.items()})
