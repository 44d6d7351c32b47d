"""The change feed within one test process: two `Lith`s on one file stand for two processes.

Each has its own writer connection, lock file descriptor, feed connection and hub, exactly as two
processes would; only the address space is shared. tests/engine/test_workers.py runs real processes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
from pathlib import Path

import htpy as h
import pytest

from fastapi_lith import Command, Db, Frame, Lith, SettingError, Tx
from fastapi_lith.backends.sqlite.db import open_sqlite
from fastapi_lith.backends.sqlite.feed import SqliteFeed
from fastapi_lith.engine.feed import LocalFeed, Outbox
from fastapi_lith.engine.frames import sse_event
from fastapi_lith.testing import Tabs
from tests.support import holds, until

MIGRATION = """
CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO counter VALUES (1, 0);
CREATE TABLE note (tab TEXT PRIMARY KEY, text TEXT NOT NULL);
"""


class Add(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
        tx.touch("counter")


class Note(Command):
    tab: str
    text: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT OR REPLACE INTO note VALUES (?, ?)", (self.tab, self.text))
        tx.touch(f"tab:{self.tab}")


def make_lith(tmp_path: Path, **kwargs: object) -> Lith:
    folder = tmp_path / "migrations"
    folder.mkdir(exist_ok=True)
    (folder / "0001_init.sql").write_text(MIGRATION)
    lith = Lith(tmp_path / "app.db", migrations=folder, **kwargs)  # type: ignore[arg-type]

    @lith.view("counter", topics={"counter"})
    def counter(db: Db) -> h.Element:
        return h.p("#counter")[db.scalar("SELECT n FROM counter")]

    @lith.view("note/{tab}", topics={"tab:{tab}"})
    def note(db: Db, tab: str) -> h.Element:
        return h.p("#note")[db.scalar("SELECT text FROM note WHERE tab = ?", (tab,)) or "-"]

    return lith


def refuse_feed_entries(db: Path) -> None:
    """SQLite refuses every new feed entry (with `IntegrityError`) until the trigger is dropped."""
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON lith_feed BEGIN SELECT RAISE(ABORT, 'no feed'); END")


async def test_a_commit_in_one_process_reaches_the_other_at_its_next_tick(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        here = await tabs_a.open("counter", "note/{tab}", tab="here")
        there = await tabs_b.open("counter", "note/{tab}", tab="there")
        other = await tabs_b.open("note/{tab}", tab="other")
        await tabs_a.do(Add())
        await tabs_a.do(Note(tab=there.id, text="for the tab in b"))
        assert await tabs_a.tick() == 1  # a's own commit, through its writer
        assert await tabs_b.tick() == 2  # a's commits, through the feed: counter, there's note
        assert here.html("counter") == there.html("counter") == '<p id="counter">1</p>'
        assert there.html("note/{tab}") == '<p id="note">for the tab in b</p>'
        assert other.html("note/{tab}") == '<p id="note">-</p>'
        assert len(other.received) == 1  # only its first frame: nothing for another tab
        # b's commits reach a the same way, and a hub hears nothing of its own entries twice.
        await tabs_b.do(Add())
        assert await tabs_b.tick() == 1
        assert await tabs_a.tick() == 1
        assert here.html("counter") == '<p id="counter">2</p>'
        assert await tabs_a.tick() == 0 and await tabs_b.tick() == 0


async def test_pushes_reach_the_tab_in_the_other_process(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a), Tabs(b) as tabs_b:
        there, bystander = await tabs_b.open("counter", tab="there"), await tabs_b.open("counter", tab="by")
        frame = Frame("lith-error", '<div id="lith-error">n: too big</div>', {"done": 3})
        assert a.hub.push(there.id, frame) == 0  # no stream of that tab in a
        # The push travels in a's writer's next batch; b takes it at its next tick.
        async with asyncio.timeout(5):
            while not there.read():
                await asyncio.sleep(0.01)
                await tabs_b.tick()
        got = there.received[-1]
        assert (got.key, got.html, got.signals) == (frame.key, frame.html, frame.signals)
        assert sse_event(got) == sse_event(frame)
        assert bystander.read() == []


async def test_pushes_that_cannot_be_forwarded_are_logged_with_their_count_and_the_next_ones_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a), Tabs(b) as tabs_b:
        there = await tabs_b.open("counter", tab="there")
        refuse_feed_entries(tmp_path / "app.db")  # the feed entry that carries them fails
        caplog.set_level(logging.ERROR, logger="fastapi_lith.feed")
        # Both pushed before a's outbox runs: one feed entry for the two, and one log line.
        a.hub.push(there.id, Frame("lith-error", '<div id="lith-error">lost</div>'))
        a.hub.push(there.id, Frame("lith-error", '<div id="lith-error">lost too</div>'))
        assert "lith-feed-forward" in {task.get_name() for task in asyncio.all_tasks()}  # as a task dump names it

        async def logged() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "fastapi_lith.feed"]

        [record] = await until(logged)
        assert record.getMessage() == "could not forward 2 pushes"
        assert record.exc_info is not None and isinstance(record.exc_info[1], sqlite3.IntegrityError)
        with sqlite3.connect(tmp_path / "app.db") as conn:
            conn.execute("DROP TRIGGER refuse")
        a.hub.push(there.id, Frame("lith-error", '<div id="lith-error">arrived</div>'))

        async def arrived() -> list[Frame]:
            await tabs_b.tick()
            return there.read()

        assert [f.html for f in await until(arrived)] == ['<div id="lith-error">arrived</div>']


async def test_an_outbox_stopped_before_its_sending_began_sends_everything_once_started_again(
    tmp_path: Path,
) -> None:
    """A push that comes in during a stop's last await is queued, its sending never begun: the
    next start sends it with the ones after it."""
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a), Tabs(b) as tabs_b:
        there = await tabs_b.open("counter", tab="there")
        outbox = Outbox(a.feed)
        outbox.writer = a.engine.writer
        outbox.put(there.id, Frame("queued", '<p id="queued">queued at the stop</p>'))
        outbox.close()
        outbox.writer = a.engine.writer
        outbox.put(there.id, Frame("later", '<p id="later">after the start</p>'))

        async def arrived() -> list[Frame]:
            await tabs_b.tick()
            return there.read()

        # One feed entry carries both.
        sent = ['<p id="queued">queued at the stop</p>', '<p id="later">after the start</p>']
        assert [f.html for f in await until(arrived)] == sent


async def test_an_idle_poll_asks_only_data_version(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b):
        assert isinstance(b.feed, SqliteFeed)
        statements: list[str] = []
        b.feed._conn.set_trace_callback(statements.append)  # type: ignore[union-attr]
        for _ in range(5):
            b.hub.poll()
        assert statements == ["PRAGMA data_version"] * 5
        statements.clear()
        await tabs_a.do(Add())
        b.hub.poll()
        b.hub.poll()
        assert statements[0] == "PRAGMA data_version"
        assert any("FROM lith_feed" in s for s in statements)
        assert statements[-1] == "PRAGMA data_version"
        assert len(statements) == 3  # the second poll: nothing new, no query


async def test_a_hub_behind_the_pruned_feed_renders_everything_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_lith(tmp_path, feed=SqliteFeed(tmp_path / "app.db", keep=4, prune_every=2))
    b = make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        there = await tabs_b.open("counter", "note/{tab}", tab="there")
        # A revocation may be among the missed entries: a principal's stream must reconnect.
        alice = await tabs_b.open("counter", principal="alice")
        for i in range(10):  # ten batches: b's hub polls none of them
            await tabs_a.do(Note(tab="someone-else", text=str(i)))
        with sqlite3.connect(tmp_path / "app.db") as conn:
            assert conn.execute("SELECT seq FROM lith_feed").fetchall() == [(7,), (8,), (9,), (10,)]
        caplog.set_level(logging.INFO, logger="fastapi_lith.feed")
        assert await tabs_b.tick() == 2  # a gap: both views render, though no topic of theirs
        assert isinstance(b.feed, SqliteFeed) and (b.feed.gaps, b.feed.reads) == (1, 4)
        assert "feed: 6 entries missed, every view renders again" in caplog.messages
        assert b.hub.counters.gaps == 1
        assert alice.stream.ended and not there.stream.ended
        assert await tabs_b.tick() == 0
        await tabs_a.do(Add())
        assert await tabs_b.tick() == 1  # caught up: topics again
        assert there.html("counter") == '<p id="counter">1</p>'
        assert (b.feed.gaps, b.feed.reads) == (1, 5)
        for i in range(6):  # behind again: entry 12 pruned
            await tabs_a.do(Note(tab="someone-else", text=str(i)))
        assert await tabs_b.tick() == 2
        assert (b.feed.gaps, b.feed.reads) == (2, 10) and b.hub.counters.gaps == 2
        assert "feed: 1 entries missed, every view renders again" in caplog.messages


async def test_a_poll_whose_read_fails_reads_the_change_at_the_next_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The version moves on only with the rows read: a failed read of the table loses nothing."""
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        there = await tabs_b.open("counter")
        assert isinstance(b.feed, SqliteFeed) and b.feed._conn is not None
        conn = b.feed._conn
        running: list[str] = []
        faults = [1]  # SQLite interrupts the next read of the feed table, once

        def interrupt() -> int:
            if faults and running and "FROM lith_feed" in running[-1]:
                faults.pop()
                return 1
            return 0

        conn.set_trace_callback(running.append)
        conn.set_progress_handler(interrupt, 1)
        await tabs_a.do(Add())
        caplog.set_level(logging.DEBUG, logger="fastapi_lith.feed")
        assert await tabs_b.tick() == 0  # data_version moved, the read was interrupted
        assert caplog.messages == ["feed poll deferred: interrupted"]
        assert not faults and b.feed.changed == 1
        assert await tabs_b.tick() == 1  # no commit since: the same change is read again
        assert there.html("counter") == '<p id="counter">1</p>'
        conn.set_progress_handler(None, 1)
        conn.set_trace_callback(None)


async def test_a_failing_feed_write_rolls_back_its_batch(tmp_path: Path) -> None:
    """The entry is written inside the batch: no commit that other processes never hear of."""
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        there = await tabs_b.open("counter")
        refuse_feed_entries(tmp_path / "app.db")  # a feed write that SQLite refuses
        with pytest.raises(sqlite3.IntegrityError, match="no feed"):
            await tabs_a.do(Add())
        with sqlite3.connect(tmp_path / "app.db") as conn:
            assert conn.execute("SELECT n FROM counter").fetchone()[0] == 0
            conn.execute("DROP TRIGGER refuse")
        assert await tabs_a.do(Add()) is None
        assert await tabs_b.tick() == 1
        assert there.html("counter") == '<p id="counter">1</p>'


async def test_the_hub_reads_the_feed_on_a_read_only_connection_that_close_closes(tmp_path: Path) -> None:
    lith = make_lith(tmp_path)
    async with Tabs(lith):
        assert isinstance(lith.feed, SqliteFeed) and lith.feed._conn is not None
        conn = lith.feed._conn
        with pytest.raises(sqlite3.OperationalError, match="readonly"):  # the event loop never writes
            conn.execute("DELETE FROM lith_feed")
    assert lith.feed._conn is None and lith.feed._lock_fd is None
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


async def test_a_hub_skips_only_its_own_entries_among_other_processes(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        there = await tabs_b.open("counter", "note/{tab}", tab="there")
        await tabs_a.do(Add())
        await tabs_b.do(Note(tab="someone-else", text="b's own"))
        await tabs_a.do(Note(tab=there.id, text="after the entry of b"))
        assert await tabs_b.tick() == 2  # a's two entries, either side of b's own
        assert there.html("note/{tab}") == '<p id="note">after the entry of b</p>'
        assert isinstance(b.feed, SqliteFeed) and (b.feed.changed, b.feed.reads) == (1, 3)
        await tabs_a.do(Add())
        assert await tabs_b.tick() == 1
        assert b.feed.changed == 2


async def test_writers_of_two_processes_take_turns_without_busy_errors(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b) as tabs_b:
        async def producer(tabs: Tabs) -> None:
            for _ in range(30):
                await tabs.do(Add())

        results = await asyncio.gather(
            *(producer(tabs) for tabs in (tabs_a, tabs_b) for _ in range(10)), return_exceptions=True
        )
        assert [r for r in results if r is not None] == []
        assert a.writer.batches > 1 and b.writer.batches > 1
    with sqlite3.connect(tmp_path / "app.db") as conn:
        assert conn.execute("SELECT n FROM counter").fetchone()[0] == 600


async def test_processes_starting_at_once_migrate_once(tmp_path: Path) -> None:
    liths = [make_lith(tmp_path) for _ in range(4)]
    async with asyncio.TaskGroup() as group:
        for lith in liths:
            group.create_task(lith.writer.start())
    for lith in liths:
        await lith.writer.close()
    with sqlite3.connect(tmp_path / "app.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM counter").fetchone()[0] == 1


async def test_a_local_feed_writes_nothing_to_the_database(tmp_path: Path) -> None:
    lith = make_lith(tmp_path, feed=LocalFeed())
    async with Tabs(lith) as tabs:
        tab = await tabs.open("counter")
        await tabs.do(Add())
        assert await tabs.tick() == 1
        assert tab.html("counter") == '<p id="counter">1</p>'
    with sqlite3.connect(tmp_path / "app.db") as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'lith_feed'").fetchall() == []


@pytest.mark.parametrize("feed", [SqliteFeed, LocalFeed])
async def test_a_rejected_command_publishes_nothing(tmp_path: Path, feed: type) -> None:
    class Fails(Command):
        def apply(self, tx: Tx) -> None:
            tx.touch("counter")
            raise ValueError("no")

    lith = make_lith(tmp_path, feed=feed(tmp_path / "app.db") if feed is SqliteFeed else feed())
    async with Tabs(lith) as tabs:
        with pytest.raises(ValueError):
            await tabs.do(Fails())
    with sqlite3.connect(tmp_path / "app.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "lith_feed" in tables:
            assert conn.execute("SELECT count(*) FROM lith_feed").fetchone()[0] == 0


async def test_the_lock_file_is_held_while_a_batch_runs(tmp_path: Path) -> None:
    import fcntl
    import os

    seen: list[str] = []

    class Probe(Command):
        def apply(self, tx: Tx) -> None:
            fd = os.open(tmp_path / "app.db-lock", os.O_RDWR)
            try:  # another process's writer, trying to take its turn now
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                seen.append("held")
            else:
                seen.append("free")
            finally:
                os.close(fd)

    lith = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        await tabs.do(Probe())
        fd = os.open(tmp_path / "app.db-lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # between batches: free
        finally:
            os.close(fd)
    assert seen == ["held"]


async def test_a_hub_on_its_timer_hears_another_process_with_no_commit_of_its_own(tmp_path: Path) -> None:
    from fastapi_lith.engine.streams import Stream

    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with a.lifespan(), b.lifespan():
        stream = Stream("t1")
        subscription = await b.hub.open(stream, ["counter"])
        assert [f.html for f in stream.take()] == ['<p id="counter">0</p>']
        await a.writer.do(Add())
        frames = await asyncio.wait_for(stream.next(), 10)  # b polls the feed every tick
        assert [f.html for f in frames] == ['<p id="counter">1</p>']
        subscription.close()


async def test_a_revocation_crosses_to_the_other_process_and_an_old_feed_table_gains_its_column(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:  # the feed table as releases before revocations made it
        conn.execute(
            "CREATE TABLE lith_feed (seq INTEGER PRIMARY KEY, origin TEXT NOT NULL, topics TEXT NOT NULL, pushes TEXT)"
        )
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a), Tabs(b) as tabs_b:
        hers = await tabs_b.open("counter", principal="alice")
        his = await tabs_b.open("counter", principal="bob")
        number = await tabs_b.open("counter", principal=7)
        assert await a.revoke("alice") == 0  # none of hers in process a
        assert await a.revoke("7") == 0  # the principal "7" is not the principal 7
        for wrong in (None, 7.0, ["alice"]):  # nobody, a float, a list: no principal's id
            said = rf"^revoke takes a principal's id \(a str or an int\), not {re.escape(repr(wrong))}$"
            with pytest.raises(SettingError, match=said):
                await a.revoke(wrong)  # type: ignore[arg-type]
        await tabs_b.tick()  # revoke returned once committed: b's next poll reads it
        assert hers.stream.ended and hers.stream.revoked
        assert not his.stream.ended and not number.stream.ended


async def test_a_feed_built_without_settings_keeps_its_newest_4096_entries_and_lag_samples(tmp_path: Path) -> None:
    """`SqliteFeed(path)` as an app builds it: how far behind a hub may fall and still replay,
    pruned every 256 batches, and how many lag samples wait for metrics that may never drain them."""
    feed, other = SqliteFeed(tmp_path / "app.db"), SqliteFeed(tmp_path / "app.db")
    conn = open_sqlite(tmp_path / "app.db")
    feed.setup(conn)
    await other.start(None)  # type: ignore[arg-type]  # another process's hub, which forwards nothing
    conn.execute("BEGIN")
    for i in range(1, 4352):  # a batch apiece, up to the one before the 17th prune
        feed.publish(conn, {f"n:{i}"})
    conn.execute("COMMIT")
    # The 16 prunes so far, at seq 256, 512, ... 4096, each fell before the oldest entry.
    assert tuple(conn.execute("SELECT min(seq), count(*) FROM lith_feed").fetchone()) == (1, 4351)
    changes = other.poll()
    assert changes is not None and len(changes.topics) == other.reads == 4351
    assert len(other.lags) == 4096
    feed.publish(conn, {"n:4352"})
    assert tuple(conn.execute("SELECT min(seq), count(*) FROM lith_feed").fetchone()) == (257, 4096)
    await other.close()
    conn.close()


async def test_a_commit_rings_the_other_process_which_renders_at_once_not_at_its_next_poll(tmp_path: Path) -> None:
    """b polls only every 60 s here: the frame can come in time only through a's ring."""
    from fastapi_lith.engine.streams import Stream

    a, b = make_lith(tmp_path), make_lith(tmp_path, tick=60)
    async with a.lifespan(), b.lifespan():
        assert isinstance(a.feed, SqliteFeed) and isinstance(b.feed, SqliteFeed)
        stream = Stream("t1")
        subscription = await b.hub.open(stream, ["counter"])
        assert [f.html for f in stream.take()] == ['<p id="counter">0</p>']
        await a.writer.do(Add())
        frames = await asyncio.wait_for(stream.next(), 20)
        assert [f.html for f in frames] == ['<p id="counter">1</p>']
        assert a.feed.doorbell.rung >= 1 and b.feed.doorbell.heard >= 1
        # a's hub heard its own commit through its writer: nobody rang it.
        assert a.feed.doorbell.heard == 0
        subscription.close()


async def test_a_ring_while_the_hub_rests_between_ticks_waits_for_the_next_tick(tmp_path: Path) -> None:
    """Between ticks a render could not come sooner, so a ring polls nothing: under a steady
    load of commits the hubs do not poll once per batch of every other process."""
    from fastapi_lith.engine.streams import Stream

    a, b = make_lith(tmp_path), make_lith(tmp_path, tick=60)
    async with a.lifespan(), b.lifespan():
        assert isinstance(b.feed, SqliteFeed)
        stream = Stream("t1")
        subscription = await b.hub.open(stream, ["counter"])
        stream.take()
        await b.writer.do(Add())  # b's own commit: a tick, then 60 s until the next may begin
        assert [f.html for f in await asyncio.wait_for(stream.next(), 20)] == ['<p id="counter">1</p>']
        polls, heard = b.feed.changed, b.feed.doorbell.heard
        await a.writer.do(Add())
        await until(holds(lambda: b.feed.doorbell.heard > heard))
        assert b.feed.changed == polls and b.hub.dirty == set()
        subscription.close()


async def test_a_process_nobody_rings_still_hears_the_commit_at_its_next_tick(tmp_path: Path) -> None:
    from fastapi_lith.engine.streams import Stream

    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with a.lifespan(), b.lifespan():
        assert isinstance(b.feed, SqliteFeed)
        (tmp_path / "app.db-wake" / b.feed.origin).unlink()  # as if b could not listen
        stream = Stream("t1")
        subscription = await b.hub.open(stream, ["counter"])
        stream.take()
        await a.writer.do(Add())
        frames = await asyncio.wait_for(stream.next(), 20)
        assert [f.html for f in frames] == ['<p id="counter">1</p>']
        assert b.feed.doorbell.heard == 0
        subscription.close()


async def test_the_wake_folder_lists_the_live_processes_and_forgets_one_killed(tmp_path: Path) -> None:
    a, b = make_lith(tmp_path), make_lith(tmp_path)
    folder = tmp_path / "app.db-wake"
    async with Tabs(a) as tabs_a, Tabs(b):
        assert isinstance(a.feed, SqliteFeed) and isinstance(b.feed, SqliteFeed)
        assert sorted(p.name for p in folder.iterdir()) == sorted([a.feed.origin, b.feed.origin])
        (folder / "0123456789abcdef").touch()  # a process killed with -9 left its name
        await tabs_a.do(Add())
        assert sorted(p.name for p in folder.iterdir()) == sorted([a.feed.origin, b.feed.origin])
        assert a.feed.doorbell.rung == 1  # b, and not the dead one
        rung = a.feed.doorbell.rung
        await tabs_a.do(Note(tab="x", text="y"))
        assert a.feed.doorbell.rung == rung + 1
    assert list(folder.iterdir()) == []  # each process took its name away as it stopped


async def test_a_batch_that_publishes_nothing_or_fails_rings_nobody(tmp_path: Path) -> None:
    class Quiet(Command):
        def apply(self, tx: Tx) -> None:
            tx.execute("UPDATE counter SET n = n WHERE id = 1")

    a, b = make_lith(tmp_path), make_lith(tmp_path)
    async with Tabs(a) as tabs_a, Tabs(b):
        assert isinstance(a.feed, SqliteFeed)
        await tabs_a.do(Quiet())
        assert a.feed.doorbell.rung == 0
        refuse_feed_entries(tmp_path / "app.db")
        with pytest.raises(sqlite3.IntegrityError, match="no feed"):
            await tabs_a.do(Add())
        assert a.feed.doorbell.rung == 0
