"""A full disk under a real uvicorn: the generated project's database on a small tmpfs.

Every command answers 503 with the library's HTML, pushed to the acting tab so its button stops
pending; the cause is logged once, not per command; /health turns 503; freeing space brings it
all back. Needs root for `mount` (CI runs as root), skipped otherwise.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import sqlalchemy as sa

from fastapi_lith import Command, StorageError, Tx, Writer
from fastapi_lith.cli import main
from fastapi_lith.engine.storage import StorageState, storage_cause
from tests.app.test_scaffold import TEST_SECRET, signed_up
from tests.support import REPO, fill_disk
from tests.support.browser import Server

SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}


class Tab:
    """One signed-in page's identity-encoded stream (the URL its page signed), read on a
    thread, for the test to wait on."""

    def __init__(self, browser: httpx.Client) -> None:
        self.data = ""
        page = browser.get("/")
        match = re.search(r"@get\('([^']+)'", html.unescape(page.text))
        assert match, page.text
        url = match.group(1)
        self.id = parse_qs(urlsplit(url).query)["tab"][0]
        self._client = httpx.Client(base_url=str(browser.base_url), cookies=browser.cookies, timeout=None)
        self._stream = self._client.stream("GET", url, headers={"Accept-Encoding": "identity"})
        self._response = self._stream.__enter__()
        assert self._response.status_code == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for chunk in self._response.iter_raw():
                self.data += chunk.decode()
        except (httpx.HTTPError, httpx.StreamError):
            pass

    def wait_for(self, pattern: str) -> None:
        deadline = time.monotonic() + 15
        while not re.search(pattern, self.data):
            assert time.monotonic() < deadline, f"{pattern!r} never came: {self.data[-2000:]!r}"
            time.sleep(0.01)

    def close(self) -> None:
        self._client.close()


def test_a_full_disk_refuses_commands_with_503_tells_the_tab_and_fails_health(
    server_factory: Callable[..., Server], small_disk: Path, tmp_path: Path
) -> None:
    project = tmp_path / "guestbook"
    assert main(["new", str(project)]) == 0
    db = small_disk / "app.db"
    server = server_factory(
        "guestbook.app:app", cwd=project, startup_timeout=60,
        env={"APP_DB": str(db), "APP_BACKUPS": str(tmp_path / "backups"), "PYTHONPATH": f"{project}:{REPO}",
             "APP_SECRET": TEST_SECRET},
        args=["--log-config", str(REPO / "deploy" / "logging.json")],
    )  # fmt: skip

    health = httpx.get(f"{server.url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["cannot_write"] is None, health.text
    with signed_up(server.url, "ada") as ada:
        tab = Tab(ada)

        def sign(op: int) -> httpx.Response:
            body = json.dumps({"tab": tab.id, "op": op, "note": f"note {op}"})
            return ada.post("/sign", content=body, headers=SAME_ORIGIN)

        run_out_of_disk(server, small_disk, db, tab, sign)


def run_out_of_disk(
    server: Server, small_disk: Path, db: Path, tab: Tab, sign: Callable[[int], httpx.Response]
) -> None:
    """Sign, fill the disk, see every command refused and the tab told, free it, sign again."""
    try:
        assert sign(1).status_code == 204
        tab.wait_for("You signed as #1")
        filler = fill_disk(small_disk)

        # The WAL may still have room for a commit or two in its last page; then every one fails.
        answers = [sign(op) for op in range(2, 12)]
        codes = [r.status_code for r in answers]
        assert 503 in codes and set(codes) <= {204, 503}, codes
        first = codes.index(503)
        assert codes[first:] == [503] * (len(codes) - first), codes
        refused = answers[-1]
        assert refused.headers["content-type"].startswith("text/html")
        assert refused.text.startswith('<div id="lith-error" role="alert" class="lith-error">')
        assert "cannot save changes right now" in refused.text and "Traceback" not in refused.text
        # Datastar ignores an error's body: the fragment and `done` come down the tab's stream.
        tab.wait_for('datastar-patch-elements\ndata: elements <div id="lith-error"[^\n]*cannot save changes')
        tab.wait_for(r'datastar-patch-signals\ndata: signals \{"done": ?11\}')

        health = httpx.get(f"{server.url}/health", timeout=30)
        assert health.status_code == 503, health.text
        assert "SQLITE_FULL" in health.json()["cannot_write"], health.text
        # Once per cause, not once per command (nor per health check).
        log = server.output
        assert len(re.findall(r" ERROR fastapi_lith\.writer: writes fail: SQLITE_FULL", log)) == 1, log
        assert "Exception in ASGI application" not in log and "could not forward" not in log, log

        filler.unlink()
        health = httpx.get(f"{server.url}/health", timeout=30)
        assert health.status_code == 200 and health.json()["ok"] is True, health.text
        assert " INFO fastapi_lith.writer: writes succeed again" in server.output
        assert sign(12).status_code == 204
        tab.wait_for(r"You signed as #\d+\.")
    finally:
        tab.close()
    with closing(sqlite3.connect(db)) as conn:
        names = [row[0] for row in conn.execute("SELECT note FROM entry ORDER BY id")]
    # What answered 204 is there, what answered 503 is not, and nothing is lost.
    assert names == [f"note {op}" for op in [1, *[op for op, c in zip(range(2, 12), codes, strict=True) if c == 204], 12]]


# ----------------------------------------------------------------------------- in process
# The same full disk with the writer in the test's own process, so that each refusal's path
# (the cause read off SQLite's error, the one log line per cause, the probe) is one a mutation
# test can see (tests/MUTATION.md).

BLOBS = "CREATE TABLE blob (id INTEGER PRIMARY KEY, data BLOB NOT NULL);"


PUT = sa.text("INSERT INTO blob (data) VALUES (:data)")


class Put(Command):
    size: int

    def apply(self, tx: Tx) -> None:
        tx.execute(PUT, {"data": os.urandom(self.size)})
        tx.touch("blob")


async def test_a_full_disk_refuses_each_batch_with_its_cause_logs_it_once_and_a_write_ends_it(
    small_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_blob.sql").write_text(BLOBS)
    writer = Writer(small_disk / "app.db", migrations=migrations)
    await writer.start()
    caplog.set_level(logging.INFO, logger="fastapi_lith.writer")
    try:
        await writer.do(Put(size=1000))  # a write that never failed: no recovery to log
        assert await writer.probe() is None
        filler = fill_disk(small_disk)
        for _ in range(3):
            with pytest.raises(StorageError) as refused:
                await writer.do(Put(size=200_000))
            assert str(refused.value).startswith("the database cannot be written: SQLITE_FULL: "), refused.value
            assert isinstance(refused.value.__cause__, sqlite3.Error)
        # Larger than the page cache: SQLite writes pages out while the command's statement
        # runs, so the disk refuses the command itself, not the COMMIT; still the storage's fault.
        with pytest.raises(StorageError, match="^the database cannot be written: SQLITE_FULL: "):
            await writer.do(Put(size=3_000_000))
        why = await writer.probe()
        assert why is not None and "SQLITE_FULL" in why, why
        failing = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(failing) == 1, [r.getMessage() for r in failing]  # once per cause, not per command
        assert failing[0].getMessage().startswith("writes fail: SQLITE_FULL: ")
        assert failing[0].exc_info is not None and isinstance(failing[0].exc_info[1], sqlite3.Error)

        filler.unlink()
        await writer.do(Put(size=1000))
        assert await writer.probe() is None
        back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(back) == 1 and back[0].startswith("writes succeed again (they failed with SQLITE_FULL: "), back
    finally:
        await writer.close()


@pytest.mark.parametrize(
    "error",
    [
        sqlite3.OperationalError("disk I/O error"),  # no code: not known to be the storage's
        ValueError("the command's own"),
    ],
)
def test_only_sqlite_errors_with_a_storage_code_are_the_storage_s(error: BaseException) -> None:
    assert storage_cause(error) is None
    assert StorageState().refusal(error) is error


def test_an_extended_code_counts_by_its_primary_code_and_is_named_by_sqlite(tmp_path: Path) -> None:
    """SQLITE_READONLY_DBMOVED and the like are SQLITE_READONLY (code & 0xFF)."""
    path = tmp_path / "ro.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db, pytest.raises(sqlite3.Error) as caught:
        db.execute("INSERT INTO t VALUES (1)")
    exc = caught.value
    assert exc.sqlite_errorcode & 0xFF == 8  # type: ignore[attr-defined]
    assert storage_cause(exc) == f"{exc.sqlite_errorname}: {exc}"  # type: ignore[attr-defined]
    with closing(sqlite3.connect(path)) as db, pytest.raises(sqlite3.Error) as caught:
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        path.rename(tmp_path / "moved.db")  # under the open connection: the next write is refused
        db.execute("INSERT INTO t VALUES (2)")
    moved = caught.value
    assert storage_cause(moved) == "SQLITE_READONLY_DBMOVED: attempt to write a readonly database"
    extended = sqlite3.OperationalError("attempt to write a readonly database")
    extended.sqlite_errorcode = 8 | (4 << 8)  # type: ignore[attr-defined]  # SQLITE_READONLY_DBMOVED
    extended.sqlite_errorname = None  # type: ignore[attr-defined]  # a build that names none: the table's name
    assert storage_cause(extended) == "SQLITE_READONLY: attempt to write a readonly database"
