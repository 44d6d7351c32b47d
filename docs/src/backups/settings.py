"""Backups on a timer, set on `Lith`."""

from pathlib import Path

from fastapi import FastAPI

from fastapi_lith import Lith

# --8<-- [start:settings]
lith = Lith(
    "app.db",
    migrations=Path(__file__).parent / "migrations",
    backup_folder="backups/",  # a copy every backup_every seconds, the newest backup_keep kept
    backup_every=3600,
    backup_keep=48,
)
# --8<-- [end:settings]
app = FastAPI()
app.include_router(lith.router)
