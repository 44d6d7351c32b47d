"""The hub in process, through virtual tabs: real SQLite, real writer, ticks on demand."""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import threading
import weakref
from pathlib import Path

import htpy as h
import pytest
import sqlalchemy as sa

from fastapi_lith import Command, Db, Lith, Tx, ViewError
from fastapi_lith.engine.streams import Stream
from fastapi_lith.engine.views import Views
from fastapi_lith.testing import Tabs
from tests.support import until

SCHEMA = """
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL);
INSERT INTO counter VALUES (1, 0), (2, 0);
CREATE TABLE outcome (tab TEXT PRIMARY KEY, message TEXT NOT NULL);
"""
counter = sa.table("counter", sa.column("id"), sa.column("count"))
ADD = counter.update().where(counter.c.id == sa.bindparam("cid")).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == sa.bindparam("cid"))


class Add(Command):
    n: int = 1
    board: int = 1
    tab: str | None = None

    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"cid": self.board, "n": self.n})
        tx.touch(f"board:{self.board}")
        if self.tab:
            tx.execute("INSERT OR REPLACE INTO outcome VALUES (?, ?)", (self.tab, f"added {self.n}"))
            tx.touch(f"tab:{self.tab}")


class Note(Command):
    def apply(self, tx: Tx) -> None:
        tx.touch("elsewhere")


def make_lith(tmp_path: Path) -> tuple[Lith, dict[str, int]]:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text(SCHEMA)
    lith = Lith(tmp_path / "app.db", migrations=tmp_path / "migrations")
    renders: dict[str, int] = {}

    @lith.view("board/{board_id}", topics={"board:{board_id}"})
    def board(db: Db, board_id: int) -> h.Element:
        renders[f"board/{board_id}"] = renders.get(f"board/{board_id}", 0) + 1
        return h.p(id=f"board-{board_id}")[db.scalar(COUNT, {"cid": board_id})]

    @lith.view("outcome/{tab}", topics={"tab:{tab}"})
    def outcome(db: Db, tab: str) -> h.Element:
        row = db.first("SELECT message FROM outcome WHERE tab = ?", (tab,))
        return h.output(id="outcome")[row["message"] if row else ""]

    @lith.view("quiet", topics={"quiet"})
    def quiet(db: Db) -> h.Element:
        renders["quiet"] = renders.get("quiet", 0) + 1
        return h.div(id="quiet")["nothing happens here"]

    return lith, renders


async def test_many_commits_in_one_tick_render_once(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        a, b = await tabs.open("board/1", "quiet"), await tabs.open("board/1")
        assert a.html("board/1") == '<p id="board-1">0</p>'
        assert renders == {"board/1": 1, "quiet": 1}  # opened once, rendered once for both tabs
        await asyncio.gather(*(tabs.do(Add()) for _ in range(100)))
        assert await tabs.tick() == 1
        assert renders == {"board/1": 2, "quiet": 1}  # the untouched view did not render
        assert a.html("board/1") == b.html("board/1") == '<p id="board-1">100</p>'
        assert await tabs.tick() == 0
        await tabs.do(Note())
        assert await tabs.tick() == 0


async def test_parameterised_instances_are_independent(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        one, two = await tabs.open("board/1"), await tabs.open("board/2")
        await tabs.do(Add(board=1, n=5))
        await tabs.tick()
        assert renders == {"board/1": 2, "board/2": 1}
        assert one.html("board/1") == '<p id="board-1">5</p>'
        assert [f.key for f in two.read()] == []


async def test_per_tab_views_reach_only_their_tab(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("board/1", "outcome/{tab}")
        bob = await tabs.open("board/1", "outcome/{tab}")
        await alice.do(Add(n=3, tab=alice.id))
        await tabs.tick()
        assert alice.html("outcome/{tab}") == '<output id="outcome">added 3</output>'
        assert bob.html("outcome/{tab}") == '<output id="outcome"></output>'
        assert [f.key for f in bob.received[2:]] == ["board/1"]  # bob got the board, not alice's outcome
        # What two tabs watch is sent to both: zstd compresses it once for both (cohorts.py).
        assert sorted((f.key, f.shared) for f in alice.received[2:]) == [("board/1", True), (f"outcome/{alice.id}", False)]
        with pytest.raises(ViewError, match="another tab"):
            await tabs.open(f"outcome/{alice.id}", tab="mallory")


async def test_slow_stream_gets_newest_frame_and_does_not_slow_a_fast_one(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        fast, slow = await tabs.open("board/1"), await tabs.open("board/1")
        seen_by_slow = []
        for tick in range(1, 41):  # the view changes every tick; the slow tab reads every tenth
            await tabs.do(Add())
            assert await tabs.tick() == 1  # the fast tab keeps the view rendering each tick
            assert fast.html("board/1") == f'<p id="board-1">{tick}</p>'
            if tick % 10 == 0:
                seen_by_slow.append([f.html for f in slow.read()])
        assert seen_by_slow == [[f'<p id="board-1">{t}</p>'] for t in (10, 20, 30, 40)]
        assert slow.stream.skipped == 36 and fast.stream.skipped == 0
        assert lith.hub.counters.skipped == 36


async def test_when_every_watcher_stalls_the_instance_stops_rendering(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        a, b = await tabs.open("board/1"), await tabs.open("board/1")
        await tabs.do(Add())
        assert await tabs.tick() == 1  # both now hold an unsent frame
        for _ in range(5):
            await tabs.do(Add())
            assert await tabs.tick() == 0
        assert renders["board/1"] == 2
        assert [f.html for f in b.read()] == ['<p id="board-1">1</p>']  # the one it held
        assert await tabs.tick() == 1  # b caught up: the instance renders the newest state
        assert b.html("board/1") == '<p id="board-1">6</p>'
        assert a.html("board/1") == '<p id="board-1">6</p>'  # a's held frame was replaced


async def test_a_stream_watching_another_view_does_not_make_a_held_instance_render(tmp_path: Path) -> None:
    """Whether every watcher holds a frame is asked of the instance's watchers, not every stream."""
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        held = await tabs.open("board/1")
        await tabs.open("board/2")  # a stream of another view: it holds nothing of board/1
        await tabs.do(Add())
        assert await tabs.tick() == 1  # board/1's only watcher now holds an unsent frame
        for _ in range(3):
            await tabs.do(Add())
            assert await tabs.tick() == 0
        assert renders["board/1"] == 2
        assert [f.html for f in held.read()] == ['<p id="board-1">1</p>']
        assert await tabs.tick() == 1
        assert held.html("board/1") == '<p id="board-1">4</p>'


async def test_render_errors_are_contained(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lith, _ = make_lith(tmp_path)
    broken = {"now": False}

    @lith.view("fragile/{board_id}", topics={"board:{board_id}"})
    def fragile(db: Db, board_id: int) -> h.Element:
        if broken["now"]:
            raise RuntimeError("kaput")
        return h.p(id="fragile")[db.scalar(COUNT, {"cid": board_id})]

    @lith.view("anonymous", topics={"board:1"})
    def anonymous(db: Db) -> h.Element:
        return h.p["no id"]

    async with Tabs(lith) as tabs:
        tab = await tabs.open("fragile/1", "board/1")
        with pytest.raises(ViewError, match="no id"):
            await lith.render("anonymous")
        broken["now"] = True
        await tabs.do(Add())
        with caplog.at_level(logging.ERROR, logger="fastapi_lith.hub"):
            await tabs.tick()
        [record] = caplog.records
        assert record.getMessage() == "view fragile/1 (fragile/{board_id}) failed to render: RuntimeError('kaput')"
        assert isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]  # with its traceback
        assert lith.hub.counters.render_errors == 1
        assert tab.html("fragile/1") == '<p id="fragile">0</p>'  # the last good frame stays
        assert tab.html("board/1") == '<p id="board-1">1</p>'  # other views go on
        broken["now"] = False
        await tabs.do(Add())
        await tabs.tick()
        assert tab.html("fragile/1") == '<p id="fragile">2</p>'


async def test_bad_keys_are_refused_before_subscribing(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        with pytest.raises(ViewError, match="no view matches"):
            await tabs.open("board/1", "nope")
        with pytest.raises(ViewError, match="board_id"):
            await tabs.open("board/abc")
        assert lith.hub.instances == {}


async def test_dropped_instances_free_their_memory(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        tabs_open = [await tabs.open("board/1", "board/2", "outcome/{tab}") for _ in range(50)]
        frame_ref = weakref.ref(lith.hub.instances["board/1"].frame)
        instance_ref = weakref.ref(lith.hub.instances["board/1"])
        assert len(lith.hub.instances) == 52
        for tab in tabs_open:
            tab.read()
            tab.close()
        del tab, tabs_open
        gc.collect()
        assert lith.hub.instances == {} and lith.hub._by_topic == {}

        async def freed() -> bool:  # a tick's render still in flight holds its instance until it returns
            gc.collect()
            return instance_ref() is None and frame_ref() is None

        await until(freed)


async def test_first_paint_renders_the_same_view(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        await tabs.do(Add(board=2, n=7))
        assert await lith.render("board/{board_id}", board_id=2) == '<p id="board-2">7</p>'
        assert await lith.render("board/2") == (await tabs.open("board/2")).html("board/2")


async def test_ticks_on_a_timer(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    from fastapi_lith.engine.frames import sse_event
    from fastapi_lith.engine.streams import Stream

    async with lith.lifespan():
        stream = Stream("t1")
        await lith.hub.open(stream, ["board/1"])
        assert [f.html for f in await stream.next()] == ['<p id="board-1">0</p>']
        await lith.writer.do(Add(n=4))
        frames = await asyncio.wait_for(stream.next(), 2)
        assert [f.html for f in frames] == ['<p id="board-1">4</p>']
        assert sse_event(frames[0]).startswith(b"event: datastar-patch-elements\n")
        lith.hub.close(stream)


async def test_async_read_connection_for_handlers_is_read_only(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        async for conn in lith.db():
            assert (await conn.execute(sa.text("SELECT count FROM counter WHERE id = 1"))).scalar() == 0
            with pytest.raises(sa.exc.OperationalError, match="readonly|query_only|attempt to write"):
                await conn.execute(sa.text("UPDATE counter SET count = 5"))
    with sqlite3.connect(tmp_path / "app.db") as conn:
        assert conn.execute("SELECT count FROM counter WHERE id = 1").fetchone() == (0,)


async def test_a_slow_first_render_never_lands_after_a_newer_one(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    gate = Gate()

    @lith.view("slow/{board_id}", topics={"board:{board_id}"})
    def slow(db: Db, board_id: int) -> h.Element:
        count = db.scalar(COUNT, {"cid": board_id})
        gate.hold()  # the first render reads 0, then waits
        return h.p(id="slow")[count]

    async with Tabs(lith) as tabs:
        opening = asyncio.ensure_future(tabs.open("slow/1"))
        await gate.entered_render()
        await tabs.do(Add())  # lands while the first render is still running
        assert await tabs.tick() == 0  # must not render the instance a second time at once
        gate.release.set()
        tab = await opening
        while await tabs.tick():
            pass
        assert tab.html("slow/1") == '<p id="slow">1</p>'
        assert lith.hub.instances["slow/1"].frame.html == '<p id="slow">1</p>'


async def test_open_returns_with_every_first_frame_even_when_another_tab_renders_it(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)

    gate = Gate()

    @lith.view("big/{board_id}", topics={"board:{board_id}"})
    def big(db: Db, board_id: int) -> h.Element:
        gate.hold()
        return h.div(id="big")["x" * 100_000]

    async with Tabs(lith) as tabs:
        first = asyncio.ensure_future(tabs.open("big/1"))
        await gate.entered_render()  # the first tab's render of big/1 is under way
        second_opening = asyncio.ensure_future(tabs.open("outcome/{tab}", "big/1"))
        while not any(len(i.watchers) == 2 for i in lith.hub.instances.values()):
            await asyncio.sleep(0.01)  # the second tab watches big/1 and waits for its render
        assert not second_opening.done()
        gate.release.set()
        second = await asyncio.wait_for(second_opening, 10)
        # Both frames were there when open returned, so the stream's first write holds both
        # (its outcome renders in the batch after the one in flight, so it lands second).
        assert sorted(f.key for f in second.received) == ["big/1", f"outcome/{second.id}"]
        await first


async def test_executemany_with_a_core_statement(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)

    class Fill(Command):
        def apply(self, tx: Tx) -> int:
            insert = sa.table("outcome", sa.column("tab"), sa.column("message")).insert()
            return tx.executemany(insert, [{"tab": f"t{i}", "message": str(i)} for i in range(50)])

    async with Tabs(lith) as tabs:
        assert await tabs.do(Fill()) == 50
    with sqlite3.connect(tmp_path / "app.db") as conn:
        assert conn.execute("SELECT count(*) FROM outcome").fetchone() == (50,)


# -- the hub on its own timer, and races set up with events, not sleeps -----------------------


class Gate:
    """Holds one render on its reader thread until the test lets it go."""

    def __init__(self) -> None:
        self.armed = True
        self.entered = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(30), "the test never released the render"

    async def entered_render(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30), "the render never started"


async def next_html(stream: Stream, timeout: float = 10) -> list[str]:
    return [f.html for f in await asyncio.wait_for(stream.next(), timeout)]


async def test_a_commit_during_a_first_render_reaches_the_tab_without_a_later_commit(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    gate = Gate()

    @lith.view("held/{board_id}", topics={"board:{board_id}"})
    def held(db: Db, board_id: int) -> h.Element:
        count = db.scalar(COUNT, {"cid": board_id})
        gate.hold()  # the first render has read 0 and waits here
        return h.p(id="held")[count]

    async with lith.lifespan():  # the hub's own timer, no manual ticks
        stream = Stream("t1")
        opening = asyncio.ensure_future(lith.hub.open(stream, ["held/1"]))
        await gate.entered_render()
        await lith.writer.do(Add())  # lands while the first render runs
        gate.release.set()
        await asyncio.wait_for(opening, 10)
        assert await next_html(stream) == ['<p id="held">0</p>']
        assert await next_html(stream) == ['<p id="held">1</p>']  # no later commit needed
        lith.hub.close(stream)


async def test_a_commit_during_an_unchanged_render_is_rendered_on_the_next_tick(tmp_path: Path) -> None:
    # The render that the commit overtook sends nothing (its HTML did not change), so no tab
    # takes a frame: only the hub itself can wake for the commit it missed.
    lith, _ = make_lith(tmp_path)
    gate = Gate()
    gate.armed = False

    @lith.view("held/{board_id}", topics={"board:{board_id}"})
    def held(db: Db, board_id: int) -> h.Element:
        count = db.scalar(COUNT, {"cid": board_id})
        gate.hold()
        return h.p(id="held")[count]

    async with lith.lifespan():
        stream = Stream("t1")
        await lith.hub.open(stream, ["held/1"])
        assert await next_html(stream) == ['<p id="held">0</p>']
        gate.armed = True
        await lith.writer.do(Add(n=0))  # the timer renders, and is held after its read
        await gate.entered_render()
        await lith.writer.do(Add(n=1))
        gate.release.set()
        assert await next_html(stream) == ['<p id="held">1</p>']
        assert lith.hub.counters.unchanged == 1
        lith.hub.close(stream)


async def test_a_commit_during_a_failed_first_render_is_rendered_without_a_later_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The first render fails, so no tab gets a frame to take: only the hub itself can wake
    # for the commit that landed while it ran.
    lith, _ = make_lith(tmp_path)
    gate = Gate()

    @lith.view("flaky/{board_id}", topics={"board:{board_id}"})
    def flaky(db: Db, board_id: int) -> h.Element:
        count = db.scalar(COUNT, {"cid": board_id})
        if gate.armed:
            gate.hold()
            raise RuntimeError("first render fails")
        return h.p(id="flaky")[count]

    async with lith.lifespan():
        stream = Stream("t1")
        opening = asyncio.ensure_future(lith.hub.open(stream, ["flaky/1"]))
        await gate.entered_render()
        await lith.writer.do(Add())
        gate.release.set()
        await asyncio.wait_for(opening, 10)
        assert await next_html(stream) == ['<p id="flaky">1</p>']
        assert lith.hub.counters.render_errors == 1
        lith.hub.close(stream)


async def test_the_timer_renders_an_instance_at_most_once_per_tick(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    lith.tick = 0.2
    async with lith.lifespan():
        stream = Stream("t1")
        await lith.hub.open(stream, ["board/1"])
        taken: list[str] = []

        async def reader() -> None:  # a fast tab: it never holds a frame back
            while True:
                taken.extend(f.html for f in await stream.next())

        reading = asyncio.ensure_future(reader())
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(300):  # a commit every few milliseconds
            await lith.writer.do(Add())
        while taken[-1:] != ['<p id="board-1">300</p>']:  # the last commit reaches the tab
            assert loop.time() < started + 60, taken[-1:]
            await asyncio.sleep(0.01)
        elapsed = loop.time() - started
        await asyncio.sleep(0.5)  # a tick already woken may still run
        ticks = lith.hub.counters.ticks
        await asyncio.sleep(0.5)
        assert lith.hub.counters.ticks == ticks  # an idle hub does not tick
        reading.cancel()
        lith.hub.close(stream)
    # Slowness only lowers the count: at most one render per tick, plus the one at once.
    assert renders["board/1"] - 1 <= elapsed / 0.2 + 2, (renders, elapsed)


async def test_every_frame_of_one_tick_shows_one_state(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    gate = Gate()
    gate.armed = False

    def counted(name: str) -> None:
        @lith.view(name, topics={"board:1"})
        def view(db: Db) -> h.Element:
            count = db.scalar(COUNT, {"cid": 1})
            gate.hold()  # the first instance of the tick waits after its read
            return h.p(id=name)[count]

    counted("left")
    counted("right")
    async with Tabs(lith) as tabs:
        tab = await tabs.open("left", "right")
        await tabs.do(Add())
        gate.armed = True
        ticking = asyncio.ensure_future(tabs.tick())
        await gate.entered_render()
        await tabs.do(Add())  # commits between the two renders of one tick
        gate.release.set()
        assert await asyncio.wait_for(ticking, 10) == 2
        assert (tab.html("left"), tab.html("right")) == ('<p id="left">1</p>', '<p id="right">1</p>')
        assert await tabs.tick() == 2
        assert (tab.html("left"), tab.html("right")) == ('<p id="left">2</p>', '<p id="right">2</p>')


async def test_an_unchanged_render_sends_nothing(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        tab = await tabs.open("board/1")
        await tabs.do(Add(n=0))  # touches the board, changes nothing it shows
        assert await tabs.tick() == 1
        assert renders["board/1"] == 2
        assert tab.read() == []
        assert lith.hub.counters.unchanged == 1
        await tabs.do(Add(n=2))
        await tabs.tick()
        assert [f.html for f in tab.read()] == ['<p id="board-1">2</p>']
        await tabs.do(Add(n=0))
        await tabs.tick()
        assert lith.hub.counters.unchanged == 2


async def test_unchanged_instances_do_not_hold_back_a_changed_one_in_the_same_tick(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)

    @lith.view("same/{n}", topics={"board:1"})
    def same(db: Db, n: int) -> h.Element:
        return h.p(id=f"same-{n}")["always the same"]

    async with Tabs(lith) as tabs:
        tab = await tabs.open("board/1", *(f"same/{n}" for n in range(40)))
        await tabs.do(Add(n=3))  # dirties 41 instances; 40 render as before, in any order
        assert await tabs.tick() == 41
        assert [f.html for f in tab.read()] == ['<p id="board-1">3</p>']
        assert lith.hub.counters.unchanged == 40


async def test_push_reaches_every_stream_of_one_tab_only(tmp_path: Path) -> None:
    from fastapi_lith.engine.frames import Frame

    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        one, two = await tabs.open("board/1", tab="alice"), await tabs.open("quiet", tab="alice")
        other = await tabs.open("board/1", tab="bob")
        error = Frame("lith-error", '<div id="lith-error">no</div>')
        assert lith.hub.push("alice", error) == 2
        assert one.read() == [error] and two.read() == [error]
        assert other.read() == []
        assert lith.hub.push("nobody", error) == 0


def test_tick_percentiles_are_in_milliseconds() -> None:
    from fastapi_lith.engine.hub import Counters

    counters = Counters()
    assert counters.tick_percentiles() == {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    counters.tick_seconds.append(0.004)
    assert counters.tick_percentiles() == {"p50": 4.0, "p95": 4.0, "p99": 4.0}
    two = Counters()
    two.tick_seconds.extend([0.001, 0.003])
    assert two.tick_percentiles()["p50"] == pytest.approx(2.0)  # two samples interpolate
    counters.tick_seconds.extend(i / 1000 for i in range(1, 101))  # 1 to 100 ms, and the 4 above
    got = counters.tick_percentiles()
    assert got["p50"] == pytest.approx(50.0) and got["p95"] == pytest.approx(95.0)
    assert got["p99"] == pytest.approx(99.0)


async def test_close_forgets_the_stream_and_its_dirty_instances(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        stream = Stream("t1")
        await lith.hub.open(stream, ["board/1", "quiet"])
        await tabs.do(Add())  # board/1 is dirty, and nobody else watches it
        assert lith.hub.dirty
        lith.hub.close(stream)
        assert lith.hub.dirty == set() and lith.hub.instances == {}
        assert stream not in lith.hub.streams and stream.keys == ()
        assert [f.key for f in stream.take()] == ["board/1", "quiet"]  # what it held, hub or not
        assert await tabs.tick() == 0


async def test_counters_count_ticks_renders_and_errors(tmp_path: Path) -> None:
    lith, renders = make_lith(tmp_path)
    broken = {"now": False}

    @lith.view("fragile", topics={"board:1"})
    def fragile(db: Db) -> h.Element:
        if broken["now"]:
            raise RuntimeError("kaput")
        return h.p(id="fragile")[db.scalar(COUNT, {"cid": 1})]

    async with Tabs(lith) as tabs:
        tab = await tabs.open("board/1", "fragile")
        counters = lith.hub.counters
        assert (counters.ticks, counters.renders, counters.frames) == (0, 2, 2)
        broken["now"] = True
        for _ in range(2):
            await tabs.do(Add())
            assert await tabs.tick() == 2
            tab.read()
        assert await tabs.tick() == 0
        assert (counters.ticks, counters.renders, counters.render_errors) == (3, 6, 2)
        assert renders["board/1"] == 3
        assert len(counters.tick_seconds) == 3 and all(0 <= t < 60 for t in counters.tick_seconds)


async def test_a_tab_that_catches_up_gets_the_newest_state_without_a_later_commit(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        stream = Stream("t1")
        await lith.hub.open(stream, ["board/1"])
        assert await next_html(stream) == ['<p id="board-1">0</p>']
        await lith.writer.do(Add())
        deadline = asyncio.get_running_loop().time() + 10
        while not stream.holds("board/1"):  # the timer rendered; the tab has not read it yet
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await lith.writer.do(Add(n=2))  # dirty, but held back for the slow tab
        ticks = lith.hub.counters.ticks
        while lith.hub.counters.ticks == ticks:  # the hub looked, and rendered nothing
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert lith.hub.counters.renders == 2
        assert [f.html for f in stream.take()] == ['<p id="board-1">1</p>']
        assert await next_html(stream) == ['<p id="board-1">3</p>']  # taking woke the hub
        lith.hub.close(stream)


async def test_a_commit_on_a_topic_nobody_watches_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        await tabs.open("board/1")
        with caplog.at_level(logging.ERROR):
            await tabs.do(Note())
        assert caplog.records == [] and lith.hub.dirty == set()
        assert await tabs.tick() == 0


async def test_a_view_failing_its_first_render_does_not_keep_the_others_from_a_tab(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lith, _ = make_lith(tmp_path)

    @lith.view("broken", topics={"board:1"})
    def broken(db: Db) -> h.Element:
        raise RuntimeError("kaput")

    async with Tabs(lith) as tabs:
        tab = await tabs.open("broken", "board/1")  # rendered in this order, in one transaction
        assert tab.html("board/1") == '<p id="board-1">0</p>'
        assert lith.hub.counters.render_errors == 1
        again = await tabs.open("board/1")  # an instance with a frame: offered, not rendered
        assert again.html("board/1") == '<p id="board-1">0</p>'
        assert (lith.hub.counters.renders, lith.hub.counters.frames) == (2, 2)


async def test_the_hub_on_its_own_defaults_and_timer(tmp_path: Path) -> None:
    from fastapi_lith.backends.sqlite.db import SqliteReaders
    from fastapi_lith.engine.feed import LocalFeed
    from fastapi_lith.engine.hub import Hub
    from fastapi_lith.engine.views import Views

    readers = SqliteReaders(tmp_path / "none.db")
    try:
        hub = Hub(Views(), readers)
        assert hub.interval == 0.05 and isinstance(hub.feed, LocalFeed)
    finally:
        readers.close()
    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        assert lith.hub._task is not None and lith.hub._task.get_name() == "lith-hub"
        await lith.hub.stop()
        await lith.hub.stop()  # a second stop finds nothing to do


async def test_a_failing_feed_poll_is_logged_and_the_hub_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fastapi_lith.backends.sqlite.feed import SqliteFeed

    class Flaky(SqliteFeed):
        failures = 1

        def poll(self):  # type: ignore[no-untyped-def]
            if self.failures:
                self.failures -= 1
                raise RuntimeError("feed unreadable")
            return super().poll()

    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text(SCHEMA)
    lith = Lith(tmp_path / "app.db", migrations=tmp_path / "migrations", feed=Flaky(tmp_path / "app.db"))

    @lith.view("board/{board_id}", topics={"board:{board_id}"})
    def board(db: Db, board_id: int) -> h.Element:
        return h.p(id=f"board-{board_id}")[db.scalar(COUNT, {"cid": board_id})]

    async with lith.lifespan():
        stream = Stream("t1")
        subscription = await lith.hub.open(stream, ["board/1"])
        await lith.writer.do(Add(n=4))
        async with asyncio.timeout(10):
            while '<p id="board-1">4</p>' not in [f.html for f in await stream.next()]:
                pass
        subscription.close()
    [record] = [r for r in caplog.records if r.name == "fastapi_lith.hub"]
    assert record.getMessage() == "feed poll failed" and isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]


class FakeServer:
    """Stands in for uvicorn's `Server`: its bound `handle_exit` is the signal handler."""

    def __init__(self) -> None:
        self.should_exit = False

    def handle_exit(self, sig: int, frame: object) -> None:
        self.should_exit = True


async def test_a_stop_signal_ends_the_streams_at_once_and_reaches_the_servers_handler(tmp_path: Path) -> None:
    """uvicorn's handler only sets a flag, and sse-starlette looks at it every 0.5 s: a restart
    held every stream that long. The hub's relay ends them on the signal itself."""
    import signal

    lith, _ = make_lith(tmp_path)
    server = FakeServer()
    before = signal.signal(signal.SIGTERM, server.handle_exit)
    try:
        async with lith.lifespan():
            stream = Stream("t1")
            subscription = await lith.hub.open(stream, ["board/1"])
            handler = signal.getsignal(signal.SIGTERM)
            assert getattr(handler, "__self__", None) is server  # sse-starlette finds the server
            signal.raise_signal(signal.SIGTERM)
            assert server.should_exit  # the server's own handler ran, as before
            for _ in range(200):  # the relay ends the streams on the loop, at its next turn
                if stream.ended:
                    break
                await asyncio.sleep(0.01)
            assert stream.ended
            subscription.close()
        async with lith.lifespan():  # a hub started again does not wrap the relay again
            assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, before)


async def test_a_registry_of_its_own_renders_when_touched_without_a_commit_and_only_while_watched(
    tmp_path: Path,
) -> None:
    lith, _ = make_lith(tmp_path)
    own, renders = Views(), [0]

    @own.register("gauge", topics={"gauge"})
    def gauge(db: Db) -> h.Element:
        renders[0] += 1
        return h.p(id="gauge")[renders[0]]

    async with Tabs(lith):
        hub = lith.hub
        with pytest.raises(ViewError, match="no view matches"):  # the app's registry has no such view
            await hub.open(Stream("t1"), ["gauge"])
        stream = Stream("t1")
        subscription = await hub.open(stream, ["gauge"], views=own)
        assert [f.html for f in await stream.next(10)] == ['<p id="gauge">1</p>']
        hub.touched(["gauge"])
        assert await hub.tick() == 1
        assert [f.html for f in await stream.next(10)] == ['<p id="gauge">2</p>']
        subscription.close()
        hub.touched(["gauge"])  # nobody watches: no instance, nothing to render
        assert await hub.tick() == 0
        assert renders == [2] and hub.instances == {}


async def test_opening_streams_hold_one_reader_at_most_so_a_tick_still_renders(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    release = threading.Event()
    entered = threading.Semaphore(0)

    @lith.view("slow/{tab}", topics={"slow"})
    def slow(db: Db, tab: str) -> h.Element:
        entered.release()
        assert release.wait(30), "the test never released the renders"
        return h.p(id="slow")[tab]

    async with Tabs(lith) as tabs:
        live = await tabs.open("board/1")
        first = asyncio.ensure_future(tabs.open("slow/{tab}"))
        assert await asyncio.to_thread(entered.acquire, True, 30), "the first open never rendered"
        # Without batching the next opens would take the second reader too, and the tick below
        # would wait for them.
        later = [asyncio.ensure_future(tabs.open("slow/{tab}")) for _ in range(20)]
        await tabs.do(Add())
        try:
            assert await asyncio.wait_for(tabs.tick(), 10) == 1
            assert live.html("board/1") == '<p id="board-1">1</p>'
        finally:
            release.set()
        opened = await asyncio.wait_for(asyncio.gather(first, *later), 10)
        assert all(tab.html("slow/{tab}".replace("{tab}", tab.id)) for tab in opened)


async def test_revoke_ends_every_stream_of_its_principal_and_no_other(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        alice = [await tabs.open("board/1", principal="alice") for _ in range(2)]
        bob, nobody = await tabs.open("board/1", principal="bob"), await tabs.open("board/1")
        assert await lith.hub.revoke("alice") == 2
        assert all(tab.stream.ended and tab.stream.revoked for tab in alice)
        assert not bob.stream.ended and not nobody.stream.ended and not bob.stream.revoked


async def test_an_access_rule_is_asked_with_the_principal_and_parameters_before_anything_opens(tmp_path: Path) -> None:
    from fastapi_lith import AccessDenied

    lith, _ = make_lith(tmp_path)
    asked: list[tuple[object, int]] = []

    def mine(db: Db, principal: object, doc_id: int) -> bool:
        asked.append((principal, doc_id))
        return db.scalar("SELECT 1") == 1 and principal == "alice" and doc_id == 1

    @lith.view("doc/{doc_id}", topics={"doc"}, access=mine)
    def doc(db: Db, doc_id: int) -> h.Element:
        return h.p(id=f"doc-{doc_id}")[doc_id]

    @lith.view("tasks/{principal}", topics={"tasks"})
    def tasks(db: Db, principal: str) -> h.Element:
        return h.p(id="tasks")[principal]

    async with Tabs(lith) as tabs:
        alice = await tabs.open("board/1", "doc/1", "tasks/{principal}", principal="alice")
        assert alice.html("doc/1") == '<p id="doc-1">1</p>' and alice.html("tasks/{principal}") == '<p id="tasks">alice</p>'
        assert asked == [("alice", 1)]  # asked for the view with a rule only
        for principal, keys in (("bob", ("board/1", "doc/1")), ("alice", ("doc/2", "board/1"))):
            with pytest.raises(AccessDenied, match=f"^view '{keys[0] if principal == 'alice' else keys[1]}' is not"):
                await tabs.open(*keys, principal=principal)
        assert asked[1:] == [("bob", 1), ("alice", 2)]
        assert lith.hub.streams == {alice.stream}  # a refused stream is not kept


async def test_a_revoke_while_the_access_rules_run_refuses_the_open(tmp_path: Path) -> None:
    from fastapi_lith import AccessDenied
    from tests.support import until

    lith, _ = make_lith(tmp_path)
    entered, release = threading.Event(), threading.Event()

    def slow(db: Db, principal: object) -> bool:
        entered.set()
        return release.wait(10)

    @lith.view("secret", topics={"secret"}, access=slow)
    def secret(db: Db) -> h.Element:
        return h.p(id="secret")["s"]

    async with Tabs(lith) as tabs:
        opening = asyncio.create_task(tabs.open("secret", principal="alice"))

        async def asking() -> bool:
            return entered.is_set()

        await until(asking, timeout=10)
        assert await lith.hub.revoke("alice") == 1  # the opening stream, while its rule runs
        release.set()
        with pytest.raises(AccessDenied, match="^this principal's streams were revoked$"):
            await opening


async def test_renders_and_render_errors_are_counted_by_view(tmp_path: Path) -> None:
    lith, _ = make_lith(tmp_path)
    broken = {"on": False}

    @lith.view("flaky/{n}", topics={"flaky"})
    def flaky(db: Db, n: int) -> h.Element:
        if broken["on"]:
            raise RuntimeError("flaky")
        return h.p(id=f"flaky-{n}")[n]

    async with Tabs(lith) as tabs:
        await tabs.open("board/1", "board/2", "flaky/1", "flaky/2")
        broken["on"] = True
        lith.hub.touched({"flaky"})
        await tabs.tick()
        counters = lith.hub.counters
        assert counters.renders_by_view == {"board/{board_id}": 2, "flaky/{n}": 4}
        assert counters.errors_by_view == {"flaky/{n}": 2}
        assert [pattern for pattern, _ in counters.observed_renders] == ["board/{board_id}"] * 2 + ["flaky/{n}"] * 4
        assert all(0 <= seconds < 60 for _, seconds in counters.observed_renders)
        assert len(counters.observed_ticks) == 1 and counters.observed_ticks[0] >= 0


class Tracer:
    """A frame tracer that keeps what it is told."""

    def __init__(self) -> None:
        self.rendered_: list[tuple[str, int, bool]] = []
        self.taken_: list[list[str]] = []

    def rendered(self, instance: object, started: int, changed: bool) -> None:
        self.rendered_.append((instance.key, started, changed))  # type: ignore[attr-defined]

    def taken(self, keys: object) -> None:
        self.taken_.append(list(keys))  # type: ignore[call-overload]


async def test_a_frame_tracer_is_told_of_each_render_and_each_take(tmp_path: Path) -> None:
    import time

    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        tracer = lith.hub.trace = Tracer()
        before = time.time_ns()
        tab = await tabs.open("board/1")
        await tabs.do(Add())
        await tabs.tick()
        tab.read()
        lith.hub.touched({"board:1"})  # renders again, the same HTML
        await tabs.tick()
        assert [(key, changed) for key, _, changed in tracer.rendered_] == [("board/1", True)] * 2 + [("board/1", False)]
        assert all(before <= started <= time.time_ns() for _, started, _ in tracer.rendered_)
        tab.read()
        assert ["board/1"] in tracer.taken_


async def test_more_opens_at_once_than_one_batch_all_get_their_first_frames(tmp_path: Path) -> None:
    from fastapi_lith.engine.hub import OPEN_BATCH

    lith, renders = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        tabs_ = await asyncio.wait_for(
            asyncio.gather(*(tabs.open(f"board/{n}") for n in range(1, OPEN_BATCH + 40))), 30
        )
        assert all(tab.html(f"board/{n}").startswith(f'<p id="board-{n}">') for n, tab in enumerate(tabs_, 1))
        assert len(renders) == OPEN_BATCH + 39


async def test_a_first_render_whose_read_fails_fails_every_open_of_its_batch(tmp_path: Path) -> None:
    """A read transaction that cannot start (a fault of the database, not of a view) reaches each
    opening stream as its error: none waits forever for a frame; the next open renders again."""
    import sqlite3

    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        lith.hub.readers.BEGIN = "BEGIN NONSENSE"  # type: ignore[misc]
        opened = await asyncio.wait_for(
            asyncio.gather(tabs.open("board/1"), tabs.open("board/2"), return_exceptions=True), 10
        )
        assert [type(result) for result in opened] == [sqlite3.OperationalError] * 2
        del lith.hub.readers.BEGIN
        tab = await asyncio.wait_for(tabs.open("board/1"), 10)
        assert tab.html("board/1") == '<p id="board-1">0</p>'


async def test_a_hub_stopped_and_started_again_serves_its_streams_again(tmp_path: Path) -> None:
    """Stopping ends every stream and refuses those opening meanwhile; the next start serves."""
    lith, _ = make_lith(tmp_path)
    async with Tabs(lith) as tabs:
        first = await tabs.open("board/1")
    assert first.stream.ended
    async with Tabs(lith) as tabs:
        again = await tabs.open("board/1")
        assert not again.stream.ended and again.html("board/1") == '<p id="board-1">0</p>'
