"""The NOTIFY feed against a real server: commit-only delivery, the payload limit, large pushes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

import psycopg
import pytest

from fastapi_lith import Command, Frame, Tx
from fastapi_lith.backends.postgres.db import open_postgres
from fastapi_lith.backends.postgres.feed import LIMIT, NotifyFeed
from fastapi_lith.backends.postgres.writer import PgWriter
from fastapi_lith.engine.feed import Changes
from tests.support import until
from tests.support.pgproxy import CuttingProxy


async def changes(feed: NotifyFeed, want: int = 1, timeout: float = 10.0) -> Changes:
    """Everything the feed received until `want` topics, pushes or revocations arrived."""
    topics: set[str] = set()
    pushes: list = []
    revoked: list = []
    everything = False
    async with asyncio.timeout(timeout):
        while len(topics) + len(pushes) + len(revoked) < want and not everything:
            got = feed.poll()
            if got is not None:
                topics |= got.topics
                pushes += got.pushes
                revoked += got.revoked
                everything |= got.everything
            await asyncio.sleep(0.01)
    return Changes(frozenset(topics), tuple(pushes), everything, tuple(revoked))


async def heard_only_others(feed: NotifyFeed, conn: psycopg.Connection) -> None:
    """`feed` heard none of its own notifications: a marker another process commits after them
    is all that comes (NOTIFY delivers in commit order)."""
    conn.execute("BEGIN")
    NotifyFeed(feed.url).publish(conn, {"marker"})
    conn.execute("COMMIT")
    assert await changes(feed) == Changes(frozenset({"marker"}), (), False, ())
    assert feed.received == 1  # nor read a large push of its own back from the table


@contextlib.asynccontextmanager
async def sender_and_listener(
    pg_url: str, *, sender_listens: bool = True
) -> AsyncIterator[tuple[NotifyFeed, NotifyFeed, psycopg.Connection]]:
    """Two processes' feeds: one that publishes on the connection given with it, and one that
    listens. The sender listens too, unless told not to, so a test can show that its own
    notifications never come back to it."""
    sender, listener = NotifyFeed(pg_url), NotifyFeed(pg_url)
    await listener.start(None)  # type: ignore[arg-type]
    if sender_listens:
        await sender.start(None)  # type: ignore[arg-type]
    conn = open_postgres(pg_url)
    try:
        sender.setup(conn)
        yield sender, listener, conn
    finally:
        conn.close()
        await listener.close()
        await sender.close()


async def test_topics_are_delivered_on_commit_only(pg_url: str) -> None:
    async with sender_and_listener(pg_url, sender_listens=False) as (sender, listener, conn):
        conn.execute("BEGIN")
        sender.publish(conn, {"board:1"})
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        sender.publish(conn, {"board:2", "tab:x"})
        await asyncio.sleep(0.3)
        assert listener.poll() is None  # not before COMMIT, and never the rolled-back batch
        conn.execute("COMMIT")
        got = await changes(listener, want=2)
        assert got.topics == {"board:2", "tab:x"} and not got.everything
        assert listener.received == 1  # both topics in one notification
        # One notification: how late it arrived, and how late the poll took it (the metrics').
        assert len(listener.notify_lags) == len(listener.lags) == 1
        assert 0 <= listener.notify_lags[0] <= listener.lags[0] < 3600  # seconds late, not a time of day
        # Its own notifications do not come back to the sender: its hub heard them already.
        await sender.start(None)  # type: ignore[arg-type]
        conn.execute("BEGIN")
        sender.publish(conn, {"board:3"})
        conn.execute("COMMIT")
        assert (await changes(listener)).topics == {"board:3"}
        assert listener.received == 2
        await asyncio.sleep(0.2)
        assert sender.poll() is None


async def test_many_topics_and_large_pushes_arrive_whole_and_never_back_at_their_sender(pg_url: str) -> None:
    async with sender_and_listener(pg_url) as (sender, listener, conn):
        topics = {f"card:{i:06d}:lane" for i in range(3000)}  # ~60 kB: several payloads
        big = Frame("lith-error", "<div id='lith-error'>" + "x" * (3 * LIMIT) + "</div>")
        bigger = Frame("lith-error", "<div id='lith-error'>" + "y" * (4 * LIMIT) + "</div>")
        small = Frame("lith-error", "<div id='lith-error'>no</div>")
        pushes = [("tab1", big), ("tab2", small), ("tab3", bigger)]
        conn.execute("BEGIN")
        sender.publish(conn, topics, pushes)
        conn.execute("COMMIT")
        got = await changes(listener, want=3003)
        assert got.topics == topics
        assert len(listener.notify_lags) == len(listener.lags) > 1  # each payload of topics has its commit time
        assert sorted((tab, f.html, f.signals or {}) for tab, f in got.pushes) == sorted(
            (tab, f.html, f.signals or {}) for tab, f in pushes
        )
        assert sender.stored == 2  # the large ones went through the table
        await heard_only_others(sender, conn)


async def test_a_dropped_listener_reconnects_and_marks_everything(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fastapi_lith.pgfeed")
    listener = NotifyFeed(pg_url)
    await listener.start(None)  # type: ignore[arg-type]
    try:
        # Its thread, by name in a thread dump, does not hold up the process's exit.
        (thread,) = [thread for thread in threading.enumerate() if thread.name == "lith-listen"]
        assert thread.daemon
        for drops in (1, 2):
            with psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE application_name = 'lith-listen' AND datname = current_database()")
            got = await changes(listener)
            assert got.everything and listener.reconnects == drops
        dropped = [m for m in caplog.messages if m.startswith("feed: the listening connection dropped (")]
        assert len(dropped) == 2 and "terminat" in dropped[0]  # with the server's reason
        assert caplog.messages.count("feed: listening again; every view renders once") == 2
    finally:
        await listener.close()
    assert not thread.is_alive()


async def test_a_listener_that_cannot_reach_the_server_tries_again_ever_later(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fastapi_lith.pgfeed")
    proxy = CuttingProxy(pg_url)
    port, url = proxy.port, proxy.url()
    proxy.close()  # its port refuses until a proxy takes it again

    def refusals() -> list[str]:
        return [m for m in caplog.messages if m.startswith("feed: cannot listen (")]

    async def refused(times: int) -> bool:
        return len(refusals()) >= times

    listener, sender = NotifyFeed(url), NotifyFeed(pg_url)
    starting = asyncio.create_task(listener.start(None))  # type: ignore[arg-type]
    await until(lambda: refused(2))
    proxy = CuttingProxy(pg_url, port)
    await starting  # once it listens
    conn = open_postgres(pg_url)
    try:
        assert "refused" in refusals()[0]  # with the reason
        assert [m.rsplit(";", 1)[1] for m in refusals()[:2]] == [" trying again in 0.05 s", " trying again in 0.10 s"]
        assert listener.reconnects == 0  # its first connection
        # Lost again, and refused: it starts over from the shortest wait.
        before = len(refusals())
        proxy.close()
        await until(lambda: refused(before + 1))
        assert refusals()[before].endswith("; trying again in 0.05 s")
        proxy = CuttingProxy(pg_url, port)
        assert (await changes(listener)).everything and listener.reconnects == 1
        sender.setup(conn)
        conn.execute("BEGIN")
        sender.publish(conn, {"board:1"})
        conn.execute("COMMIT")
        assert "board:1" in (await changes(listener)).topics
    finally:
        conn.close()
        await listener.close()
        proxy.close()


async def test_revocations_reach_other_listeners_on_commit_even_when_large(pg_url: str) -> None:
    async with sender_and_listener(pg_url) as (sender, listener, conn):
        long_id = "x" * (LIMIT + 10)  # too long for a payload: it goes through the table
        conn.execute("BEGIN")
        sender.publish(conn, (), (), ["alice", 42, long_id])
        conn.execute("COMMIT")
        revoked = (await changes(listener, want=3)).revoked
        assert sorted(revoked, key=str) == sorted(["alice", 42, long_id], key=str)  # 42 stays an int
        await heard_only_others(sender, conn)


async def test_a_forwarded_push_and_a_revocation_reach_other_processes_through_the_writer(pg_url: str) -> None:
    feed, listener = NotifyFeed(pg_url), NotifyFeed(pg_url)
    writer = PgWriter(pg_url, feed=feed)
    await writer.start()
    await feed.start(writer)
    await listener.start(None)  # type: ignore[arg-type]
    try:
        frame = Frame("lith-error", "<div id='lith-error'>elsewhere</div>", {"seen": 1})
        feed.forward("tab7", frame)  # for a tab of another process: in the writer's next batch
        await feed.revoke("alice")  # a batch of its own, committed when this returns
        got = await changes(listener, want=2)
        assert [(tab, f.key, f.html, f.signals) for tab, f in got.pushes] == [("tab7", frame.key, frame.html, {"seen": 1})]
        assert got.revoked == ("alice",)
    finally:
        await listener.close()
        await feed.close()
        await writer.close()


async def test_a_topic_too_long_for_a_notification_renders_everything(pg_url: str) -> None:
    async with sender_and_listener(pg_url) as (sender, listener, conn):
        conn.execute("BEGIN")
        sender.publish(conn, {"board:1", "card:" + "x" * LIMIT, "zone:1"})
        conn.execute("COMMIT")
        got = await changes(listener)  # it stops at everything
        assert got.everything
        topics = set(got.topics)
        while topics != {"board:1", "zone:1"}:  # the topics before and after it too
            topics |= (await changes(listener)).topics
        await heard_only_others(sender, conn)


async def test_an_unreadable_notification_is_logged_and_skipped(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fastapi_lith.pgfeed")
    async with sender_and_listener(pg_url, sender_listens=False) as (sender, listener, conn):
        conn.execute("SELECT pg_notify(%s, %s)", (listener.channel, "not json"))
        conn.execute("BEGIN")
        sender.publish(conn, {"board:1"})  # after it, on the same channel
        conn.execute("COMMIT")
        assert (await changes(listener)).topics == {"board:1"}
        assert "feed: unreadable notification 'not json'" in caplog.messages and listener.received == 1


class Touch(Command):
    """Writes nothing; its topic is what other processes hear."""

    topic: str

    def apply(self, tx: Tx) -> None:
        tx.touch(self.topic)


async def test_a_commands_topics_reach_another_process_when_its_batch_commits(pg_url: str) -> None:
    listener = NotifyFeed(pg_url)
    await listener.start(None)  # type: ignore[arg-type]
    writer = PgWriter(pg_url, feed=NotifyFeed(pg_url))
    await writer.start()
    try:
        await writer.do(Touch(topic="board:7"))
        assert (await changes(listener)).topics == {"board:7"}
    finally:
        await writer.close()
        await listener.close()


async def test_a_listener_tells_its_hub_as_notifications_arrive_once_for_those_that_come_together(pg_url: str) -> None:
    """The hub polls when told, not only at its tick: told once per arrival, and what it then
    polls is everything that arrived."""
    async with sender_and_listener(pg_url, sender_listens=False) as (sender, listener, conn):
        told: list[Changes | None] = []
        arrived = asyncio.Event()

        def poll_now() -> None:
            told.append(listener.poll())
            arrived.set()

        listener.on_arrival(poll_now)
        conn.execute("BEGIN")
        sender.publish(conn, {"board:1"})
        conn.execute("COMMIT")
        await asyncio.wait_for(arrived.wait(), 10)
        assert told == [Changes(frozenset({"board:1"}), (), False, ())]
        arrived.clear()
        for i in range(50):  # 50 commits as fast as they go: fewer calls, nothing lost
            conn.execute("BEGIN")
            sender.publish(conn, {f"card:{i}"})
            conn.execute("COMMIT")
        topics: set[str] = set()
        async with asyncio.timeout(10):
            while len(topics) < 50:
                await arrived.wait()
                arrived.clear()
                topics = {t for got in told[1:] if got is not None for t in got.topics}
        assert topics == {f"card:{i}" for i in range(50)}
        assert len(told) <= 51
        listener.on_arrival(None)
        conn.execute("BEGIN")
        sender.publish(conn, {"board:2"})
        conn.execute("COMMIT")
        assert (await changes(listener)).topics == {"board:2"}  # polled at a tick, told nobody
        assert len(told) <= 51 and not any(got and "board:2" in got.topics for got in told)
