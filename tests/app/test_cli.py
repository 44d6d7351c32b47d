"""`python -m fastapi_lith`: migrations from the shell, and the command line itself."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from fastapi_lith.cli import build_parser, main
from fastapi_lith.exceptions import LithError, MigrationError
from fastapi_lith.ops import BackupError, InUse
from fastapi_lith.scaffold import ProjectError, package_name
from tests.support import CHILD_HANG_LIMIT

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`python -m fastapi_lith ARGS` in this process (a new one costs a second of imports)."""

    def call(*args: str | Path) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return call


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_init.sql").write_text("CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT NOT NULL);")
    (folder / "0002_tags.sql").write_text("CREATE TABLE tag (note INTEGER REFERENCES note (id), name TEXT);")
    (folder / "README.md").write_text("not a migration")
    return folder


def version(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


def test_status_and_migrate_from_the_shell(tmp_path: Path, migrations: Path, run: Run) -> None:
    db_path = tmp_path / "app.db"

    done = run("status", db_path, "--migrations", migrations)
    assert done.returncode == 0, done.stderr
    assert "(no such file yet): version 0; newest migration 2; 2 pending" in done.stdout
    assert "  pending  0001_init.sql\n  pending  0002_tags.sql" in done.stdout
    assert not db_path.exists()  # status never creates the database

    done = run("migrate", db_path, "--migrations", migrations)
    assert done.returncode == 0, done.stderr
    assert "migrated from version 0 to 2 (0001_init.sql, 0002_tags.sql)" in done.stdout
    assert version(db_path) == 2

    done = run("status", db_path, "--migrations", migrations)
    assert "version 2; newest migration 2; up to date" in done.stdout
    assert "  applied  0001_init.sql\n  applied  0002_tags.sql" in done.stdout
    assert "already at version 2" in run("migrate", db_path, "--migrations", migrations).stdout

    (migrations / "0003_pinned.sql").write_text("ALTER TABLE note ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;")
    assert "1 pending" in run("status", db_path, "--migrations", migrations).stdout
    done = run("migrate", db_path, "--migrations", migrations)
    assert "from version 2 to 3 (0003_pinned.sql)" in done.stdout and version(db_path) == 3


def test_migrate_stops_at_a_failing_file_and_says_which(tmp_path: Path, migrations: Path, run: Run) -> None:
    db_path = tmp_path / "app.db"
    (migrations / "0003_broken.sql").write_text("CREATE TABLE ok_so_far (x);\nALTER TABLE nowhere ADD COLUMN y;")
    done = run("migrate", db_path, "--migrations", migrations)
    assert done.returncode == 1
    assert "0003_broken.sql failed" in done.stderr and "stays at version 2" in done.stderr
    with closing(sqlite3.connect(db_path)) as conn:  # the failing file rolled back whole
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'ok_so_far'").fetchone()[0] == 0
    done = run("status", db_path, "--migrations", migrations)
    assert "version 2; newest migration 3; 1 pending" in done.stdout


def test_a_database_newer_than_the_migrations(tmp_path: Path, migrations: Path, run: Run) -> None:
    db_path = tmp_path / "app.db"
    assert run("migrate", db_path, "--migrations", migrations).returncode == 0
    (migrations / "0002_tags.sql").unlink()  # an older release of the app
    done = run("status", db_path, "--migrations", migrations)
    assert done.returncode == 1 and "NEWER than the newest migration (1)" in done.stdout
    done = run("migrate", db_path, "--migrations", migrations)
    assert done.returncode == 1 and "refusing to run an older app" in done.stderr
    assert version(db_path) == 2


HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
print("open", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def held(tmp_path: Path, migrations: Path, run: Run) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A database at version 1 that another process holds open, idle, as a running app does."""
    db_path = tmp_path / "app.db"
    (migrations / "0002_tags.sql").rename(tmp_path / "0002_tags.sql")
    assert run("migrate", db_path, "--migrations", migrations).returncode == 0
    (tmp_path / "0002_tags.sql").rename(migrations / "0002_tags.sql")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "open"  # type: ignore[union-attr]
    yield db_path, proc
    proc.communicate("\n", timeout=10)


def test_migrate_refuses_a_database_another_process_holds(held: tuple[Path, subprocess.Popen[str]],
                                                          migrations: Path, run: Run) -> None:  # fmt: skip
    db_path, proc = held
    done = run("migrate", db_path, "--migrations", migrations)
    assert done.returncode == 1
    assert f"pid {proc.pid}" in done.stderr and "migrates itself when it starts" in done.stderr
    assert version(db_path) == 1
    args = build_parser().parse_args(["migrate", str(db_path), "--migrations", str(migrations)])
    with pytest.raises(MigrationError, match="migrates itself when it starts"):  # a migration error, not a backup's
        args.func(args)
    # status only reads: fine while the app runs
    done = run("status", db_path, "--migrations", migrations)
    assert done.returncode == 0 and "version 1; newest migration 2; 1 pending" in done.stdout


def test_missing_migrations_folder_creates_nothing(tmp_path: Path, run: Run) -> None:
    done = run("migrate", tmp_path / "app.db", "--migrations", tmp_path / "nowhere")
    assert done.returncode == 1 and "does not exist" in done.stderr
    assert not (tmp_path / "app.db").exists()


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_the_module_runs_from_a_shell(tmp_path: Path, migrations: Path) -> None:
    """One real `python -m fastapi_lith` (the others run `main` in this process)."""
    db_path = tmp_path / "app.db"
    done = subprocess.run(
        [sys.executable, "-m", "fastapi_lith", "migrate", str(db_path), "--migrations", str(migrations)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert version(db_path) == 2
    usage = subprocess.run([sys.executable, "-m", "fastapi_lith"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2
    for verb in ("backup", "verify", "restore", "migrate", "status", "new"):
        assert verb in usage.stderr


def test_usage_errors(run: Run) -> None:
    assert run().returncode == 2
    assert run("status", "app.db").returncode == 2  # --migrations is required
    assert run("bogus").returncode == 2
    assert run("backup", "--method", "zip", "a.db", "b.db").returncode == 2
    done = run("replica")  # an ACTION is required
    assert done.returncode == 2 and "status" in done.stderr and "verify" in done.stderr
    assert run("replica", "status", "app.db").returncode == 2  # and the replica's URL


@pytest.mark.parametrize(
    ("name", "package"),
    [("guestbook", "guestbook"), ("My Guest-Book", "my_guest_book"), ("2048", "app_2048"), ("a.b", "a_b")],
)
def test_package_names(name: str, package: str) -> None:
    assert package_name(name) == package


def test_new_refuses_a_folder_that_is_not_empty_and_bad_names(tmp_path: Path, run: Run) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    done = run("new", tmp_path / "busy")
    assert done.returncode == 1 and "not an empty folder" in done.stderr
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["keep.txt"]
    assert run("new", tmp_path / "x", "--name", "bad'name").returncode == 1
    assert run("new", tmp_path / "y", "--name", "tests").returncode == 1
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_the_command_lines_errors_share_one_base() -> None:
    """An app or a script catches every error of the library with `except LithError`."""
    for error in (BackupError, InUse, ProjectError):
        assert issubclass(error, LithError), error
