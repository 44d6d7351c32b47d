import asyncio
from pathlib import Path

import htpy as h
import sqlalchemy as sa

from fastapi_lith import Command, Db, Lith, Tx
from fastapi_lith.testing import Tabs

counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)


class Add(Command):
    n: int = 1

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")
        return tx.scalar(COUNT)


def make_lith(tmp_path: Path) -> Lith:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text(
        "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL);"
        "INSERT INTO counter VALUES (1, 0);"
    )
    lith = Lith(tmp_path / "app.db", migrations=tmp_path / "migrations")

    @lith.view("counter", topics={"counter"})
    def counter_view(db: Db) -> h.Element:
        return h.p("#counter")[db.scalar(COUNT)]

    return lith


async def test_every_tab_sees_every_command(tmp_path: Path) -> None:
    lith = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        alice, bob = await tabs.open("counter"), await tabs.open("counter")
        assert bob.html("counter") == '<p id="counter">0</p>'

        assert await alice.do(Add(n=2)) == 2   # committed when do() returns
        assert bob.html("counter") == '<p id="counter">0</p>'   # no tick yet
        assert await tabs.tick() == 1          # one render, for both tabs
        assert bob.html("counter") == '<p id="counter">2</p>'

        await asyncio.gather(*(bob.do(Add()) for _ in range(10)))
        assert await tabs.tick() == 1          # ten commits, one render
        assert alice.html("counter") == '<p id="counter">12</p>'
        assert lith.hub.counters.renders == 3
