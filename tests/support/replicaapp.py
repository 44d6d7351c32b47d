"""A sequence app with a replica, served for the replication tests.

Settings come from the environment so each test starts the server it needs:
APP_DB, APP_REPLICA (a Litestream URL), APP_SYNC (seconds), APP_CHECK_EVERY (seconds).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fastapi import Depends, FastAPI

from fastapi_lith import Command, Lith, Tx, Writer

folder = Path(tempfile.mkdtemp(prefix="lith-replicaapp-"))
(folder / "0001_seq.sql").write_text(
    "CREATE TABLE seq (n INTEGER PRIMARY KEY, payload BLOB NOT NULL);\n"
    "CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
)
lith = Lith(
    os.environ["APP_DB"],
    migrations=folder,
    same_origin_only=False,
    replica=os.environ["APP_REPLICA"],
    replica_sync_interval=float(os.environ.get("APP_SYNC", "1")),
    replica_check_every=float(os.environ.get("APP_CHECK_EVERY", "86400")),
)
app = FastAPI(lifespan=lith.lifespan)
lith.install(app)
app.include_router(lith.metrics_router, dependencies=[Depends(lith.unguarded)])  # a test app on 127.0.0.1


class Append(Command):
    """The next number of the sequence: gap-free because the writer applies commands in order."""

    size: int = 100

    def apply(self, tx: Tx) -> int:
        n = tx.scalar("SELECT coalesce(max(n), 0) + 1 FROM seq")
        tx.execute("INSERT INTO seq (n, payload) VALUES (?, randomblob(?))", (n, self.size))
        return n


@app.post("/append")
async def append(cmd: Append, writer: Writer = Depends(lith.writer)) -> int:
    return await writer.do(cmd)


@app.get("/health")
async def health() -> dict[str, object]:
    assert lith.replica is not None
    return {"ok": True, "replica": lith.replica.health(), "litestream_pid": lith.replica.pid}
