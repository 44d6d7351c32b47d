"""Continuous replication with Litestream, set on `Lith`; the replica's health on a route."""

import os
from pathlib import Path

from fastapi import FastAPI

from fastapi_lith import Lith

# --8<-- [start:settings]
lith = Lith(
    "app.db",
    migrations=Path(__file__).parent / "migrations",
    replica=os.environ["APP_REPLICA"],  # s3://my-bucket/myapp, file:///mnt/replica/myapp, gs://...
    replica_sync_interval=1.0,  # the most a dead disk loses, in seconds (the default)
)
# --8<-- [end:settings]
app = FastAPI()
app.include_router(lith.router)


# --8<-- [start:health]
@app.get("/health")
async def health() -> dict[str, object]:
    return {"ok": True, "replica": lith.replica.health() if lith.replica else None}
# --8<-- [end:health]
