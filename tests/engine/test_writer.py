"""The writer against real SQLite files: order, savepoints, results, load, shutdown, crashes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import Field

from fastapi_lith import Command, FirstAttemptFailed, Lith, SettingError, Tx, Writer, WriterClosed

metadata = sa.MetaData()
log_table = sa.Table(
    "log", metadata, sa.Column("seq", sa.Integer, primary_key=True), sa.Column("value", sa.Text)
)
counter = sa.Table(
    "counter", metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("count", sa.Integer)
)
APPEND = log_table.insert().values(value=sa.bindparam("value"))
ADD = counter.update().where(counter.c.id == 1).values(count=counter.c.count + sa.bindparam("n"))
COUNT = sa.select(counter.c.count).where(counter.c.id == 1)

SCHEMA = """
CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, value TEXT NOT NULL UNIQUE);
CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL CHECK (count >= 0));
INSERT INTO counter VALUES (1, 0);
"""


class Append(Command):
    value: str

    def apply(self, tx: Tx) -> int:
        tx.touch("log")
        return tx.execute(APPEND, {"value": self.value}).lastrowid  # type: ignore[return-value]


class Add(Command):
    n: int = Field(1, ge=-100_000, le=100_000)

    def apply(self, tx: Tx) -> int:
        tx.execute(ADD, {"n": self.n})
        tx.touch("counter")
        return tx.scalar(COUNT)


class Boom(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute(ADD, {"n": 1000})
        tx.touch("boom")
        raise ValueError("boom")


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_init.sql").write_text(SCHEMA)
    return folder


@pytest.fixture
async def writer(tmp_path: Path, migrations: Path):
    w = Writer(tmp_path / "app.db", migrations=migrations)
    await w.start()
    yield w
    await w.close()


def rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


async def test_commands_apply_in_arrival_order(writer: Writer) -> None:
    values = [f"v{i}" for i in range(1000)]
    seqs = await asyncio.gather(*(writer.do(Append(value=v)) for v in values))
    assert seqs == list(range(1, 1001))
    assert [v for (v,) in rows(writer.path, "SELECT value FROM log ORDER BY seq")] == values
    assert writer.batches < 1000  # they were batched, not one transaction each


async def test_failing_command_rolls_back_alone(writer: Writer) -> None:
    cmds: list[Command] = [Add(n=1) for _ in range(300)]
    cmds[150] = Boom()
    cmds[151] = Add(n=-10_000)  # violates the CHECK constraint: an SQLite error, not Python's
    outcomes = await asyncio.gather(*(writer.do(c) for c in cmds), return_exceptions=True)
    assert isinstance(outcomes[150], ValueError) and str(outcomes[150]) == "boom"
    assert isinstance(outcomes[151], sqlite3.IntegrityError)
    good = [o for i, o in enumerate(outcomes) if i not in (150, 151)]
    assert good == list(range(1, 299))  # each command saw every command before it
    assert rows(writer.path, "SELECT count FROM counter") == [(298,)]
    assert writer.failed == 2


async def test_touched_topics_reach_subscribers_only_when_committed(writer: Writer) -> None:
    seen: list[frozenset[str]] = []
    unsubscribe = writer.subscribe(seen.append)
    assert await asyncio.gather(writer.do(Add()), writer.do(Append(value="a"))) == [1, 1]
    assert seen == [frozenset({"counter", "log"})]  # one batch, one call with both topics
    outcomes = await asyncio.gather(writer.do(Append(value="b")), writer.do(Boom()), return_exceptions=True)
    assert outcomes[0] == 2 and isinstance(outcomes[1], ValueError)
    assert seen[1:] == [frozenset({"log"})]  # "boom" rolled back, so it never touched
    with pytest.raises(ValueError):
        await writer.do(Boom())
    assert len(seen) == 2  # a batch that committed nothing touches nothing
    unsubscribe()
    await writer.do(Add())
    assert len(seen) == 2


class TouchAll(Command):
    topics: list[str]
    spread: bool

    def apply(self, tx: Tx) -> int:
        if self.spread:
            tx.touch(*self.topics)
        else:
            tx.touch(self.topics)  # type: ignore[arg-type]
        return tx.execute(ADD, {"n": 1}).rowcount


async def test_a_list_passed_as_one_topic_fails_its_command_alone(writer: Writer) -> None:
    seen: list[frozenset[str]] = []
    writer.subscribe(seen.append)
    wrong, right = await asyncio.gather(
        writer.do(TouchAll(topics=["a", "b"], spread=False)),
        writer.do(TouchAll(topics=["a", "b"], spread=True)),
        return_exceptions=True,
    )
    assert isinstance(wrong, SettingError)
    assert str(wrong) == "tx.touch: a topic is a string, not ['a', 'b'] (unpack a collection: *topics)"
    assert right == 1 and seen == [frozenset({"a", "b"})]  # the batch it shared committed
    assert await writer.do(TouchAll(topics=["c"], spread=True)) == 1  # the writer still serves
    assert rows(writer.path, "SELECT count FROM counter") == [(2,)]


class Unhashable(Command):
    def apply(self, tx: Tx) -> None:
        tx._touched.append(["past tx.touch's check"])  # type: ignore[arg-type]


async def test_a_batch_that_fails_before_its_commit_leaves_no_transaction_open(writer: Writer) -> None:
    with pytest.raises(TypeError, match="unhashable"):
        await writer.do(Unhashable())
    assert await writer.do(Add()) == 1  # not "cannot start a transaction within a transaction"


async def test_results_and_errors_reach_the_right_callers(writer: Writer) -> None:
    async def caller(i: int) -> tuple[int, object]:
        try:
            return i, await writer.do(Append(value=f"dup{i % 50}"))
        except sqlite3.IntegrityError as exc:
            return i, exc

    outcomes = dict(await asyncio.gather(*(caller(i) for i in range(200))))
    for i, outcome in outcomes.items():
        if i < 50:
            assert isinstance(outcome, int)
            assert rows(writer.path, f"SELECT value FROM log WHERE seq = {outcome}") == [(f"dup{i}",)]
        else:
            assert isinstance(outcome, sqlite3.IntegrityError), (i, outcome)


async def test_many_producers_never_see_busy(writer: Writer, tmp_path: Path) -> None:
    errors: list[BaseException] = []

    async def producer(p: int) -> None:
        for i in range(50):
            try:
                await writer.do(Append(value=f"{p}:{i}"))
            except BaseException as exc:  # noqa: BLE001 - any error fails the test
                errors.append(exc)

    # Readers on other connections at the same time: WAL lets them read while the writer writes.
    async def reader() -> None:
        conn = sqlite3.connect(writer.path, timeout=0)
        for _ in range(100):
            conn.execute("SELECT count(*) FROM log").fetchone()
            await asyncio.sleep(0)
        conn.close()

    await asyncio.gather(*(producer(p) for p in range(200)), *(reader() for _ in range(4)))
    assert errors == []
    assert rows(writer.path, "SELECT count(*) FROM log") == [(10_000,)]


async def test_shutdown_commits_every_accepted_command(tmp_path: Path, migrations: Path) -> None:
    writer = Writer(tmp_path / "app.db", migrations=migrations)
    await writer.start()
    futures = [asyncio.ensure_future(writer.do(Add())) for _ in range(5000)]
    await asyncio.sleep(0)  # every do() has queued its command
    await writer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert rows(writer.path, "SELECT count FROM counter") == [(5000,)]
    with pytest.raises(WriterClosed, match="^the writer is not running$"):
        await writer.do(Add())


async def test_cancelled_before_taken_is_dropped(writer: Writer) -> None:
    started, release = threading.Event(), threading.Event()

    class Slow(Command):
        def apply(self, tx: Tx) -> None:
            started.set()
            release.wait(30)  # holds the writer thread: the next commands wait in the queue

    slow = asyncio.ensure_future(writer.do(Slow()))
    assert await asyncio.to_thread(started.wait, 30)
    kept = asyncio.ensure_future(writer.do(Add(n=1)))
    dropped = asyncio.ensure_future(writer.do(Add(n=100)))
    await asyncio.sleep(0)  # both are queued behind the slow command
    assert len(writer._queue) == 2
    dropped.cancel()
    release.set()
    await slow
    assert await kept == 1
    await writer.do(Add(n=0))
    assert rows(writer.path, "SELECT count FROM counter") == [(1,)]


async def test_statement_cache_off_gives_the_same_results(tmp_path: Path, migrations: Path) -> None:
    writer = Writer(tmp_path / "app.db", migrations=migrations, statement_cache=False)
    await writer.start()
    results = [await writer.do(Add(n=2)) for _ in range(5)]
    await writer.close()
    assert results == [2, 4, 6, 8, 10]
    assert len(writer.statements) == 0


async def test_raw_sql_and_row_helpers(writer: Writer) -> None:
    class Raw(Command):
        def apply(self, tx: Tx) -> tuple:
            tx.execute("INSERT INTO log (value) VALUES (:v)", {"v": "raw"})
            tx.executemany(APPEND, [{"value": "a"}, {"value": "b"}])
            one = tx.one("SELECT value FROM log WHERE value = ?", ("raw",))
            first = tx.first(sa.select(log_table.c.value).where(log_table.c.value == "missing"))
            everything = [r["value"] for r in tx.all(sa.select(log_table.c.value).order_by("seq"))]
            with pytest.raises(LookupError, match="^expected one row, got several$"):
                tx.one("SELECT value FROM log")
            with pytest.raises(LookupError, match="^expected one row, got none$"):
                tx.one("SELECT value FROM log WHERE value = ?", ("missing",))
            params = [r["value"] for r in tx.all("SELECT value FROM log WHERE value > :v ORDER BY seq", {"v": "a"})]
            assert params == ["raw", "b"]
            assert tx.executemany("INSERT INTO log (value) VALUES (?)", [("s1",), ("s2",)]) == 2
            assert tx.executemany(APPEND, []) == 0
            gone = log_table.delete().where(log_table.c.value.in_(sa.bindparam("vs", expanding=True)))
            assert tx.executemany(gone, [{"vs": ["s1", "s2"]}]) == 2  # one row, SQL built per row
            assert tx.executemany(gone, [{"vs": ["missing"]}, {"vs": ["a"]}]) == 1
            return one["value"], first, everything

    assert await writer.do(Raw()) == ("raw", None, ["raw", "a", "b"])


# -- crash safety: a real child process, killed with SIGKILL mid-load ------------------------

CHILD = r"""
import asyncio, os, sys
sys.path.insert(0, sys.argv[4])
from test_writer import Append, Writer

async def main(db, migrations, synchronous, ack_path):
    writer = Writer(db, migrations=migrations, synchronous=synchronous)
    await writer.start()
    ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    async def producer(p):
        i = 0
        while True:
            value = f"{p}-{i}"
            await writer.do(Append(value=value))
            os.write(ack, (value + "\n").encode())  # acknowledged: the batch has committed
            i += 1

    await asyncio.gather(*(producer(p) for p in range(50)))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5]))
"""


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_kill_9_never_loses_an_acknowledged_command(tmp_path: Path, migrations: Path, synchronous: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for round_ in range(3):
        db = tmp_path / f"crash{round_}.db"
        acks = tmp_path / f"acks{round_}.txt"
        child = subprocess.Popen(
            [sys.executable, str(script), str(db), str(migrations), synchronous,
             str(Path(__file__).parent), str(acks)],
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not (acks.exists() and acks.stat().st_size > 20_000 * (round_ + 1) // 2):
            assert child.poll() is None, child.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the child acknowledged too few commands to kill it"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        acked = [line for line in acks.read_text().splitlines() if line]
        assert len(acked) > 1000
        stored = {v for (v,) in rows(db, "SELECT value FROM log")}
        missing = [v for v in acked if v not in stored]
        assert missing == [], f"{len(missing)} acknowledged commands lost"
        assert rows(db, "PRAGMA integrity_check") == [("ok",)]


def test_a_writer_starts_again_on_another_event_loop(tmp_path: Path, migrations: Path) -> None:
    writer = Writer(tmp_path / "app.db", migrations=migrations)

    async def session() -> int:
        await writer.start()
        try:
            return await writer.do(Add())
        finally:
            await writer.close()

    assert asyncio.run(session()) == 1  # as a module-level Lith does across tests
    assert asyncio.run(asyncio.wait_for(session(), 5)) == 2


# -- cancelling the writer task: each caller learns the truth --------------------------------


class Gated(Command):
    """Appends `value`; the one named `gate` holds the writer thread until released."""

    value: str
    gate: str = ""

    def apply(self, tx: Tx) -> str:
        tx.execute(APPEND, {"value": self.value})
        if self.value == self.gate:
            GATE.reached.set()
            assert GATE.release.wait(10)
        return self.value


class _Gate:
    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()


GATE = _Gate()


async def wait_for(event: threading.Event) -> None:
    deadline = time.monotonic() + 10
    while not event.is_set():
        assert time.monotonic() < deadline, "the writer thread never got there"
        await asyncio.sleep(0.001)


# Where the writer task is cancelled: waiting for commands, at BEGIN, inside the first or the
# last command of a batch, at COMMIT, and after COMMIT before the outcome reaches the loop.
POINTS = ["idle", "begin", "first command", "last command", "commit", "after commit"]


@pytest.mark.parametrize("point", POINTS)
async def test_a_cancelled_writer_task_tells_each_caller_the_truth(
    tmp_path: Path, migrations: Path, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    global GATE
    GATE = _Gate()
    writer = Writer(tmp_path / "app.db", migrations=migrations)
    await writer.start()
    task = writer._task
    assert task is not None and writer.store._conn is not None
    if point == "idle":
        task.cancel()
        await asyncio.wait((task,))
        with pytest.raises(WriterClosed):  # before: queued forever, nobody left to take it
            await asyncio.wait_for(writer.do(Append(value="late")), 5)
        await writer.close()
        assert rows(writer.path, "SELECT count(*) FROM log") == [(0,)]
        return

    sql = {"begin": "BEGIN IMMEDIATE", "commit": "COMMIT", "after commit": "COMMIT"}.get(point)
    blocks = point != "after commit"

    def trace(statement: str) -> None:
        if statement == sql:
            GATE.reached.set()
            if blocks:
                assert GATE.release.wait(10)

    writer.store._conn.set_trace_callback(trace)
    gate = {"first command": "v0", "last command": "v4"}.get(point, "")
    batch = [asyncio.ensure_future(writer.do(Gated(value=f"v{i}", gate=gate))) for i in range(5)]
    await wait_for(GATE.reached)  # the batch is on the writer thread
    later = [asyncio.ensure_future(writer.do(Gated(value=f"w{i}"))) for i in range(3)]
    await asyncio.sleep(0)
    if point == "after commit":
        # Hold the loop until the COMMIT is visible to another connection, then cancel: the
        # outcome is committed but has not reached the loop yet.
        deadline = time.monotonic() + 10
        while rows(writer.path, "SELECT count(*) FROM log") != [(5,)]:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        task.cancel()
    else:
        task.cancel()
        await asyncio.sleep(0.01)
        GATE.release.set()
    outcomes = await asyncio.gather(*batch, *later, return_exceptions=True)
    writer.store._conn.set_trace_callback(None)
    assert not any(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert outcomes[:5] == ["v0", "v1", "v2", "v3", "v4"]  # taken: committed, and told so
    assert all(isinstance(o, WriterClosed) for o in outcomes[5:]), outcomes[5:]  # never taken
    stored = sorted(v for (v,) in rows(writer.path, "SELECT value FROM log"))
    assert stored == ["v0", "v1", "v2", "v3", "v4"]
    assert task.done()  # the cancel stopped the task, it did not swallow it
    with pytest.raises(WriterClosed):
        await writer.do(Append(value="late"))
    await writer.close()
    assert "failed to commit" not in caplog.text


# -- idempotency keys: a repeat returns the first outcome, applied once -----------------------


class Keyed(Command):
    """A page's action: `tab` and `op` make its key."""

    tab: str
    op: int
    value: str

    def apply(self, tx: Tx) -> int:
        tx.touch("log")
        return tx.execute(APPEND, {"value": self.value}).lastrowid  # type: ignore[return-value]


class Forget(Command):
    value: str

    def apply(self, tx: Tx) -> None:
        tx.execute("DELETE FROM log WHERE value = ?", (self.value,))


def log_values(path: Path) -> list[str]:
    return [v for (v,) in rows(path, "SELECT value FROM log ORDER BY seq")]


async def test_a_repeated_command_returns_its_first_outcome_without_applying(writer: Writer) -> None:
    first = await writer.do(Keyed(tab="t1", op=1, value="a"))
    assert await writer.do(Keyed(tab="t1", op=1, value="a")) == first
    assert log_values(writer.path) == ["a"]
    assert writer.repeats == 1

    # Repeats in one batch, as when a retry arrives while the first is still queued.
    seqs = await asyncio.gather(*(writer.do(Keyed(tab="t1", op=2, value="b")) for _ in range(5)))
    assert len(set(seqs)) == 1 and log_values(writer.path) == ["a", "b"]

    # A failure is an outcome too: the repeat raises it again, by name (its class is not rebuilt
    # from the database), and applies nothing, even once the cause is gone.
    with pytest.raises(sqlite3.IntegrityError):
        await writer.do(Keyed(tab="t1", op=3, value="a"))
    await writer.do(Forget(value="a"))
    with pytest.raises(FirstAttemptFailed, match="failed with sqlite3.IntegrityError: UNIQUE constraint failed"):
        await writer.do(Keyed(tab="t1", op=3, value="a"))
    assert log_values(writer.path) == ["b"]

    # Other ops, tabs and command types are other keys; op 0 (a page's default) has none.
    await writer.do(Keyed(tab="t1", op=4, value="c"))
    await writer.do(Keyed(tab="t2", op=4, value="d"))
    for _ in range(2):
        await writer.do(Keyed(tab="t1", op=0, value="e"))
        await writer.do(Forget(value="e"))
    assert log_values(writer.path) == ["b", "c", "d"]
    assert writer.repeats == 1 + 4 + 1


async def test_a_batch_whose_outcome_cannot_be_recorded_fails_whole_and_leaves_no_transaction_open(
    writer: Writer,
) -> None:
    """The outcome's row is written outside the command's savepoint: its failure ends the batch,
    which must roll back for the next one to begin."""
    with sqlite3.connect(writer.path) as conn:  # SQLite refuses the outcome's row
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON lith_outcome BEGIN SELECT RAISE(ABORT, 'no outcome'); END")
    with pytest.raises(sqlite3.IntegrityError, match="^no outcome$"):
        await writer.do(Keyed(tab="t1", op=1, value="a"))
    with sqlite3.connect(writer.path) as conn:
        conn.execute("DROP TRIGGER refuse")
    assert await writer.do(Add()) == 1  # not "cannot start a transaction within a transaction"
    assert log_values(writer.path) == []


async def test_outcomes_survive_a_restart_and_expire_after_the_window(tmp_path: Path, migrations: Path) -> None:
    path = tmp_path / "app.db"
    writer = Writer(path, migrations=migrations, repeat_window=3600)
    await writer.start()
    await writer.do(Keyed(tab="t1", op=1, value="a"))
    await writer.close()

    writer = Writer(path, migrations=migrations, repeat_window=3600)
    await writer.start()
    await writer.do(Keyed(tab="t1", op=1, value="a"))  # a retry after a restart: not applied
    assert log_values(path) == ["a"]
    await writer.do(Forget(value="a"))
    with sqlite3.connect(path) as conn:  # the first outcome is older than the window now
        conn.execute("UPDATE lith_outcome SET at = at - 7200")
    await writer.do(Keyed(tab="t1", op=1, value="a"))
    assert log_values(path) == ["a"]
    await writer.close()

    off = Writer(path, migrations=migrations, repeat_window=0)  # 0: no keys at all
    await off.start()
    await off.do(Forget(value="a"))
    await off.do(Keyed(tab="t1", op=1, value="a"))
    assert log_values(path) == ["a"]
    await off.close()


async def test_old_outcomes_are_pruned_at_start(tmp_path: Path, migrations: Path) -> None:
    path = tmp_path / "app.db"
    writer = Writer(path, migrations=migrations)
    await writer.start()
    for op in range(1, 4):
        await writer.do(Keyed(tab="t1", op=op, value=f"v{op}"))
    await writer.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE lith_outcome SET at = at - 2 * 3600 WHERE key LIKE '%:1'")
    await writer.start()
    await writer.close()
    assert rows(path, "SELECT count(*) FROM lith_outcome") == [(2,)]


async def test_a_running_writer_forgets_outcomes_past_the_window(tmp_path: Path, migrations: Path) -> None:
    from tests.support import until

    writer = Writer(tmp_path / "app.db", migrations=migrations, repeat_window=0.2)  # prunes every 0.05 s
    await writer.start()
    try:
        await writer.do(Keyed(tab="t1", op=1, value="a"))
        assert rows(writer.path, "SELECT count(*) FROM lith_outcome") == [(1,)]

        async def forgotten() -> bool:
            await writer.do(Add())  # a later batch, unkeyed, does the forgetting
            return rows(writer.path, "SELECT count(*) FROM lith_outcome") == [(0,)]

        await until(forgotten, timeout=10)
    finally:
        await writer.close()


async def test_a_result_not_json_of_its_type_is_applied_once_and_its_repeat_says_so(writer: Writer) -> None:
    from fastapi_lith import OutcomeLost

    class Rowful(Command):
        tab: str
        op: int

        def apply(self, tx: Tx) -> sqlite3.Row:
            tx.execute(APPEND, {"value": f"row{self.op}"})
            return tx.one("SELECT value FROM log WHERE value = ?", (f"row{self.op}",))

    assert (await writer.do(Rowful(tab="t", op=1)))["value"] == "row1"
    with pytest.raises(OutcomeLost, match="applied once"):
        await writer.do(Rowful(tab="t", op=1))
    assert log_values(writer.path) == ["row1"]


# -- settings and integers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"synchronous": "FULLL"}, "synchronous must be one of 'OFF', 'NORMAL', 'FULL', 'EXTRA', not 'FULLL'"),
        ({"batch_size": 0}, "batch_size must be an integer at least 1, not 0"),
        ({"batch_size": 2.5}, "batch_size must be an integer, not 2.5"),
        ({"statement_cache": "no"}, "statement_cache must be True or False, not 'no'"),
        ({"repeat_window": -1}, "repeat_window must be a number at least 0, not -1"),
        ({"cached_statements": -1}, "cached_statements must be an integer at least 0, not -1"),
        ({"cached_statements": 1.5}, "cached_statements must be an integer, not 1.5"),
    ],
)
def test_writer_settings_are_checked_when_built(tmp_path: Path, kwargs: dict, message: str) -> None:
    from fastapi_lith import LithError

    with pytest.raises(ValueError, match=re.escape(message)) as info:
        Writer(tmp_path / "app.db", **kwargs)
    assert isinstance(info.value, LithError)
    assert Writer(tmp_path / "app.db", synchronous="full").synchronous == "FULL"
    assert Writer(tmp_path / "app.db", cached_statements=0).statements.size == 0


def test_integers_sqlite_cannot_store_fail_validation() -> None:
    from pydantic import BaseModel, ValidationError

    class Row(BaseModel):
        n: int

    class Many(Command):
        n: int = 0
        rows: list[Row] = []

    for bad in ({"n": 2**63}, {"n": -(2**63) - 1}, {"rows": [{"n": 1}, {"n": 2**64}]}):
        with pytest.raises(ValidationError, match="SQLite's range") as info:
            Many(**bad)
        assert info.value.errors()[0]["type"] == "sqlite_int"
    assert Many(n=2**63 - 1, rows=[{"n": -(2**63)}]).n == 2**63 - 1


async def test_a_request_key_numbers_its_commands_from_1(writer: Writer) -> None:
    from fastapi_lith.web.dependency import KeyedWriter

    keyed = KeyedWriter(writer, "k")
    assert keyed.path == writer.path  # the rest of the writer, as it is
    await keyed.do(Append(value="a"))
    await keyed.do(Append(value="b"))
    assert rows(writer.path, "SELECT key FROM lith_outcome ORDER BY rowid") == [("header:k:1",), ("header:k:2",)]


async def test_an_idempotency_key_header_keys_the_commands_of_a_request_in_order(writer: Writer) -> None:
    from fastapi_lith.web.dependency import KeyedWriter

    async def route(key: str, values: list[str]) -> list[int]:
        keyed = KeyedWriter(writer, key)  # what the writer dependency hands a request with the header
        return [await keyed.do(Append(value=v)) for v in values]

    first = await asyncio.create_task(route("req-1", ["a", "b"]))
    again = await asyncio.create_task(route("req-1", ["a", "b"]))  # the client's retry
    assert again == first and log_values(writer.path) == ["a", "b"]
    await asyncio.create_task(route("req-2", ["c"]))
    assert await writer.do(Append(value="d")) == 4  # outside a request: no key
    assert log_values(writer.path) == ["a", "b", "c", "d"]
# -- subscribers, batch bounds, failures at COMMIT and transactions SQLite ends ---------------


async def test_a_raising_subscriber_neither_ends_the_writer_nor_starves_the_others(
    writer: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[frozenset[str]] = []

    def broken(topics: frozenset[str]) -> None:
        raise RuntimeError("subscriber bug")

    writer.subscribe(broken)
    writer.subscribe(seen.append)
    assert await asyncio.wait_for(writer.do(Add()), 10) == 1
    assert await asyncio.wait_for(writer.do(Append(value="x")), 10) == 1  # the writer goes on
    assert seen == [frozenset({"counter"}), frozenset({"log"})]
    assert "subscriber bug" in caplog.text


async def test_unsubscribe_stops_delivery(writer: Writer) -> None:
    kept: list[frozenset[str]] = []
    dropped: list[frozenset[str]] = []
    writer.subscribe(kept.append)
    unsubscribe = writer.subscribe(dropped.append)
    await writer.do(Add())
    unsubscribe()
    await writer.do(Append(value="after"))
    assert dropped == [frozenset({"counter"})]
    assert kept == [frozenset({"counter"}), frozenset({"log"})]


class Mark(Command):
    """Records which transaction it ran in: one `Tx` per transaction."""

    value: str

    def apply(self, tx: Tx) -> None:
        TRANSACTIONS.append(tx)
        tx.execute(APPEND, {"value": self.value})


TRANSACTIONS: list[Tx] = []


async def test_batch_size_bounds_every_transaction(tmp_path: Path, migrations: Path) -> None:
    writer = Writer(tmp_path / "app.db", migrations=migrations, batch_size=7)
    await writer.start()
    TRANSACTIONS.clear()
    try:
        await asyncio.gather(*(writer.do(Mark(value=f"m{i}")) for i in range(50)))
    finally:
        await writer.close()
    sizes = [sum(1 for t in TRANSACTIONS if t is tx) for tx in dict.fromkeys(TRANSACTIONS)]
    assert sum(sizes) == 50 and max(sizes) <= 7, sizes
    assert writer.batches == len(sizes) >= 8
    assert len(rows(writer.path, "SELECT value FROM log")) == 50


DEFERRED = """
CREATE TABLE parent (id INTEGER PRIMARY KEY);
CREATE TABLE child (id INTEGER PRIMARY KEY,
                    parent INTEGER NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE doom (id INTEGER PRIMARY KEY);
CREATE TRIGGER doom_ends_the_transaction BEFORE INSERT ON doom
BEGIN SELECT RAISE(ROLLBACK, 'doomed'); END;
"""


class Orphan(Command):
    """A child whose parent does not exist: fine until the deferred check at COMMIT."""

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO child (parent) VALUES (999)")


class Doom(Command):
    """An error that makes SQLite roll back the whole transaction, not just the savepoint."""

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO doom DEFAULT VALUES")


@pytest.fixture
async def fk_writer(tmp_path: Path, migrations: Path):
    (migrations / "0002_deferred.sql").write_text(DEFERRED)
    w = Writer(tmp_path / "app.db", migrations=migrations)
    await w.start()
    yield w
    await w.close()


async def test_a_failure_at_commit_fails_every_command_of_the_batch(fk_writer: Writer) -> None:
    cmds: list[Command] = [Add(), Append(value="a"), Orphan(), Add()]
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(fk_writer.do(c) for c in cmds), return_exceptions=True), 10
    )
    for outcome in outcomes:  # one batch, one COMMIT: nothing landed, each caller hears why
        assert isinstance(outcome, sqlite3.IntegrityError), outcomes
        assert "FOREIGN KEY" in str(outcome)
    assert rows(fk_writer.path, "SELECT count FROM counter") == [(0,)]
    assert rows(fk_writer.path, "SELECT count(*) FROM log") == [(0,)]
    assert rows(fk_writer.path, "SELECT count(*) FROM child") == [(0,)]
    assert fk_writer.failed == 4
    assert await asyncio.wait_for(fk_writer.do(Add()), 10) == 1  # the next batch starts clean


async def test_commands_run_again_when_sqlite_ends_the_transaction(fk_writer: Writer) -> None:
    cmds: list[Command] = [Add(), Append(value="a"), Doom(), Add(), Add()]
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(fk_writer.do(c) for c in cmds), return_exceptions=True), 10
    )
    assert isinstance(outcomes[2], sqlite3.IntegrityError) and "doomed" in str(outcomes[2])
    assert [outcomes[i] for i in (0, 1, 3, 4)] == [1, 1, 2, 3]  # each ran once, in order
    assert rows(fk_writer.path, "SELECT count FROM counter") == [(3,)]
    assert rows(fk_writer.path, "SELECT value FROM log") == [("a",)]
    assert rows(fk_writer.path, "SELECT count(*) FROM doom") == [(0,)]
    assert fk_writer.failed == 1


def append_app(writer: object) -> Any:
    """A FastAPI app with one command route, `POST /append`, taking `writer` as its dependency."""
    from fastapi import Depends, FastAPI

    app = FastAPI()

    @app.post("/append")
    async def append(cmd: Append, w: Writer = Depends(writer)) -> int:
        return await w.do(cmd)

    return app


# -- the dependency's checks in process (the same cases run over HTTP in app/test_lith.py) -----


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}, 200),
        ({"Datastar-Request": "true", "Origin": "http://app.test"}, 200),
        ({"Sec-Fetch-Site": "same-origin"}, 403),
        ({"Datastar-Request": "false", "Sec-Fetch-Site": "same-origin"}, 403),
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "none"}, 403),
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "cross-site", "Origin": "http://app.test"}, 403),
        ({"Datastar-Request": "true"}, 403),
        ({"Datastar-Request": "true", "Origin": "null"}, 403),
        ({"Datastar-Request": "true", "Origin": "http://app.test.evil.example"}, 403),
        ({"Datastar-Request": "true", "Origin": "http://evil.example/app.test"}, 403),
        ({"Datastar-Request": "true", "Origin": "https://app.test"}, 403),
        ({"Datastar-Request": "true", "Origin": "app.test"}, 403),
    ],
)
async def test_the_writer_dependency_refuses_what_is_not_same_origin_datastar(
    writer: Writer, headers: dict[str, str], status: int
) -> None:
    import httpx

    from fastapi_lith.web.dependency import WriterDependency

    transport = httpx.ASGITransport(app=append_app(WriterDependency(writer)))
    async with httpx.AsyncClient(transport=transport, base_url="http://app.test") as client:
        response = await client.post("/append", json={"value": "v"}, headers=headers)
    assert response.status_code == status, response.text
    if status == 403:
        detail = response.json()["detail"]
        site, origin = headers.get("Sec-Fetch-Site"), headers.get("Origin")
        if headers.get("Datastar-Request") != "true":
            assert detail == "command requests must come from Datastar (Datastar-Request: true)"
        elif site is not None:
            assert detail == f"cross-site request refused (Sec-Fetch-Site: {site})"
        elif origin is not None:
            assert detail == f"cross-site request refused (Origin {origin} is not http://app.test)"
        else:
            assert detail == "cross-site request refused (no Sec-Fetch-Site or Origin header)"
        assert "refused" in detail or "Datastar-Request" in detail
        if "Sec-Fetch-Site" in headers and headers.get("Datastar-Request") == "true":
            assert headers["Sec-Fetch-Site"] in detail  # the refusal names what it saw
        elif "Origin" in headers:
            assert headers["Origin"] in detail and "http://app.test" in detail
    assert log_values(writer.path) == (["v"] if status == 200 else [])


async def test_the_writer_dependency_refuses_bodies_over_max_body(tmp_path: Path, migrations: Path) -> None:
    import httpx

    from fastapi_lith import Lith

    lith = Lith(tmp_path / "app.db", migrations=migrations, max_body=100, same_origin_only=False)
    app = append_app(lith.writer)
    lith.install(app)
    async with (
        lith.lifespan(app, ticks=False),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app.test") as client,
    ):
        json = {"Content-Type": "application/json"}
        fits = await client.post("/append", content=b'{"value": "%s"}' % (b"a" * 87), headers=json)  # 100 bytes
        over = await client.post("/append", content=b'{"value": "%s"}' % (b"b" * 88), headers=json)
    assert fits.status_code == 200, fits.text
    assert over.status_code == 413 and "100 bytes" in over.text
    assert [v for (v,) in rows(lith.path, "SELECT value FROM log")] == ["a" * 87]


def test_a_command_without_apply_names_itself() -> None:
    class Forgot(Command):
        pass

    with pytest.raises(NotImplementedError, match=r"Forgot\.apply\(tx\)"):
        Forgot().apply(None)  # type: ignore[arg-type]


# -- what an operator reads: defaults, threads, counters, logs --------------------------------


async def test_a_writer_built_without_settings_uses_the_documented_defaults(tmp_path: Path, migrations: Path) -> None:
    import gc

    w = Writer(tmp_path / "app.db", migrations=migrations)
    assert (w.batch_size, w.repeat_window, w.synchronous) == (512, 3600.0, "NORMAL")
    assert Lith(tmp_path / "app.db").writer.same_origin_only is True
    assert (w.statements.enabled, w.statements.size) == (True, 512)
    assert Writer(tmp_path / "app.db", cached_statements=7).statements.size == 7
    assert w.commit_seconds.maxlen == 100_000  # a long-running app keeps a bounded record
    with pytest.raises(WriterClosed, match="^the writer is not running$"):
        await w.do(Add())  # before start: refused, not queued
    await w.close()  # before start: nothing to close
    await w.start()
    try:
        pragmas = await w._thread.run(  # type: ignore[union-attr]
            lambda: [w.store._conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("synchronous", "wal_autocheckpoint")]  # type: ignore[union-attr]
        )
        assert pragmas == [1, 1000]  # NORMAL
        # One thread owns the connection, and both it and the task say what they are in a
        # profile or a traceback.
        [thread] = [t for t in threading.enumerate() if t.name.startswith("lith-writer")]
        assert thread.name == "lith-writer-0" and thread.daemon
        assert w._task is not None and w._task.get_name() == "lith-writer"
        assert gc.get_freeze_count() > 0  # start-up's long-lived objects are out of the collector's way
    finally:
        await w.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("lith-writer")]
    full = Writer(tmp_path / "app.db", migrations=migrations, synchronous="FULL")
    await full.start()
    try:
        assert await full._thread.run(lambda: full.store._conn.execute("PRAGMA synchronous").fetchone()[0]) == 2  # type: ignore[union-attr]
    finally:
        await full.close()


async def test_the_writer_uses_its_statement_cache(writer: Writer) -> None:
    for _ in range(3):
        await writer.do(Add())
    assert writer.statements.misses == 2  # ADD and COUNT, each compiled once for every command


async def test_counters_add_up_across_batches(fk_writer: Writer) -> None:
    w = fk_writer
    await w.do(Add())
    await w.do(Append(value="a"))
    with pytest.raises(ValueError):
        await w.do(Boom())
    assert (w.commands, w.batches, w.failed) == (3, 3, 1)
    outcomes = await asyncio.gather(w.do(Add()), w.do(Orphan()), return_exceptions=True)
    assert all(isinstance(o, sqlite3.IntegrityError) for o in outcomes)
    assert (w.commands, w.batches, w.failed) == (3, 3, 3)  # a batch that failed at COMMIT is not counted
    assert len(w.commit_seconds) == 3 and all(0 <= s < 60 for s in w.commit_seconds)


async def test_the_metrics_counters_count_failed_batches_lost_commands_and_busy_time(fk_writer: Writer) -> None:
    w = fk_writer
    for _ in range(3):
        await w.do(Add())
    assert list(w.observed) == [(1, seconds) for seconds in w.commit_seconds]  # (batch size, seconds)
    assert w.busy_seconds == pytest.approx(sum(w.commit_seconds)) and w.busy_seconds > 0
    with pytest.raises(sqlite3.IntegrityError):
        await w.do(Orphan())
    assert (w.failed_batches, w.lost) == (1, 1)
    outcomes = await asyncio.gather(w.do(Add()), w.do(Orphan()), return_exceptions=True)
    assert all(isinstance(o, sqlite3.IntegrityError) for o in outcomes)  # one batch, one failed COMMIT
    assert (w.failed_batches, w.lost, w.batches) == (2, 3, 3)
    assert w.busy_seconds > sum(w.commit_seconds)  # a failed batch's time counts too


async def test_repeats_answered_with_an_error_are_counted_apart(writer: Writer) -> None:
    with pytest.raises(ValueError, match="^boom$"):
        await writer.do(Boom(), key="e")
    assert await writer.do(Add(), key="ok") == 1
    assert await writer.do(Add(), key="ok") == 1
    assert (writer.repeats, writer.repeated_errors) == (1, 0)
    with pytest.raises(FirstAttemptFailed):
        await writer.do(Boom(), key="e")
    assert (writer.repeats, writer.repeated_errors) == (2, 1)
    both = await asyncio.gather(writer.do(Boom(), key="e"), writer.do(Boom(), key="e"), return_exceptions=True)
    assert all(isinstance(o, FirstAttemptFailed) for o in both)  # two repeats in one batch
    assert (writer.repeats, writer.repeated_errors) == (4, 3)


async def test_probe_says_why_the_file_takes_no_write(writer: Writer) -> None:
    assert await writer.probe() is None
    with sqlite3.connect(writer.path) as conn:  # a write the file refuses, as a full disk would
        conn.execute("CREATE TRIGGER no_room BEFORE INSERT ON lith_tab BEGIN SELECT RAISE(ABORT, 'no room'); END")
    assert await writer.probe() == "no room"
    with sqlite3.connect(writer.path) as conn:  # an error without a message: its type says it
        conn.execute("DROP TRIGGER no_room")
        conn.execute("CREATE TRIGGER no_room BEFORE INSERT ON lith_tab BEGIN SELECT RAISE(ABORT, ''); END")
    assert await writer.probe() == "IntegrityError"
    assert rows(writer.path, "SELECT count(*) FROM lith_tab") == [(0,)]


async def test_a_tracer_sees_each_batch_and_a_broken_one_is_logged(
    writer: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi_lith.engine.store import Batch
    from fastapi_lith.engine.writer import TracedBatch

    seen: list[TracedBatch] = []
    writer.trace = seen.append
    before = time.time_ns()
    assert await writer.do(Add(), key="k") == 1
    [traced] = seen
    assert traced.cmds == [Add()] and traced.keys == ["k"]
    [origin] = traced.origins
    assert origin is not None and before <= origin[0] <= traced.taken <= traced.committed <= time.time_ns()
    assert isinstance(traced.outcome, Batch) and traced.outcome.results == [1]

    def broken(batch: TracedBatch) -> None:
        raise RuntimeError("tracer bug")

    writer.trace = broken
    with caplog.at_level("ERROR", logger="fastapi_lith.writer"):
        assert await writer.do(Add()) == 2  # the writer goes on
    [record] = [r for r in caplog.records if r.exc_info]
    assert record.getMessage() == f"batch tracer {broken!r} failed" and "tracer bug" in str(record.exc_info[1])
    writer.trace = None
    assert await writer.do(Add()) == 3


async def test_migrating_is_logged_once(tmp_path: Path, migrations: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="fastapi_lith.writer")
    for _ in range(2):
        w = Writer(tmp_path / "app.db", migrations=migrations)
        await w.start()
        await w.close()
    assert [r.getMessage() for r in caplog.records] == ["app.db: migrated from version 0 to 1"]


async def test_closing_closes_the_file_and_may_be_repeated(writer: Writer, caplog: pytest.LogCaptureFixture) -> None:
    await writer.do(Add())
    assert Path(f"{writer.path}-wal").exists()
    await writer.close()
    await writer.close()
    assert not Path(f"{writer.path}-wal").exists()  # the last connection to close removes the WAL
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_closing_while_another_process_holds_the_file_still_closes(
    writer: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    """The close's `PRAGMA optimize` is a hint: another process writing (a second worker's
    batch, its own close) may hold the file, and the writer still closes, promptly and clean,
    saying what it skipped."""
    await writer.do(Add())
    other = sqlite3.connect(writer.path, isolation_level=None)
    caplog.set_level("INFO", logger="fastapi_lith.writer")
    try:
        other.execute("BEGIN EXCLUSIVE")
        await asyncio.wait_for(writer.close(), 3)  # under the busy timeout a busy file waits out
    finally:
        other.close()
    assert rows(writer.path, "SELECT count(*) FROM counter") == [(1,)]
    assert caplog.messages == [f"{writer.path}: PRAGMA optimize skipped at close: database is locked"]


async def test_closing_a_writer_whose_task_failed_logs_why(
    tmp_path: Path, migrations: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Writer):
        async def _run(self) -> None:
            raise RuntimeError("a bug in the writer task")

    w = Broken(tmp_path / "app.db", migrations=migrations)
    await w.start()
    with pytest.raises(WriterClosed, match="^the writer stopped before taking the command$"):
        await w.do(Add())  # queued before the task ran: it is told, not left waiting
    with pytest.raises(WriterClosed, match="^the writer is not running$"):
        await w.do(Add())
    await w.close()
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "the writer task failed"
    assert isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]


async def test_an_app_table_named_like_the_librarys_stops_start_with_sqlites_reason(tmp_path: Path, migrations: Path) -> None:
    (migrations / "0002_clash.sql").write_text("CREATE TABLE lith_outcome (id INTEGER PRIMARY KEY);")
    w = Writer(tmp_path / "app.db", migrations=migrations)
    with pytest.raises(sqlite3.OperationalError, match="no such column: at"):
        await w.start()
    assert not [t for t in threading.enumerate() if t.name.startswith("lith-writer")]


async def test_a_commit_failure_and_a_broken_subscriber_are_logged_with_their_traceback(
    fk_writer: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(topics: frozenset[str]) -> None:
        raise RuntimeError("subscriber bug")

    fk_writer.subscribe(broken)
    await fk_writer.do(Add())
    await asyncio.gather(fk_writer.do(Add()), fk_writer.do(Orphan()), return_exceptions=True)
    messages = [(r.getMessage(), type(r.exc_info[1]).__name__) for r in caplog.records if r.exc_info]
    assert messages == [
        (f"commit subscriber {broken!r} failed", "RuntimeError"),
        ("batch of 2 commands failed to commit", "IntegrityError"),
    ]


# -- the queue: cancelled callers, keys off ---------------------------------------------------


async def test_a_batch_of_only_cancelled_commands_leaves_the_writer_running(writer: Writer) -> None:
    started, release = threading.Event(), threading.Event()

    class Slow(Command):
        def apply(self, tx: Tx) -> None:
            started.set()
            release.wait(30)

    slow = asyncio.ensure_future(writer.do(Slow()))
    assert await asyncio.to_thread(started.wait, 30)
    dropped = [asyncio.ensure_future(writer.do(Add(n=100))) for _ in range(2)]
    await asyncio.sleep(0)
    for fut in dropped:
        fut.cancel()
    release.set()
    await slow
    assert await asyncio.wait_for(writer.do(Add(n=1)), 10) == 1
    assert rows(writer.path, "SELECT count FROM counter") == [(1,)]


async def test_a_caller_cancelled_mid_batch_does_not_hold_up_the_others(writer: Writer) -> None:
    global GATE
    GATE = _Gate()
    first, middle, last = (asyncio.ensure_future(writer.do(Gated(value=v, gate="c"))) for v in "abc")
    await wait_for(GATE.reached)  # all three are on the writer thread, in one batch
    middle.cancel()
    GATE.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, last), 10) == ["a", "c"]
    assert sorted(v for (v,) in rows(writer.path, "SELECT value FROM log")) == ["a", "b", "c"]  # taken: applied


async def test_a_zero_repeat_window_turns_keys_off(tmp_path: Path, migrations: Path) -> None:
    w = Writer(tmp_path / "app.db", migrations=migrations, repeat_window=0)
    await w.start()
    try:
        assert await w.do(Keyed(tab="t", op=1, value="x")) == 1
        assert await w.do(Keyed(tab="t", op=1, value="y")) == 2  # applied again: nobody remembers
    finally:
        await w.close()
    assert rows(w.path, "SELECT count(*) FROM lith_outcome") == [(0,)]


async def test_tab_outcomes_outlive_a_restart(tmp_path: Path, migrations: Path) -> None:
    from fastapi_lith import TabCommand

    class Save(TabCommand):
        def apply(self, tx: Tx) -> None:
            self.say("saved")

    w = Writer(tmp_path / "app.db", migrations=migrations)
    await w.start()
    await w.do(Save(tab="tab-aaaaaaaa", op=1))
    await w.close()
    await w.start()  # which prunes what is older than a week
    await w.close()
    assert rows(w.path, "SELECT tab, op, message FROM lith_tab") == [("tab-aaaaaaaa", 1, "saved")]


# -- the dependency: idempotency keys and errors answered as HTML ------------------------------


@pytest.fixture
def command_app(writer: Writer):
    import httpx

    from fastapi_lith.web.dependency import WriterDependency

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=append_app(WriterDependency(writer))), base_url="http://app.test")


SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


async def test_an_idempotency_key_header_applies_a_request_once(writer: Writer, command_app) -> None:
    async with command_app as client:
        headers = {**SAME_ORIGIN, "Idempotency-Key": "req-1"}
        first = await client.post("/append", json={"value": "a"}, headers=headers)
        again = await client.post("/append", json={"value": "a"}, headers=headers)
        other = await client.post("/append", json={"value": "b"}, headers={**SAME_ORIGIN, "Idempotency-Key": "req-2"})
    assert (first.status_code, first.json(), again.status_code, again.json()) == (200, 1, 200, 1)
    assert other.json() == 2 and log_values(writer.path) == ["a", "b"]


@pytest.mark.parametrize("key", ["", "two words", "tab\tkey", "k" * 201])
async def test_a_malformed_idempotency_key_is_refused(writer: Writer, command_app, key: str) -> None:
    async with command_app as client:
        response = await client.post("/append", json={"value": "a"}, headers={**SAME_ORIGIN, "Idempotency-Key": key})
    assert response.status_code == 400
    assert response.json()["detail"] == "Idempotency-Key must be 1 to 200 visible ASCII characters"
    assert log_values(writer.path) == []


async def test_errors_on_a_command_route_are_answered_as_html(tmp_path: Path, migrations: Path) -> None:
    import httpx

    from fastapi_lith import Lith

    # Without the Datastar header (a test client, a form), the writer dependency marks the
    # request as a command's: its errors are still HTML for the page.
    lith = Lith(tmp_path / "app.db", migrations=migrations, same_origin_only=False)
    app = append_app(lith.writer)
    lith.install(app)
    async with (
        lith.lifespan(app, ticks=False),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app.test") as client,
    ):
        response = await client.post("/append", json={"value": 5})
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("text/html")
    assert 'class="lith-error"' in response.text and "value" in response.text


# -- the engine's writer over any store, without SQLite or HTTP ----------------------------------


class _MemoryOutcomes:
    """An `OutcomeTable` in a dict: what the exactly-once protocol asks of a store, and no more."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[float, bytes | None]] = {}

    def claim(self, key: str, now: float, since: float) -> tuple[bool, bytes | None]:
        row = self.rows.get(key)
        return (True, None) if row is None or row[0] < since else (False, row[1])

    def record(self, key: str, now: float, outcome: bytes | None) -> None:
        self.rows[key] = (now, outcome)


class _MemoryStore:
    """A `Store` that applies each command to a plain object: the writer's queue, batches,
    futures, counters and subscribers, with no database under them."""

    from fastapi_lith.engine.statements import DIALECT as dialect

    path = None

    def __init__(self) -> None:
        self.outcomes = _MemoryOutcomes()
        self.batches: list[int] = []
        self.opened = self.closed = False

    def describe(self) -> str:
        return "memory"

    def open(self, feed, statements, forget_before: float) -> None:  # type: ignore[no-untyped-def]
        self.opened = True

    def run(self, batch) -> None:  # type: ignore[no-untyped-def]
        self.batches.append(len(batch.cmds))
        batch.outcomes = self.outcomes
        touched: list[str] = []
        for i, cmd in enumerate(batch.cmds):
            key = None if batch.keys is None else batch.keys[i]
            if key is not None and batch.repeat(i, key):
                continue
            try:
                batch.results[i] = cmd.apply(touched)
            except Exception as exc:
                batch.errors[i] = exc
            if key is not None:
                batch.record(i, key)
        batch.topics = frozenset(touched)

    def close(self) -> None:
        self.closed = True


class _Note(Command):
    value: str
    fail: bool = False

    def apply(self, tx) -> str:  # type: ignore[no-untyped-def, override]
        if self.fail:
            raise ValueError(self.value)
        tx.append(f"note:{self.value}")
        return self.value.upper()


async def test_the_engine_writer_runs_over_any_store() -> None:
    from fastapi_lith.engine.feed import LocalFeed
    from fastapi_lith.engine.writer import Writer as EngineWriter

    store = _MemoryStore()
    writer = EngineWriter(store, feed=LocalFeed(), batch_size=3)
    assert writer.path is None and writer.describe() == "memory" and writer.dialect is store.dialect
    heard: list[frozenset[str]] = []
    writer.subscribe(heard.append)
    await writer.start()
    try:
        assert store.opened
        sent = [writer.do(_Note(value=f"n{i}", fail=i == 2)) for i in range(5)]
        outcomes = await asyncio.gather(*sent, return_exceptions=True)
        assert outcomes[:2] == ["N0", "N1"] and outcomes[3:] == ["N3", "N4"]
        assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "n2"
        assert store.batches == [3, 2]  # arrival order, at most batch_size per batch
        assert (writer.commands, writer.failed, writer.batches) == (5, 1, 2)
        assert set().union(*heard) == {"note:n0", "note:n1", "note:n3", "note:n4"}
        # A key's first outcome answers its repeats, result or error alike, through the store's table.
        assert await writer.do(_Note(value="once"), key="k") == "ONCE"
        assert await writer.do(_Note(value="twice"), key="k") == "ONCE"
        with pytest.raises(ValueError, match="^bad$"):
            await writer.do(_Note(value="bad", fail=True), key="e")
        with pytest.raises(FirstAttemptFailed, match="failed with ValueError: bad;"):
            await writer.do(_Note(value="good"), key="e")
        assert writer.repeats == 2 and set(store.outcomes.rows) == {"k", "e"}
    finally:
        await writer.close()
    assert store.closed


async def test_a_store_that_fails_its_batch_fails_every_caller_of_it() -> None:
    from fastapi_lith.engine.feed import LocalFeed
    from fastapi_lith.engine.writer import Writer as EngineWriter

    class Refusing(_MemoryStore):
        def run(self, batch) -> None:  # type: ignore[no-untyped-def]
            raise OSError("no commit")

    writer = EngineWriter(Refusing(), feed=LocalFeed())
    await writer.start()
    try:
        outcomes = await asyncio.gather(*(writer.do(_Note(value="x")) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(o, OSError) for o in outcomes) and writer.failed == 3 and writer.commands == 0
    finally:
        await writer.close()


def test_a_sqlite_writer_names_its_file(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "app.db", synchronous="FULL", wal_autocheckpoint=50)
    assert writer.path == tmp_path / "app.db" and writer.describe() == "app.db"
    assert (writer.synchronous, writer.wal_autocheckpoint) == ("FULL", 50)
    writer.wal_autocheckpoint = 10_000  # as Lith sets it while Litestream replicates, before start
    assert writer.store.wal_autocheckpoint == 10_000
