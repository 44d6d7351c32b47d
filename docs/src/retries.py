"""A command keyed by the page's tab and op: a retried click applies once."""

from datetime import date
from pathlib import Path

import sqlalchemy as sa
from pydantic import BaseModel, Field

from fastapi_lith import Command, Lith, Tx

lith = Lith("counter.db", migrations=Path(__file__).parent / "counter" / "migrations")
counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)


# --8<-- [start:command]
class Add(Command):
    n: int = Field(1, ge=1, le=100)
    tab: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    op: int = 0          # the page's action id: a retry of the same click applies once
# --8<-- [end:command]

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")
        return tx.scalar(COUNT)


# --8<-- [start:result]
class Total(BaseModel):
    count: int
    on: date


class AddAndTell(Add):
    def apply(self, tx: Tx) -> Total:  # a repeat's answer is read back as a Total
        return Total(count=super().apply(tx), on=date.today())
# --8<-- [end:result]
