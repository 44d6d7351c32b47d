"""Backups on a timer, composed into a lifespan of the app's own."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from fastapi_lith import Lith

lith = Lith("app.db", migrations=Path(__file__).parent / "migrations")

# --8<-- [start:lifespan]
from fastapi_lith.ops import Backups

backups = Backups("app.db", "backups/", every=3600, keep=48)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with lith.lifespan(app), backups:   # the database exists before the first copy
        yield
# --8<-- [end:lifespan]


app = FastAPI(lifespan=lifespan)
app.include_router(lith.router)  # nested in the lifespan above, it starts nothing twice
