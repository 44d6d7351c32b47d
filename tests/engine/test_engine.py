"""`Engine`: one database's writer, readers, hub and feed, with no web framework."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from markupsafe import Markup

from fastapi_lith import Command, Db, LocalFeed, Tx, open_backend
from fastapi_lith.backends.sqlite.db import SqliteReaders
from fastapi_lith.engine.engine import Engine, app_views, register_view
from fastapi_lith.engine.frames import Frame
from fastapi_lith.engine.streams import Stream
from fastapi_lith.exceptions import NotRunning


class Hold(Command):
    """Holds the writer thread until the test lets it go."""

    def apply(self, tx: Tx) -> None:
        HELD.set()
        assert RELEASE.wait(10)


class Add(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute("UPDATE counter SET n = n + 1")
        tx.touch("counter")


HELD, RELEASE = threading.Event(), threading.Event()


def engine_on(tmp_path: Path) -> Engine:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "0001.sql").write_text("CREATE TABLE counter (n INTEGER); INSERT INTO counter VALUES (0);")
    backend = open_backend(tmp_path / "app.db")
    feed = LocalFeed()
    views = app_views("")

    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT n FROM counter"))

    register_view(views, "counter", {"counter"})(counter)
    return Engine(backend, backend.writer(migrations=tmp_path / "m", feed=feed), feed, views, readers=1)


async def test_an_engine_with_a_stream_or_a_waiting_command_is_not_idle(tmp_path: Path) -> None:
    HELD.clear()
    RELEASE.clear()
    engine = engine_on(tmp_path)
    async with engine.run(ticks=False):
        assert engine.is_idle()
        held = asyncio.ensure_future(engine.writer.do(Hold()))
        await asyncio.to_thread(HELD.wait, 10)  # the writer thread is in Hold's batch
        waiting = asyncio.ensure_future(engine.writer.do(Add()))
        await asyncio.sleep(0)  # Add is queued behind the batch in flight
        assert engine.writer.queued == 1 and not engine.is_idle()
        RELEASE.set()
        await asyncio.gather(held, waiting)
        assert engine.writer.queued == 0 and engine.is_idle()
        stream = Stream("t1")
        subscription = await engine.hub.open(stream, ["counter"])
        assert not engine.is_idle()
        subscription.close()
        assert engine.is_idle()


async def test_an_engine_renders_and_pushes_without_http(tmp_path: Path) -> None:
    engine = engine_on(tmp_path)
    async with engine.run(ticks=False):
        await engine.writer.do(Add())
        assert await engine.render("counter") == '<p id="counter">1</p>'
        stream = Stream("t1")
        subscription = await engine.hub.open(stream, ["counter"])
        engine.push("t1", Frame("note", '<p id="note">hi</p>'))
        assert [f.key for f in stream.take()] == ["counter", "note"]
        subscription.close()


async def test_an_engine_built_without_settings_ticks_every_50_ms_on_two_readers_of_its_own(tmp_path: Path) -> None:
    parts = engine_on(tmp_path)
    engine = Engine(parts.backend, parts.writer, parts.feed, parts.views)
    before = set(threading.enumerate())  # another test's pool may still be winding down
    async with engine.run(ticks=False):
        readers = [t.name for t in threading.enumerate() if t not in before and t.name.startswith("lith-reader")]
        assert sorted(readers) == ["lith-reader-0", "lith-reader-1"]
        assert engine.hub.interval == 0.05


async def test_an_engine_renders_through_the_apps_own_readers_and_leaves_them_open(tmp_path: Path) -> None:
    parts = engine_on(tmp_path)
    readers = SqliteReaders(tmp_path / "app.db", size=1)
    engine = Engine(parts.backend, parts.writer, parts.feed, parts.views, readers=readers)
    try:
        async with engine.run(ticks=False):
            assert await asyncio.wait_for(engine.render("counter"), 10) == '<p id="counter">0</p>'
        assert await readers.run(lambda db: db.scalar("SELECT n FROM counter")) == 0  # still the app's to close
    finally:
        readers.close()


async def test_an_engine_not_running_refuses_its_hub_and_reads_is_idle_and_drops_a_push(tmp_path: Path) -> None:
    engine = engine_on(tmp_path)
    for part in ("hub", "async_engine"):
        with pytest.raises(NotRunning, match=r"^the app is not running: use lith.lifespan$"):
            getattr(engine, part)
    assert engine.is_idle() and not engine.running
    engine.push("t1", Frame("note", '<p id="note">hi</p>'))  # no stream anywhere: nothing to do


async def test_an_apps_views_built_without_a_hint_show_none_in_a_tabs_outcome(tmp_path: Path) -> None:
    parts = engine_on(tmp_path)
    engine = Engine(parts.backend, parts.writer, parts.feed, app_views(), readers=1)
    async with engine.run(ticks=False):
        outcome = await engine.render("outcome/{tab}", {"tab": "t1"})
        assert 'id="lith-error"' in outcome and "hint" not in outcome
