"""A click counter and its dashboard, which only the app's operator may open.

Run it with a password of your own in OPERATOR_PASSWORD, then open /lith/dashboard and sign
in as `operator`: `OPERATOR_PASSWORD=... uvicorn app:app`.
"""

import os
import secrets
from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from pydantic import Field

from fastapi_lith import Db, Lith, TabCommand, Tx

lith = Lith(os.environ.get("DASHBOARD_DB", "clicks.db"), migrations=Path(__file__).parent / "migrations")


class Click(TabCommand):
    n: int = Field(1, ge=1, le=100)

    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE clicks SET total = total + :n", {"n": self.n})
        tx.touch("clicks")


@lith.view("clicks", topics={"clicks"})
def clicks(db: Db) -> h.Element:
    return h.p("#clicks")[db.scalar("SELECT total FROM clicks")]


# --8<-- [start:guard]
PASSWORD = os.environ["OPERATOR_PASSWORD"]
basic = HTTPBasic(auto_error=False)


def operator(credentials: HTTPBasicCredentials | None = Depends(basic)) -> None:
    """The app's own rule for who may see its internals: here, one password."""
    if credentials is None:  # the browser asks for the password, then sends it every time
        raise HTTPException(401, "sign in as the operator", headers={"WWW-Authenticate": "Basic"})
    if not (credentials.username == "operator" and secrets.compare_digest(credentials.password, PASSWORD)):
        raise HTTPException(403, "operators only")


app = FastAPI()
app.include_router(lith.router)
app.include_router(lith.dashboard_router, dependencies=[Depends(operator)])
app.include_router(lith.metrics_router, dependencies=[Depends(operator)])
# --8<-- [end:guard]
lith.command(app, "/click", Click)
