"""One command on two routes: `/direct`, which the library serves without FastAPI's dependency
solving, and `/solved`, the same route with a dependency of its own, which FastAPI serves.
tests/web/test_direct.py sends both the same requests and compares the answers.

Each validation error's message is the whole error as pydantic and FastAPI made it, so a field
of it that differs shows in the HTML. `DIRECT_FASTAPI` is FastAPI's own settings, as JSON
(`{"strict_content_type": false}`, `{"max_body_size": 1000}`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import Field

from fastapi_lith import Lith, Rejected, TabCommand, Tx


def whole(error: Mapping[str, Any]) -> str:
    return json.dumps(dict(error), default=repr, sort_keys=True)


lith = Lith(
    os.environ["DIRECT_DB"], migrations=Path(__file__).parent / "direct_migrations", max_body=4096, messages=whole
)


class Note(TabCommand):
    text: str = Field(min_length=1, max_length=50)
    count: int = Field(1, ge=1, le=9)

    def apply(self, tx: Tx) -> int:
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
        route = "direct" if isinstance(self, ToDirect) else "solved"
        for _ in range(self.count):
            tx.execute("INSERT INTO note (route, text) VALUES (:route, :text)", {"route": route, "text": self.text})
        self.say(f"Noted: {self.text}.")
        return self.count


# Two classes, so that a page's tab and op key each route's commands apart.
class ToDirect(Note):
    pass


class ToSolved(Note):
    pass


async def nothing() -> None:
    """A dependency of the route's own: FastAPI solves it, and the route is not served directly."""


app = FastAPI(**json.loads(os.environ.get("DIRECT_FASTAPI") or "{}"))
app.include_router(lith.router)
lith.command(app, "/direct", ToDirect)
lith.command(app, "/solved", ToSolved, dependencies=[Depends(nothing)])


@app.get("/")
async def home() -> dict[str, Any]:
    return {}
