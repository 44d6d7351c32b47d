"""ops/verify.py, ops/restore.py and ops/locks.py: checking copies, and restoring one in place of a
database that a real running app holds open (refused) or not (done)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest

from fastapi_lith.cli import main
from fastapi_lith.exceptions import BackupError, InUse
from fastapi_lith.ops import Backups, backup, restore, verify
from fastapi_lith.ops.files import checksum_path, mb, unique, write_atomic
from fastapi_lith.ops.locks import holders
from tests.support import CHILD_HANG_LIMIT, REPO, crash_after, until
from tests.support.browser import Server
from tests.support.damage import changed_on_disk, index_out_of_step

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


def test_verify_reports_what_it_found_for_a_person_and_as_data(copy: Path, tmp_path: Path) -> None:
    sound = verify(copy)
    sidecar = checksum_path(copy).name
    assert sound.ok and sound.problems() == []
    assert sound.lines()[-2:] == [f"  checksum   ok ({sidecar})", "  verdict    ok"]
    assert sound.as_dict() == {
        "path": str(copy), "ok": True, "version": 7, "size": copy.stat().st_size,
        "page_size": sound.page_size, "pages": sound.pages, "freelist": 0,
        "integrity": ["ok"], "checksum": "ok", "error": None,
    }  # fmt: skip
    assert sound.pages * sound.page_size == sound.size
    unchecked = verify(copy, checksum=False)
    assert unchecked.ok and unchecked.checksum == "skipped"
    assert unchecked.lines()[0] == str(copy) and "  integrity  ok" in unchecked.lines()
    assert "  checksum   not checked" in unchecked.lines()
    digest = checksum_path(copy).read_text()
    checksum_path(copy).write_text("")  # an empty sidecar matches nothing
    assert verify(copy).checksum == "mismatch"
    checksum_path(copy).write_text(digest)
    flip(copy, copy.stat().st_size // 2 + 1000)
    changed = verify(copy)
    assert changed.checksum == "mismatch"
    assert changed.problems()[-1] == f"checksum mismatch: the file changed after the copy was taken ({sidecar})"
    assert changed.lines()[-1] == "  verdict    BAD: do not restore this copy"
    missing = verify(tmp_path / "nothing.db")
    assert (missing.ok, missing.error, missing.checksum) == (False, "no such file", "skipped")
    assert missing.problems() == ["no such file"]


def test_verify_finds_an_index_out_of_step_with_its_table(tmp_path: Path) -> None:
    """The damage `quick_check` cannot see (tests/support/damage.py)."""
    path = tmp_path / "board.db"
    index_out_of_step(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM card WHERE lane = 'done'").fetchone()[0] == 0  # through the index
    report = verify(path)
    assert not report.ok and report.checksum == "missing"
    lines = [f"row {i} missing from index card_lane" for i in range(1, 26)]
    assert report.integrity == lines
    assert report.problems() == ["integrity_check: " + "; ".join(lines[:5])]  # the first five
    shown = report.lines()
    assert "  integrity  FAILED (25 problems)" in shown
    assert [line for line in shown if line.startswith("    row")] == [f"    {line}" for line in lines[:20]]


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


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
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
    # Every problem the check found, one after the other.
    assert done.returncode == 1 and re.fullmatch(
        rf"error: {re.escape(str(copy))} is not a sound copy, nothing was replaced: "
        rf"integrity_check: row \d+ missing from index note_body; "
        rf"checksum mismatch: the file changed after the copy was taken \({re.escape(checksum_path(copy).name)}\)\n",
        done.stderr,
    ), done.stderr
    assert sha(target) == before
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("app.db.replaced-*"))


def test_restore_moves_the_stale_wal_of_a_crashed_app_aside_with_the_old_database(
    copy: Path, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    target = tmp_path / "app.db"
    with closing(sqlite3.connect(target)) as conn:
        expected_old = conn.execute("SELECT count(*) FROM note").fetchone()[0] + 1
    crash_after(target, "INSERT INTO note (body) VALUES ('written just before the crash')")

    done = run("restore", copy, target)
    assert done.returncode == 0, done.stderr
    with closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == 3000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    (replaced,) = tmp_path.glob("app.db.replaced-*[0-9]Z")
    with closing(sqlite3.connect(replaced)) as conn:  # the old database, whole, with its -wal
        assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == expected_old


# A rollback-journal app killed mid-transaction: its hot -journal holds the pages to put back.
CRASH_MID_TRANSACTION = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = DELETE")
conn.execute("BEGIN")
conn.execute("DELETE FROM note")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_restore_moves_the_hot_journal_of_a_crashed_app_aside_with_the_old_database(
    copy: Path, tmp_path: Path
) -> None:
    target = tmp_path / "app.db"
    proc = subprocess.run([sys.executable, "-c", CRASH_MID_TRANSACTION, str(target)], timeout=30)
    assert proc.returncode == -signal.SIGKILL and Path(f"{target}-journal").stat().st_size > 0
    info = restore(copy, target)
    # Beside the restored file SQLite would play the old journal back into it.
    assert not Path(f"{target}-journal").exists() and verify(target).ok
    assert info.replaced is not None and Path(f"{info.replaced}-journal").exists()
    with closing(sqlite3.connect(info.replaced)) as conn:  # the old database, whole: rolled back
        assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == 3000


def test_backup_and_restore_refuse_missing_files_without_creating_any(tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    done = run("backup", tmp_path / "missing.db", tmp_path / "out.db")
    assert done.returncode == 1 and "no such database" in done.stderr
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "out.db").exists()
    done = run("restore", tmp_path / "missing.db", tmp_path / "app.db")
    assert done.returncode == 1 and "no such file" in done.stderr
    assert not (tmp_path / "app.db").exists()


def test_restore_in_process_refuses_while_this_process_holds_the_database(copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "app.db"
    # A descriptor freed below the database's, as in any process that has run a while: the
    # check's own listing of its descriptors takes that number, and is gone once listed.
    spare = os.open(os.devnull, os.O_RDONLY)
    conn = sqlite3.connect(target)
    conn.execute("SELECT 1 FROM sqlite_master").fetchall()
    os.close(spare)
    try:
        with pytest.raises(Exception, match="this process has"):
            restore(copy, target)
    finally:
        conn.close()


# A process that has the database open through SQLite (a WAL connection, read and kept), and
# one that has only the file open (a copy tool reading it), each until its stdin closes.
HOLD_WITH_SQLITE = (
    "import sqlite3, sys; conn = sqlite3.connect(sys.argv[1]); conn.execute('SELECT count(*) FROM note').fetchall(); "
    "print('open', flush=True); sys.stdin.read()"
)
HOLD_THE_FILE = "import sys; file = open(sys.argv[1], 'rb'); print('open', flush=True); sys.stdin.read()"


def test_restore_in_process_names_every_process_holding_the_database_then_restores_it_once_they_end(
    copy: Path, tmp_path: Path
) -> None:
    target = tmp_path / "app.db"
    before = sha(target)
    # The copy tool's destination is a name in Latin-1, which its command line holds as is.
    holding = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(target), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        for script, extra in ((HOLD_WITH_SQLITE, []), (HOLD_THE_FILE, [b"caf\xe9.db"]))
    ]
    try:
        for process in holding:
            assert process.stdout is not None and process.stdout.readline() == "open\n"
        app, reader = holding
        # Each named with its command line, cut at 120 characters; the one through SQLite by its
        # locks too.
        app_command, reader_command = (
            f"{sys.executable} -c {script} {target}"[:120] for script in (HOLD_WITH_SQLITE, HOLD_THE_FILE)
        )
        found = [
            f"pid {app.pid} ({app_command}) holds a lock on app.db, a lock on app.db-shm, an open file",
            f"pid {reader.pid} ({reader_command}) holds an open file",
        ]
        assert holders(target) == found
        with pytest.raises(InUse) as refused:
            restore(copy, target)
        assert str(refused.value) == (
            f"{target} is open in another process ({'; '.join(found)}): stop the app first "
            "(e.g. systemctl stop lith@NAME), then restore; nothing was replaced"
        )
        assert sha(target) == before
    finally:
        for process in holding:
            process.communicate("")
    assert holders(target) == []
    info = restore(copy, target, keep_replaced=False)
    assert info.replaced is None and not list(tmp_path.glob("app.db.replaced-*"))
    assert info.summary() == f"restored {target} from {copy} (version 7, {mb(target.stat().st_size)})"
    assert verify(target).ok and not Path(f"{target}-wal").exists()
    again = restore(copy, target)  # the database replaced is kept unless told otherwise
    assert again.replaced is not None and verify(again.replaced).ok
    assert again.summary().endswith(f"; the previous database is kept as {again.replaced}")
    with pytest.raises(BackupError) as itself:
        restore(target, target)
    assert str(itself.value) == f"{target} is the database itself"
    # Into a folder not made yet, parents and all.
    nested = tmp_path / "new" / "data" / "app.db"
    assert restore(copy, nested).replaced is None and verify(nested).ok


def test_restoring_twice_in_one_second_keeps_both_replaced_databases(
    copy: Path, tmp_path: Path, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    target = tmp_path / "app.db"
    for _ in range(2):
        done = run("restore", copy, target)
        assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("app.db.replaced-*"))) == 2


def test_a_restored_database_keeps_the_mode_of_the_one_it_replaces(copy: Path, tmp_path: Path) -> None:
    """A service's database readable by its group only stays so after a restore from a shell."""
    target = tmp_path / "app.db"
    target.write_bytes(copy.read_bytes())
    target.chmod(0o640)
    restore(copy, target)
    assert target.stat().st_mode & 0o7777 == 0o640


def user_version_8(fd: int) -> None:
    os.pwrite(fd, (8).to_bytes(4, "big"), 60)  # the header's user_version


def rows_damaged_in_six_pages(fd: int) -> None:
    header = os.pread(fd, 100, 0)
    page_size, pages = int.from_bytes(header[16:18], "big"), int.from_bytes(header[28:32], "big")
    for page in range(pages // 2, pages // 2 + 6):
        at = page * page_size + page_size // 2  # inside the rows: the index no longer finds them
        os.pwrite(fd, bytes(b ^ 0xFF for b in os.pread(fd, 16, at)), at)


def header_overwritten(fd: int) -> None:
    os.pwrite(fd, b"\0" * 100, 0)


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (user_version_8, "ok, version 8"),
        (header_overwritten, "file is not a database"),
        # More problems than the message shows: the first five.
        (rows_damaged_in_six_pages, r"(row \d+ missing from index note_body; ){4}row \d+ missing from index note_body, version 7"),
    ],
    ids=["another version", "damaged rows", "no database"],
)
def test_a_copy_that_reads_back_otherwise_than_it_was_written_replaces_nothing(
    copy: Path, tmp_path: Path, change: Callable[[int], None], found: str
) -> None:
    """The copy is read back from the target's disk before anything moves: a disk that stored
    something else than it was given leaves the database in place and says what it read."""
    target = tmp_path / "app.db"
    before = sha(target)
    with changed_on_disk(tmp_path, ".app-restore-*.tmp", change) as changed, pytest.raises(BackupError) as refused:
        restore(copy, target)
    [written] = changed
    assert re.fullmatch(
        rf"the copy written to {re.escape(str(tmp_path / written))} does not check out \({found}\); nothing was replaced",
        str(refused.value),
    ), refused.value
    assert sha(target) == before
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("app.db.replaced-*"))


# A service's database, owned by the service's user and readable by its group, in a folder of
# its own; and an operator in that group (ids no account here uses).
SERVICE, OPERATOR = 48111, 48112


@contextmanager
def as_operator() -> Iterator[None]:
    """This process acts as the operator (effective ids, no capabilities) within the block."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    groups = os.getgroups()
    os.setgroups([SERVICE])
    os.setegid(SERVICE)
    os.seteuid(OPERATOR)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


@pytest.fixture
def service(copy: Path) -> Iterator[tuple[Path, Path]]:
    """(the copy, the service's database) where the operator can reach them: the test's own
    folder is open to root alone."""
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        shared = Path(top) / copy.name
        shutil.copyfile(copy, shared)
        shutil.copyfile(checksum_path(copy), checksum_path(shared))
        folder = Path(top) / "srv"
        folder.mkdir()
        target = folder / "app.db"
        shutil.copyfile(copy.parent.parent / "app.db", target)
        for path, mode in ((folder, 0o770), (target, 0o640)):
            os.chown(path, SERVICE, SERVICE)
            os.chmod(path, mode)
        yield shared, target


def test_an_operator_in_the_services_group_restores_and_keeps_the_replaced_database_as_a_copy(
    service: tuple[Path, Path],
) -> None:
    """Linux refuses a hard link to a file one may not write (fs.protected_hardlinks, on by
    default): the database it replaces is kept as a copy instead."""
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
        pytest.skip("hard links to others' files are allowed here")
    copy, target = service
    with closing(sqlite3.connect(target)) as conn, conn:
        conn.execute("DELETE FROM note WHERE id > 10")
    before = sha(target)
    with as_operator():
        info = restore(copy, target)
    assert info.replaced is not None and sha(info.replaced) == before
    assert info.replaced.stat().st_nlink == 1 and info.replaced.stat().st_uid == OPERATOR
    with closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT count(*) FROM note").fetchone() == (3000,)


def test_an_operator_who_may_not_write_the_folder_is_told_why_and_nothing_is_left_or_replaced(
    service: tuple[Path, Path],
) -> None:
    copy, target = service
    target.parent.chmod(0o750)  # the group reads the folder, only the service writes in it
    listed, before = sorted(target.parent.iterdir()), sha(target)
    with as_operator(), pytest.raises(sqlite3.OperationalError, match="unable to open database file"):
        restore(copy, target)
    assert sorted(target.parent.iterdir()) == listed and sha(target) == before


def test_a_file_written_whole_into_a_folder_the_operator_may_not_write_says_so_and_leaves_nothing(
    service: tuple[Path, Path],
) -> None:
    """The checksum beside a copy, the replica check's record: a file replaced at once, through a
    temporary file beside it, which here cannot even be made."""
    _, target = service
    target.parent.chmod(0o750)
    listed = sorted(target.parent.iterdir())
    with as_operator(), pytest.raises(PermissionError):
        write_atomic(checksum_path(target), b"0" * 64 + b"  app.db\n")
    assert sorted(target.parent.iterdir()) == listed


def test_sizes_read_in_bytes_below_a_tenth_of_a_megabyte_and_in_megabytes_from_it() -> None:
    """As a restore's summary and the replica check's lines show a database's size."""
    sizes = [0, 99_999, 100_000, 1_050_000, 2_000_000_000]
    assert [mb(n) for n in sizes] == ["0 bytes", "99,999 bytes", "0.1 MB", "1.1 MB", "2000.0 MB"]


def test_a_kept_name_taken_twice_already_gets_the_next_free_number(tmp_path: Path) -> None:
    """Three restores within one second: each replaced database keeps a name of its own."""
    wanted = tmp_path / "app.db.replaced-20261205T012345Z"
    assert unique(wanted) == wanted
    wanted.touch()
    assert unique(wanted) == tmp_path / "app.db.replaced-20261205T012345Z-2"
    (tmp_path / "app.db.replaced-20261205T012345Z-2").touch()
    assert unique(wanted) == tmp_path / "app.db.replaced-20261205T012345Z-3"


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


# --------------------------------------------------------------------------- without fcntl

NO_FCNTL = """
import sys
sys.modules["fcntl"] = None  # what a platform without it looks like: `import fcntl` fails
import fastapi_lith, fastapi_lith.cli, fastapi_lith.ops
from fastapi_lith import Lith
from fastapi_lith.exceptions import LithError
lith = Lith(sys.argv[1], backup_folder=sys.argv[2])
try:
    fastapi_lith.ops.restore(sys.argv[3], sys.argv[1])
except LithError as exc:
    print(type(exc).__name__, exc)
sys.exit(fastapi_lith.cli.main(["verify", sys.argv[3]]))
"""


def test_without_fcntl_the_lock_check_says_why_it_cannot_run_and_what_to_do(
    copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, so that the check's own words are read where the mutants run (the test below
    imports the package without fcntl, in a child)."""
    target = tmp_path / "app.db"
    monkeypatch.setitem(sys.modules, "fcntl", None)  # what a platform without it looks like
    with pytest.raises(BackupError) as refused:
        restore(copy, target)
    assert str(refused.value) == (
        "checking whether another process holds the database needs POSIX locks (fcntl), which this "
        f"platform ({sys.platform}) does not have: stop the app and restore or migrate on a Unix system"
    )


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_without_fcntl_the_package_imports_and_only_the_lock_check_says_it_cannot_run(copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "app.db"
    before = sha(target)
    done = subprocess.run(
        [sys.executable, "-c", NO_FCNTL, str(target), str(tmp_path / "timed"), str(copy)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # verify needs no locks
    first = done.stdout.splitlines()[0]
    assert first.startswith("BackupError ") and "needs POSIX locks (fcntl)" in first, done.stdout
    assert "verdict    ok" in done.stdout
    assert sha(target) == before  # refused before anything was replaced


async def test_several_processes_of_one_app_take_each_copy_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`--workers N`: every process runs the timer, one copies; when it stops, another takes over."""
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
    folder = tmp_path / "backups"
    first, second = Backups(db_path, folder, every=3600, keep=5), Backups(db_path, folder, every=3600, keep=5)
    umask = os.umask(0o022)  # the lock file's mode as made, whatever the umask this test runs under
    try:
        assert first.lead()  # the first process's timer takes the lock
    finally:
        os.umask(umask)
    await first.start()
    await second.start()
    try:
        async with asyncio.timeout(30):
            while not first.taken:  # counted once the copy has its checksum: it is in the folder first
                await asyncio.sleep(0.02)
        assert (first.taken, second.taken) == (1, 0) and len(first.copies()) == 1
        assert not second.lead()  # and could not take one: the first holds the lock
        # The second has found the lock held (its timer ran before the copy was done) and waits
        # quietly: waiting on another process is no failure.
        assert second.failures == 0 and "failed" not in caplog.text
        # No other user can open the lock file, so none can hold it and stop the copies.
        assert oct((folder / ".app-timer.lock").stat().st_mode & 0o777) == oct(0o640)
        await first.stop()  # the copying process ends: the other one leads from now on
        assert second.lead()
    finally:
        await first.stop()
        await second.stop()


async def test_when_the_process_that_copies_ends_another_takes_over_on_its_own(tmp_path: Path) -> None:
    db_path = tmp_path / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
    folder = tmp_path / "backups"
    # Every second: a process that does not hold the lock tries for it again each second.
    first, second = Backups(db_path, folder, every=1, keep=5), Backups(db_path, folder, every=1, keep=5)

    async def first_copied() -> bool:
        return first.taken > 0

    async def second_copied() -> bool:
        return second.taken > 0

    try:
        await first.start()
        await until(first_copied)
        await second.start()  # finds the lock held, and waits
        await first.stop()
        await until(second_copied)
    finally:
        await first.stop()
        await second.stop()
    assert second.failures == 0
