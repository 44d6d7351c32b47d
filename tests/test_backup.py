"""Backups, verify and restore on real SQLite files, under load, against a real running app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from browser import Server
from fastapi_lith import Command, Tx
from fastapi_lith.__main__ import main
from fastapi_lith.backup import Backups, backup, checksum_path, copy_name, restore, verify
from fastapi_lith.writer import Writer

REPO = Path(__file__).resolve().parent.parent
SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


def cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m fastapi_lith ...` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "fastapi_lith", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The same command in this process (a new one costs a second of imports): for the
    cases where no other process is the point."""

    def call(*args: str | Path) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return call


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


SHELL = "import sys; from fastapi_lith.__main__ import main; sys.stdin.readline(); sys.exit(main(sys.argv[1:]))"


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
    assert shell.returncode == 0, shell.stdout.read()  # type: ignore[union-attr]
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


# --------------------------------------------------------------------------- the timer


def fake_copy(folder: Path, stem: str, age: timedelta, source: Path) -> Path:
    path = folder / copy_name(f"{stem}.db", datetime.now(timezone.utc) - age)
    path.write_bytes(source.read_bytes())
    checksum_path(path).write_text(f"{sha(path)}  {path.name}\n")
    return path


async def test_timer_names_copies_by_utc_time_keeps_the_newest_and_resumes_its_schedule(
    tmp_path: Path,
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
    await later.start()
    for _ in range(100):
        if later.taken:
            break
        await asyncio.sleep(0.05)
    await later.stop()
    assert later.taken == 1 and len(later.copies()) == 1

    with pytest.raises(ValueError):
        Backups(db_path, folder, every=0.5, keep=3)
    with pytest.raises(ValueError):
        Backups(db_path, folder, every=60, keep=0)


# --------------------------------------------------------------------------- verify


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    db_path = tmp_path / "app.db"
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("CREATE INDEX note_body ON note (body)")
    conn.executemany("INSERT INTO note (body) VALUES (?)", [(f"note {i} " * 20,) for i in range(3000)])
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    info = backup(db_path, f"{tmp_path}/backups/")
    conn.close()
    return info.path


def flip(path: Path, offset: int, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_verify_reports_version_size_integrity_and_checksum(copy: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    done = run("verify", copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "version    7" in done.stdout
    assert f"size       {copy.stat().st_size:,} bytes" in done.stdout
    assert "integrity  ok" in done.stdout and "checksum   ok" in done.stdout
    header = copy.read_bytes()[:20]
    assert header[18:20] == b"\x01\x01"  # a rollback-journal file: opens read-only as it is
    before = sorted(p.name for p in copy.parent.iterdir())
    done = run("verify", "--json", copy)
    report = json.loads(done.stdout)
    assert report["ok"] and report["version"] == 7 and report["integrity"] == ["ok"]
    assert sorted(p.name for p in copy.parent.iterdir()) == before  # read-only: no -wal, no -shm


def test_verify_says_so_when_bytes_in_the_middle_of_a_copy_changed(copy: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    size = copy.stat().st_size
    flip(copy, size // 2 + 1000)  # inside a page: rows whose bytes changed
    done = run("verify", copy)
    assert done.returncode == 1
    assert "checksum   MISMATCH" in done.stdout and "BAD: do not restore this copy" in done.stdout


def test_verify_without_a_checksum_finds_a_damaged_page(copy: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    checksum_path(copy).unlink()
    with closing(sqlite3.connect(copy)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    flip(copy, (pages // 2) * page_size, 12)  # the b-tree header of the page in the middle
    done = run("verify", copy)
    assert done.returncode == 1, done.stdout
    assert "integrity  FAILED" in done.stdout and "checksum   none" in done.stdout


def test_verify_of_a_file_that_is_not_a_database(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    done = run("verify", junk)
    assert done.returncode == 1 and "not a readable SQLite database" in done.stdout
    assert not (tmp_path / "nothing.db").exists()
    assert run("verify", tmp_path / "nothing.db").returncode == 1
    assert not (tmp_path / "nothing.db").exists()  # read-only: never creates a file


# --------------------------------------------------------------------------- restore


def count(db_path: Path) -> int:
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


def add(server: Server, n: int) -> None:
    response = httpx.post(f"{server.url}/add", json={"tab": "t1", "n": n}, headers=SAME_ORIGIN)
    assert response.status_code == 204, response.text


def test_restore_refuses_the_database_of_a_running_app_then_restores_it_stopped(
    tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    db_path = tmp_path / "counter.db"
    log = tmp_path / "server.log"
    with Server("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(db_path)}, log_path=log) as server:
        add(server, 5)
        done = run("backup", db_path, f"{tmp_path}/backups/")  # a copy of the live database
        assert done.returncode == 0, done.stderr
        (copy,) = (tmp_path / "backups").glob("counter-*Z.db")
        add(server, 2)
        assert count(db_path) == 7

        # BEGIN EXCLUSIVE is no test of "in use": in WAL mode an idle app holds no write lock.
        probe = sqlite3.connect(db_path, timeout=0.1, isolation_level=None)
        probe.execute("BEGIN EXCLUSIVE")
        probe.execute("ROLLBACK")
        probe.close()

        before = sha(db_path)
        done = cli("restore", copy, db_path)  # from a shell, as an operator would
        assert done.returncode == 1
        assert f"pid {server.pid}" in done.stderr and "stop the app first" in done.stderr
        assert "nothing was replaced" in done.stderr
        assert sha(db_path) == before and count(db_path) == 7
        assert run("migrate", db_path, "--migrations", REPO / "examples/counter/migrations").returncode == 1

        server.stop()
        done = run("restore", copy, db_path)
        assert done.returncode == 0, done.stderr
        assert count(db_path) == 5
        assert not Path(f"{db_path}-wal").exists() and not Path(f"{db_path}-shm").exists()
        (replaced,) = tmp_path.glob("counter.db.replaced-*")
        assert count(replaced) == 7 and "kept as" in done.stdout
        assert not list(tmp_path.glob(".*.tmp"))

        server.start()
        page = httpx.get(server.url + "/").text
        assert '<p id="counter" class="count">5</p>' in page
        add(server, 1)
        assert count(db_path) == 6


def test_restore_refuses_a_corrupt_copy_and_changes_nothing(copy: Path, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    target = tmp_path / "app.db"
    before = sha(target)
    flip(copy, copy.stat().st_size // 2 + 1000)
    done = run("restore", copy, target)
    assert done.returncode == 1 and "not a sound copy" in done.stderr and "checksum mismatch" in done.stderr
    assert sha(target) == before
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("app.db.replaced-*"))


CRASH = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")  # everything stays in the -wal
conn.execute("INSERT INTO note (body) VALUES ('written just before the crash')")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_restore_moves_the_stale_wal_of_a_crashed_app_aside_with_the_old_database(
    copy: Path, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    target = tmp_path / "app.db"
    with closing(sqlite3.connect(target)) as conn:
        expected_old = conn.execute("SELECT count(*) FROM note").fetchone()[0] + 1
    proc = subprocess.run([sys.executable, "-c", CRASH, str(target)], timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert Path(f"{target}-wal").stat().st_size > 0  # committed frames, never checkpointed

    done = run("restore", copy, target)
    assert done.returncode == 0, done.stderr
    with closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == 3000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    (replaced,) = tmp_path.glob("app.db.replaced-*[0-9]Z")
    with closing(sqlite3.connect(replaced)) as conn:  # the old database, whole, with its -wal
        assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == expected_old


def test_backup_and_restore_refuse_missing_files_without_creating_any(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    done = run("backup", tmp_path / "missing.db", tmp_path / "out.db")
    assert done.returncode == 1 and "no such database" in done.stderr
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "out.db").exists()
    done = run("restore", tmp_path / "missing.db", tmp_path / "app.db")
    assert done.returncode == 1 and "no such file" in done.stderr
    assert not (tmp_path / "app.db").exists()


def test_restore_in_process_refuses_while_this_process_holds_the_database(copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "app.db"
    conn = sqlite3.connect(target)
    conn.execute("SELECT 1 FROM sqlite_master").fetchall()
    try:
        with pytest.raises(Exception, match="this process has"):
            restore(copy, target)
    finally:
        conn.close()


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


def test_restoring_twice_in_one_second_keeps_both_replaced_databases(
    copy: Path, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    target = tmp_path / "app.db"
    for _ in range(2):
        done = run("restore", copy, target)
        assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("app.db.replaced-*"))) == 2


def test_verify_reads_a_plain_copy_of_a_wal_database_without_writing_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.db"]
    report = verify(path)
    assert report.ok and report.checksum == "missing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.db"]
