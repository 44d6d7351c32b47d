"""ops/backup.py and ops/timer.py: copies of real SQLite files, under load, by a thread, the timer and
another process."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fastapi_lith import Command, Tx, Writer
from fastapi_lith.exceptions import BackupError
from fastapi_lith.ops import Backups, backup, verify
from fastapi_lith.ops.files import checksum_path, copy_name
from tests.support import CHILD_HANG_LIMIT, until


def rows(path: Path) -> list[int]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM seq ORDER BY n")]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- under load


class Append(Command):
    """The next number of the sequence: gap-free because the writer applies commands in order."""

    def apply(self, tx: Tx) -> int:
        n = tx.scalar("SELECT coalesce(max(n), 0) + 1 FROM seq")
        tx.execute("INSERT INTO seq (n, payload) VALUES (?, randomblob(200))", (n,))
        return n


@pytest.fixture
def seq_db(tmp_path: Path) -> tuple[Path, Path]:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_seq.sql").write_text(
        "CREATE TABLE seq (n INTEGER PRIMARY KEY, payload BLOB NOT NULL);\n"
        "CREATE TABLE filler (id INTEGER PRIMARY KEY, data BLOB NOT NULL);\n"
        # about 10 MB, so that a copy takes long enough for commits to land during it
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2500)\n"
        "INSERT INTO filler (data) SELECT randomblob(4000) FROM c;\n"
    )
    return tmp_path / "seq.db", migrations


SHELL = "import sys; from fastapi_lith.cli import main; sys.stdin.readline(); sys.exit(main(sys.argv[1:]))"


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
async def test_backups_under_load_hold_exactly_the_commands_committed_before_them(
    seq_db: tuple[Path, Path], tmp_path: Path
) -> None:
    db_path, migrations = seq_db
    shell = subprocess.Popen(
        [sys.executable, "-c", SHELL, "backup", str(db_path), str(tmp_path / "copies" / "shell.db")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    writer = Writer(db_path, migrations=migrations)
    await writer.start()
    acked: set[int] = set()
    state = {"max": 0}
    stop = asyncio.Event()

    async def producer() -> None:
        while not stop.is_set():
            n = await writer.do(Append())
            acked.add(n)
            state["max"] = max(state["max"], n)

    copies: list[tuple[int, Path, int, int]] = []  # (acked before, copy, batches before, after)

    def take_copies() -> None:
        for i in range(4):
            before, batches = state["max"], writer.batches
            info = backup(db_path, tmp_path / "copies" / f"copy-{i}.db", method="vacuum" if i == 3 else "backup")
            copies.append((before, info.path, batches, writer.batches))
            time.sleep(0.1)

    timer = Backups(db_path, tmp_path / "timed", every=1, keep=2)
    producers = [asyncio.create_task(producer()) for _ in range(32)]
    await asyncio.sleep(0.3)
    # One copy from another process, by the shell command's code, while the load goes on. The
    # process imported before the load began and copies when told: then "before" is exact.
    shell_before = state["max"]
    shell.stdin.write("go\n")  # type: ignore[union-attr]
    shell.stdin.flush()  # type: ignore[union-attr]
    await timer.start()
    await asyncio.to_thread(take_copies)
    deadline = time.monotonic() + 60
    while timer.taken < 3:  # the timer takes a third copy, so it prunes under load
        assert time.monotonic() < deadline, f"the timer took {timer.taken} copies"
        await asyncio.sleep(0.05)
    while shell.poll() is None:
        await asyncio.sleep(0.05)
    await timer.stop()
    stop.set()
    await asyncio.gather(*producers)
    await writer.close()
    output, _ = shell.communicate()  # its output, and its pipes closed
    assert shell.returncode == 0, output
    copies.append((shell_before, tmp_path / "copies" / "shell.db", 0, 0))

    final = state["max"]
    assert final > 1000, f"too little load to mean anything: {final} commands"
    assert acked == set(range(1, final + 1))
    timed = timer.copies()
    assert timer.taken >= 3 and len(timed) == 2, (timer.taken, timed)  # the oldest was pruned
    landed_during_a_copy = False
    for before, path, batches_before, batches_after in copies + [(0, p, 0, 0) for p in timed]:
        got = rows(path)
        k = len(got)
        assert got == list(range(1, k + 1)), f"{path.name}: not a gap-free prefix"
        assert before <= k <= final, f"{path.name}: holds 1..{k}, but {before} were acknowledged before it"
        report = verify(path)
        assert report.ok and report.checksum == "ok", report.lines()
        landed_during_a_copy |= batches_after > batches_before
    assert landed_during_a_copy, "the writer committed nothing while copies were taken"
    worst = max(writer.commit_seconds)
    print(f"{final} commands, {writer.batches} batches, {len(copies) + timer.taken} copies; "
          f"slowest batch {worst * 1000:.1f} ms")  # fmt: skip


def test_a_copys_summary_says_what_was_written_checked_and_how_long_the_snapshot_was_held(tmp_path: Path) -> None:
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
    checked, unchecked = ({}, "quick_check ok"), ({"check": False}, "not checked")
    for options, said in (checked, unchecked, ({"method": "vacuum"}, "quick_check ok")):
        started = time.perf_counter()
        info = backup(db_path, tmp_path / f"copy-{len(options)}-{said}.db", **options)  # type: ignore[arg-type]
        # The snapshot is one part of the copy, and the copy one part of the call.
        assert 0 <= info.snapshot_seconds <= info.seconds <= time.perf_counter() - started
        assert (info.version, info.sha256) == (3, sha(info.path))
        assert info.summary() == (
            f"{info.path}: {info.size:,} bytes, version 3, {said}, {info.method} in {info.seconds:.2f} s "
            f"(snapshot held {info.snapshot_seconds:.2f} s)"
        )
    with pytest.raises(ValueError) as unknown:
        backup(db_path, tmp_path / "copy.db", method="zip")  # type: ignore[arg-type]
    assert str(unknown.value) == "method must be 'backup' or 'vacuum', not 'zip'"


def test_a_copy_goes_into_a_folder_made_for_it_beside_no_checksum_when_told_and_never_over_the_database(
    tmp_path: Path,
) -> None:
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE t (x)")
    # A folder named with a trailing slash, not made yet: the copy is named by the time in it.
    first = backup(db_path, f"{tmp_path}/new/copies/")
    assert first.path.parent == tmp_path / "new" / "copies" and first.path.name.startswith("app-")
    again = backup(db_path, tmp_path / "new" / "copies")  # the same folder, now there
    assert again.path.parent == first.path.parent
    plain = backup(db_path, tmp_path / "a" / "b" / "plain.db", checksum=False)  # a file in a new folder
    assert plain.path == tmp_path / "a" / "b" / "plain.db" and plain.sha256 == ""
    assert not checksum_path(plain.path).exists() and verify(plain.path).checksum == "missing"
    with pytest.raises(BackupError) as itself:
        backup(db_path, db_path)
    assert str(itself.value) == f"{db_path} is the database itself"


# --------------------------------------------------------------------------- the timer


def fake_copy(folder: Path, stem: str, age: timedelta, source: Path) -> Path:
    path = folder / copy_name(f"{stem}.db", datetime.now(timezone.utc) - age)
    path.write_bytes(source.read_bytes())
    checksum_path(path).write_text(f"{sha(path)}  {path.name}\n")
    return path


async def test_timer_names_copies_by_utc_time_keeps_the_newest_and_resumes_its_schedule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    folder = tmp_path / "backups"
    folder.mkdir()
    old = [fake_copy(folder, "app", timedelta(hours=h), db_path) for h in (5, 4, 3, 2)]
    others = [folder / "app-before-20260101T000000Z.db", folder / "notes.txt", folder / "other-20260101T000000Z.db"]
    for path in others:
        path.write_text("not ours")

    checksum_path(old[0]).unlink()  # deleted by hand: the copy is still pruned
    timer = Backups(db_path, folder, every=3 * 3600, keep=3)
    assert timer.copies() == old
    newest = datetime.strptime(old[-1].name[4:-3], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    assert timer.next_due() == pytest.approx(newest.timestamp() + 3 * 3600)  # one hour from now

    before = datetime.now(timezone.utc).replace(microsecond=0)
    info = await timer.take()
    after = datetime.now(timezone.utc)
    # Named by the time the copy was taken: between the two readings, whole seconds kept.
    taken = datetime.strptime(info.path.name[4:-3], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    assert before <= taken <= after and info.path.parent == folder
    assert info.path.name.startswith("app-") and info.path.name.endswith("Z.db")
    assert timer.copies() == [*old[-2:], info.path]
    for gone in old[:2]:
        assert not gone.exists() and not checksum_path(gone).exists()
    assert all(p.exists() for p in others)  # only its own copies are ever deleted
    assert verify(info.path).ok

    # Due at once when the newest copy is older than `every`; the copy is in before stop returns.
    later = Backups(db_path, tmp_path / "fresh", every=3600, keep=1)
    now = time.time()
    assert later.next_due(now) == now
    caplog.set_level(logging.INFO, logger="fastapi_lith.backup")
    await later.start()
    assert "lith-backups" in {task.get_name() for task in asyncio.all_tasks()}  # as a task dump names it

    async def logged() -> bool:  # the copy is counted on its thread, then logged by the timer
        return later.last is not None and f"backup {later.last.summary()}" in caplog.messages

    await until(logged)
    await later.stop()
    assert later.taken == 1 and len(later.copies()) == 1

    with pytest.raises(ValueError, match=r"^every must be at least 1 second, not 0.5$"):
        Backups(db_path, folder, every=0.5, keep=3)
    with pytest.raises(ValueError, match=r"^keep must be at least 1, not 0$"):
        Backups(db_path, folder, every=60, keep=0)
    hourly = Backups(db_path, folder)
    assert (hourly.every, hourly.keep, hourly.method) == (3600.0, 24, "backup")  # a day of hourly copies


async def test_copies_asked_for_together_are_taken_one_after_the_other_on_one_backup_thread(tmp_path: Path) -> None:
    """A `take()` beside the timer's waits its turn: two copies at once would read the database
    twice over and write the same copy's name and checksum side by side."""
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    timer = Backups(db_path, tmp_path / "backups", every=3600, keep=5)
    try:
        # Both copies are asked for in one turn of the loop, the first still running: a pool of
        # more than one thread would start a second thread for the second.
        before = set(threading.enumerate())
        first, second = await asyncio.gather(timer.take(), timer.take())
        assert sorted(t.name for t in set(threading.enumerate()) - before) == ["lith-backup_0"]
        assert timer.taken == 2 and timer.last in (first, second)
        for copy in timer.copies():
            report = verify(copy)
            assert report.ok and report.checksum == "ok", report.lines()
    finally:
        await timer.stop()


def test_prune_deletes_a_crashed_copys_temporary_file_once_clearly_abandoned(tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    timer = Backups(tmp_path / "app.db", folder, every=3600, keep=2)
    abandoned, recent, others = folder / ".app-1.tmp", folder / ".app-2.tmp", folder / ".apple-1.tmp"
    for path in (abandoned, recent, others):
        path.write_bytes(b"half a copy")
    two_hours_ago = time.time() - 2 * 3600  # past max(1 h, 2 * every)
    for path in (abandoned, others):
        os.utime(path, (two_hours_ago, two_hours_ago))
    os.utime(recent, (time.time() - 3000, time.time() - 3000))  # a copy of a big file may still be writing it
    assert timer.prune() == []  # no timed copies to delete
    assert not abandoned.exists() and recent.exists() and others.exists()  # apple.db's: not ours
    daily = Backups(tmp_path / "app.db", folder, every=86400, keep=2)
    os.utime(recent, (two_hours_ago, two_hours_ago))
    daily.prune()
    assert recent.exists()  # a daily timer waits two days before calling a copy abandoned


async def test_a_failed_copy_is_counted_and_logged_and_the_next_one_lands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    blocker = tmp_path / "disk"
    blocker.write_text("a file where the backup folder's parent should be")
    timer = Backups(db_path, blocker / "nightly" / "backups", every=1, keep=2, method="vacuum")
    assert (timer.taken, timer.failures, timer.last) == (0, 0, None)
    with pytest.raises(NotADirectoryError):
        await timer.take()  # what the timer's loop catches
    blocker.unlink()  # the folder and its parents are made at the next copy
    info = await timer.take()
    assert (info.path.parent, info.method, timer.last, timer.taken) == (timer.folder, "vacuum", info, 1)

    failing = Backups(db_path, tmp_path / "full" / "backups", every=1, keep=2)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "backups").write_text("not a folder")
    await failing.start()

    async def failed_twice() -> bool:  # each failure counted, and tried again a second later
        return failing.failures >= 2

    await until(failed_twice)
    assert failing.taken == 0 and f"backup of {db_path} into {failing.folder} failed" in caplog.text
    (tmp_path / "full" / "backups").unlink()

    async def copied(timer: Backups = failing) -> bool:
        return timer.taken > 0

    await until(copied)
    await failing.stop()
    assert failing.failures >= 2 and len(failing.copies()) == 1
    # Each failure counted once and logged once, as it happened.
    assert caplog.messages.count(f"backup of {db_path} into {failing.folder} failed") == failing.failures

    nested = Backups(db_path, tmp_path / "new" / "nightly" / "backups", every=1, keep=1)
    await nested.start()  # the timer's lock is made in the folder, parents and all
    await until(lambda: copied(nested))
    await nested.stop()
    assert nested.failures == 0 and len(nested.copies()) == 1


def test_copy_names_are_written_and_read_as_utc_whatever_the_local_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = tmp_path / "app.db"
    sqlite3.connect(db_path).close()
    folder = tmp_path / "backups"
    folder.mkdir()
    newest = fake_copy(folder, "app", timedelta(hours=2), db_path)
    taken = datetime.strptime(newest.name[4:-3], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    monkeypatch.setenv("TZ", "America/New_York")  # five hours behind UTC, four in summer
    time.tzset()
    try:
        assert Backups(db_path, folder, every=3 * 3600).next_due() == pytest.approx(taken + 3 * 3600)
        at = datetime(2026, 12, 5, 1, 23, 45, tzinfo=timezone.utc)
        assert copy_name(db_path, at) == copy_name(db_path, at.astimezone()) == "app-20261205T012345Z.db"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_copy_of_a_database_held_by_another_thread_is_consistent(tmp_path: Path) -> None:
    """The backup API copies in one step: a write between two steps cannot tear the copy."""
    db_path = tmp_path / "big.db"
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE seq (n INTEGER PRIMARY KEY, payload BLOB)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO seq VALUES (?, randomblob(1000))", [(i,) for i in range(1, 5001)])
    conn.execute("COMMIT")
    stop = threading.Event()

    def write() -> None:
        n = 5001
        while not stop.is_set():
            conn.execute("INSERT INTO seq VALUES (?, randomblob(1000))", (n,))
            n += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        infos = [backup(db_path, tmp_path / f"c{i}.db") for i in range(3)]
    finally:
        stop.set()
        thread.join()
        conn.close()
    for info in infos:
        got = rows(info.path)
        assert got == list(range(1, len(got) + 1))
