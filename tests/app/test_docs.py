"""The code the docs show is code the tests run.

The apps in docs/src/ are included into the pages by pymdownx.snippets; here they run for real,
from another working directory, online and offline. Pages that quote a generated app instead
quote it line for line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from fastapi_lith import Command, Rejected, Tx
from fastapi_lith.scaffold import render_text
from fastapi_lith.testing import Tabs
from tests.support import REPO
from tests.support.browser import DATASTAR_CACHE_DIR, NON_LOOPBACK_RE, Server, wait_for_datastar

DOCS = REPO / "docs"
SRC = DOCS / "src"
TEMPLATE_APP = REPO / "fastapi_lith" / "template" / "__package__" / "app.py.tmpl"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def offline(browser: Any) -> Any:
    """A browser context with no network but this machine: the Datastar CDN is unreachable."""
    context = browser.new_context()
    context.set_default_timeout(10_000)
    context.route(NON_LOOPBACK_RE, lambda route: route.abort("internetdisconnected"))
    return context


# -- the first page's counter ------------------------------------------------------------------


@pytest.fixture
def counter(server_factory: Callable[..., Server], tmp_path: Path) -> Server:
    """The app as `uvicorn app:app` runs it, started from a folder that is not its own."""
    return server_factory("app:app", cwd=tmp_path, args=["--app-dir", str(SRC / "counter")])


async def test_the_counters_add_returns_the_new_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = load(SRC / "counter" / "app.py", "docs_counter_app")
    async with Tabs(app.lith) as tabs:
        tab = await tabs.open("counter")
        assert await tab.do(app.Add(n=3)) == 3
        assert await tab.do(app.Add()) == 4
        await tabs.tick()
        assert tab.html("counter") == '<p id="counter">4</p>'
    assert (tmp_path / "counter.db").exists()


def test_the_counter_runs_from_another_folder_and_a_click_shows_in_every_tab(
    new_page: Callable[..., Page], counter: Server, tmp_path: Path
) -> None:
    a, b = new_page(), new_page()
    for page in (a, b):
        page.goto(counter.url + "/")
        wait_for_datastar(page)
        expect(page.locator("#no-datastar")).to_be_hidden()
    a.get_by_role("button", name="Add one").click()
    expect(b.locator("#counter")).to_have_text("1", timeout=5_000)
    expect(a.locator("#counter")).to_have_text("1")
    assert (tmp_path / "counter.db").exists()  # the working directory's, as the page says


def test_without_datastar_the_counter_says_so(browser: Any, counter: Server) -> None:
    context = offline(browser)
    page = context.new_page()
    page.goto(counter.url + "/")
    expect(page.get_by_role("alert")).to_have_text("Datastar did not load: reload to try again.")
    context.close()


# -- a local copy of Datastar ------------------------------------------------------------------


def test_a_local_copy_of_datastar_from_pypi_works_with_no_network(
    browser: Any, datastar_js: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """The page's script, run as it stands on this Python, makes the file the app serves."""
    folder = tmp_path / "app"
    shutil.copytree(SRC / "local_datastar", folder, ignore=shutil.ignore_patterns("__pycache__", "static"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cached = sorted(DATASTAR_CACHE_DIR.glob("starhtml-0.7.0-*.whl"))  # the datastar_js fixture's download
    if cached:  # the same pip resolution, from the wheel already here: PyPI's Requires-Python included
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(DATASTAR_CACHE_DIR))
    script = subprocess.run(["sh", "-e", "datastar_from_pypi.sh"], cwd=folder, env=env, capture_output=True, text=True)
    assert script.returncode == 0, script.stdout + script.stderr
    served = (folder / "static" / "datastar.js").read_bytes()
    assert served.startswith(b"// Datastar v1.0.1") and b'from "./datastar-core.js"' not in served
    assert not (folder / ".starhtml").exists()
    server = server_factory("app:app", cwd=folder)
    context = offline(browser)
    page = context.new_page()
    page.goto(server.url + "/")
    page.get_by_role("button", name="Click").click()
    page.get_by_role("button", name="Click").click()
    expect(page.locator("output")).to_have_text("2")
    context.close()


# -- pages that quote the generated project ----------------------------------------------------


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python[^\n]*\n(.*?)^```", markdown, flags=re.M | re.S)


def test_starting_quotes_the_generated_app_line_for_line() -> None:
    """Every Python block of starting.md is a run of lines of the app `new` writes."""
    app = render_text(TEMPLATE_APP.read_text(), name="guestbook", package="guestbook").splitlines()
    blocks = python_blocks((DOCS / "starting.md").read_text())
    assert len(blocks) >= 5
    for block in blocks:
        lines = block.rstrip("\n").splitlines()
        windows = (textwrap.dedent("\n".join(app[i : i + len(lines)])) for i in range(len(app)))
        assert "\n".join(lines) in set(windows), f"not in the generated app.py:\n{block}"


def test_the_datastar_attribute_example_says_what_it_makes() -> None:
    example = load(SRC / "datastar_attrs.py", "docs_datastar_attrs")
    assert example.send == (
        '@post("/cards", {"payload": {"tab": ($tab), "op": ($op), "title": ($new_title)}, '
        '"requestCancellation": "disabled"})'
    )
    assert dict(example.pending) == {"data-class": '{"pending": ($new_op == $op && $op != $done)}'}


async def test_one_process_may_pass_the_in_process_feed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi_lith.engine.feed import LocalFeed

    monkeypatch.chdir(tmp_path)
    example = load(SRC / "local_feed.py", "docs_local_feed")
    assert isinstance(example.lith.feed, LocalFeed)
    async with Tabs(example.lith):
        pass
    assert not (tmp_path / "app.db-lock").exists() and (tmp_path / "app.db").exists()  # no lock file


async def test_an_apps_own_parts(tmp_path: Path) -> None:
    example = load(SRC / "parts.py", "docs_parts")
    lith = example.make_lith(tmp_path / "parts.db")
    assert lith.writer.batch_size == 1
    async with Tabs(lith) as tabs:
        assert lith.hub.interval == 0.01
        tab = await tabs.open("outcome/{tab}")
        assert 'data-signals:done="0"' in tab.html("outcome/{tab}")


# -- tab commands ------------------------------------------------------------------------------


async def test_a_tab_command_says_what_happened_or_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    example = load(SRC / "tabs.py", "docs_tabs")
    async with Tabs(example.lith) as tabs:
        tab = await tabs.open("outcome/{tab}")
        assert "Nothing added from this tab yet." in tab.html("outcome/{tab}")
        assert await tab.do(example.Add(tab=tab.id, op=1, n=60)) == 60
        with pytest.raises(Rejected):
            await tab.do(example.Add(tab=tab.id, op=2, n=60))
        await tabs.tick()
        html = tab.html("outcome/{tab}")
        assert "The counter stops at 100: adding 60 would make 120." in html and 'data-signals:done="2"' in html


def test_a_tab_commands_page_and_route(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    import httpx

    server = server_factory("tabs:app", cwd=tmp_path, args=["--app-dir", str(SRC)])
    import html

    page = html.unescape(httpx.get(server.url + "/").text)
    assert '"op": 0, "done": 0, "n": 1' in page and '$op = $op + 1; @post("/add"' in page
    assert 'data-class="{"pending": ($op != $done)}"' in page
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
    for op, n in ((1, 99), (2, 5)):
        answer = httpx.post(server.url + "/add", json={"tab": "t1", "op": op, "n": n}, headers=headers)
        assert answer.status_code == 204  # the second is rejected: its tab is told, the route is fine
    import sqlite3

    with sqlite3.connect(tmp_path / "counter.db") as conn:
        assert conn.execute("SELECT count FROM counter").fetchone() == (99,)
        assert conn.execute("SELECT op, ok, message FROM lith_tab WHERE tab = 't1'").fetchone() == (
            2, 0, "The counter stops at 100: adding 5 would make 104.")


# -- the board of "Views and topics" and "Commands" --------------------------------------------


async def test_the_boards_views_commands_and_bulk_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    board = load(SRC / "board" / "app.py", "docs_board_app")
    async with Tabs(board.lith) as tabs:
        three, four = await tabs.open("board/3"), await tabs.open("board/4")
        await three.do(board.AddCard(board_id=3, title="Write docs"))
        assert await tabs.tick() == 1  # only board/3 renders
        assert three.html("board/3") == '<ul id="board-3"><li id="card-1" class="card">Write docs</li></ul>'
        assert four.html("board/4") == '<ul id="board-4"></ul>'

        await three.do(board.RenameCard(card_id=1, title="Write better docs"))
        with pytest.raises(Rejected, match="deleted a moment ago"):
            await three.do(board.RenameCard(card_id=99, title="Nothing"))
        await tabs.tick()
        assert "Write better docs" in three.html("board/3")

        cards = [board.NewCard(board_id=4, title=f"Card {i}", lane="todo") for i in range(2_500)]
        before = board.lith.writer.commands
        assert await board.import_cards(board.lith.writer, cards) == 2_500
        assert board.lith.writer.commands - before == 3  # one command per chunk of 1,000
        await tabs.tick()
        assert four.html("board/4").count("<li") == 2_500


class AddTitle(Command):
    title: str

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO card (board_id, title) VALUES (1, :title)", {"title": self.title})
        tx.touch("cards")


async def test_a_jinja2_view_escapes_the_data_and_marks_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    example = load(SRC / "jinja_view.py", "docs_jinja_view")
    async with Tabs(example.lith) as tabs:
        tab = await tabs.open("lane/todo")
        await tabs.do(AddTitle(title="<script>alert(1)</script>"))
        await tabs.tick()
        assert tab.html("lane/todo") == '<ul id="lane-todo"><li>&lt;script&gt;alert(1)&lt;/script&gt;</li></ul>'
        assert await example.lith.render("lane/todo") == tab.html("lane/todo")


def test_the_boards_routes(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    import httpx

    server = server_factory("app:app", cwd=tmp_path, args=["--app-dir", str(SRC / "board")])
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
    missing = httpx.post(server.url + "/cards/rename", json={"card_id": 7, "title": "x"}, headers=headers)
    assert missing.status_code == 409 and "deleted a moment ago" in missing.text  # an HTML fragment for Datastar
    assert missing.headers["content-type"].startswith("text/html")
    assert httpx.get(server.url + "/boards/1/count.json").json() == {"count": 0}
    assert httpx.get(server.url + f"/boards/{2**63}/count.json").status_code == 422  # not SQLite's OverflowError
    stats = httpx.get(server.url + "/stats.json").json()
    assert stats["commands"] == 1 and set(stats) >= {"ticks", "renders", "frames", "tick_ms"}


# -- a long list, delegated ---------------------------------------------------------------------


def test_a_delegated_list_is_the_size_the_docs_say() -> None:
    example = load(SRC / "delegate.py", "docs_delegate")
    rows = [{"id": i, "title": f"Card {i}"} for i in range(1, 2_001)]
    per_row, delegated = (str(f(rows)).encode() for f in (example.todo_list_sending_per_row, example.todo_list))
    text = " ".join((DOCS / "views.md").read_text().split())
    sizes = f"{round(len(per_row) / 1000)} KB of HTML per row `send()`, {round(len(delegated) / 1000)} KB delegated"
    assert sizes in text
    assert delegated.count(b"data-on:click") == 1 and per_row.count(b"data-on:click") == 2_000


def test_a_click_on_a_row_of_a_delegated_list_sends_its_command(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    import sqlite3

    server = server_factory("delegate:app", cwd=tmp_path, args=["--app-dir", str(SRC)])
    with sqlite3.connect(tmp_path / "board.db") as conn:  # migrated by the server's start
        conn.executemany("INSERT INTO card (board_id, title) VALUES (1, ?)", [("Card 1",), ("Card 2",), ("Card 3",)])
    page = new_page()
    page.goto(server.url + "/")
    wait_for_datastar(page)
    todo = page.locator("#todo li")
    expect(todo).to_have_text(["Card 1Done", "Card 2Done", "Card 3Done"])
    todo.nth(0).click(position={"x": 2, "y": 2})  # the row's text, not its button: nothing is sent
    todo.nth(1).get_by_role("button", name="Done").click()
    expect(todo).to_have_text(["Card 1Done", "Card 3Done"])
    expect(page.locator("#outcome .message")).to_have_text("Done.")
    with sqlite3.connect(tmp_path / "board.db") as conn:
        assert conn.execute("SELECT id FROM card WHERE lane = 'done'").fetchall() == [(2,)]
        assert conn.execute("SELECT op FROM lith_tab").fetchall() == [(1,)]  # the first click sent no op
    todo.nth(1).get_by_role("button", name="Done").click()  # each row sends its own id
    expect(todo).to_have_text(["Card 1Done"])
    no_errors = [m for m in page.console_log if m.startswith(("error", "pageerror"))]
    assert not no_errors, no_errors


# -- encoders, backups, virtual tabs -----------------------------------------------------------


def test_the_encoder_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi import HTTPException

    from fastapi_lith.engine.encoders import BrotliEncoder, GzipEncoder

    monkeypatch.chdir(tmp_path)
    example = load(SRC / "encoders_override.py", "docs_encoders_override")
    assert example.app.dependency_overrides[example.lith.encoder] is example.encoder
    assert isinstance(example.encoder("zstd, br, gzip;q=0.5"), BrotliEncoder)  # zstd is not on its list
    assert example.encoder("gzip").name == "gzip"
    with pytest.raises(HTTPException) as refused:
        example.encoder("zstd, identity;q=0")
    assert refused.value.status_code == 406
    example.force_gzip()
    assert isinstance(example.app.dependency_overrides[example.lith.encoder](), GzipEncoder)


@pytest.mark.parametrize("name", ["settings", "lifespan"])
async def test_the_backup_timer_copies_at_start(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.chdir(tmp_path)
    example = load(SRC / "backups" / f"{name}.py", f"docs_backups_{name}")
    async with example.app.router.lifespan_context(example.app):
        for _ in range(400):  # no copy in the folder yet: the first is due at once
            if list((tmp_path / "backups").glob("app-*.db")):
                break
            await asyncio.sleep(0.05)
    (copy,) = (tmp_path / "backups").glob("app-*.db")
    assert copy.with_name(copy.name + ".sha256").exists()


async def test_the_virtual_tabs_example_passes(tmp_path: Path) -> None:
    example = load(SRC / "tabs_test.py", "docs_tabs_test")
    await example.test_every_tab_sees_every_command(tmp_path)


# -- every block of code on every page ---------------------------------------------------------


def test_every_python_block_comes_from_a_file_the_tests_run() -> None:
    """A page's Python is included from docs/src/, or quotes the generated app line for line.

    One-line blocks (a setting, a call) are the exception.
    """
    app = render_text(TEMPLATE_APP.read_text(), name="guestbook", package="guestbook").splitlines()
    loose = []
    for page in sorted(DOCS.glob("*.md")):
        for block in python_blocks(page.read_text()):
            lines = block.rstrip("\n").splitlines()
            if len(lines) < 2 or all(line.startswith("--8<--") or not line.strip() for line in lines):
                continue
            windows = (textwrap.dedent("\n".join(app[i : i + len(lines)])) for i in range(len(app)))
            if "\n".join(lines) not in set(windows):
                loose.append(f"{page.name}:\n{block}")
    assert not loose, "\n\n".join(loose)


async def test_the_replication_example_replicates_and_reports_its_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APP_REPLICA", (tmp_path / "replica").as_uri())
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)  # Litestream's S3 client refuses it; unused here
    example = load(SRC / "backups" / "replica.py", "docs_backups_replica")
    async with example.app.router.lifespan_context(example.app):
        transport = httpx.ASGITransport(app=example.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://docs") as client:
            health = (await client.get("/health")).json()
    assert health["ok"] is True and health["replica"]["replicating"] is True
    assert any((tmp_path / "replica").rglob("*")), "Litestream wrote nothing to the replica"


async def test_a_keyed_command_retried_applies_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    example = load(SRC / "retries.py", "docs_retries")
    async with Tabs(example.lith):
        first = await example.lith.writer.do(example.Add(n=5, tab="t1", op=1))
        again = await example.lith.writer.do(example.Add(n=5, tab="t1", op=1))
        other = await example.lith.writer.do(example.Add(n=5, tab="t1", op=2))
        told = await example.lith.writer.do(example.AddAndTell(n=1, tab="t1", op=3))
        told_again = await example.lith.writer.do(example.AddAndTell(n=1, tab="t1", op=3))
    assert (first, again, other) == (5, 5, 10)
    assert told == told_again and isinstance(told_again, example.Total) and told_again.count == 11


async def test_the_apps_own_wording_is_what_the_page_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    monkeypatch.chdir(tmp_path)
    example = load(SRC / "wording.py", "docs_wording")
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
    async with example.app.router.lifespan_context(example.app):
        transport = httpx.ASGITransport(app=example.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://docs") as client:
            too_big = await client.post("/add", json={"n": 500}, headers=headers)
            unreadable = await client.post("/add", content=b"{", headers={**headers, "Content-Type": "application/json"})
    assert too_big.status_code == 422 and "Pick a number from 1 to 100." in too_big.text
    assert unreadable.status_code == 422 and "reload it and try again" in unreadable.text


async def test_one_process_apps_write_no_feed_rows_and_take_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    monkeypatch.chdir(tmp_path)
    example = load(SRC / "one_process.py", "docs_one_process")
    async with Tabs(example.lith):
        await example.lith.writer.do(Bump())
    with sqlite3.connect(tmp_path / "app.db") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "lith_feed" not in tables and not (tmp_path / "app.db-lock").exists()
    assert not (tmp_path / "app.db-wake").exists()  # nobody to ring


class Bump(Command):
    def apply(self, tx: Any) -> None:
        tx.execute("UPDATE counter SET count = count + 1 WHERE id = 1")
        tx.touch("counter")


# -- forms and uploads -------------------------------------------------------------------------


def test_the_upload_example(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    import sqlite3

    import httpx

    server = server_factory("app:app", cwd=tmp_path, args=["--app-dir", str(SRC / "forms")])
    page = httpx.get(server.url + "/").text
    assert 'enctype="multipart/form-data"' in page and 'name="tab"' in page and "contentType" in page
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}

    def upload(op: int, caption: str, size: int) -> httpx.Response:
        fields = {"tab": "t1", "op": str(op), "caption": caption}
        return httpx.post(server.url + "/photos", data=fields, files={"photo": ("cat.jpg", b"\xff" * size)}, headers=headers)

    assert upload(1, "A cat", 100_000).status_code == 204  # past the app's 64 KiB: the route's own limit
    assert upload(2, "The same cat", 10).status_code == 204  # rejected: its tab is told, as `lith.command` does
    refused = upload(3, "", 10)
    assert refused.status_code == 422 and refused.text.startswith('<div id="lith-error"')
    with sqlite3.connect(tmp_path / "photos.db") as conn:
        assert conn.execute("SELECT caption, size FROM photo").fetchall() == [("A cat", 100_000)]
        assert conn.execute("SELECT op, ok, message FROM lith_tab").fetchone() == (
            2, 0, "cat.jpg is here already, so nothing changed.")


# -- fields the server sets ----------------------------------------------------------------------


def test_the_owner_is_the_signed_in_user_whatever_the_body_says(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    import sqlite3

    import httpx

    server = server_factory("app:app", cwd=tmp_path, args=["--app-dir", str(SRC / "owners")],
                            env={"SESSION_SECRET": "a secret for the docs' test only"})
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
    with httpx.Client(base_url=server.url, headers=headers) as nobody:
        assert nobody.post("/tasks", json={"tab": "t1", "op": 1, "title": "Sneak"}).status_code == 401
    with httpx.Client(base_url=server.url, headers=headers) as alice:
        assert alice.post("/sign-in", data={"user": "alice"}).status_code == 204
        assert alice.post("/tasks", json={"tab": "t1", "op": 1, "title": "Sketch"}).status_code == 204
        forged = alice.post("/tasks", json={"tab": "t1", "op": 2, "title": "Sell", "owner": "bob"})
        assert forged.status_code == 422
        assert "<strong>owner</strong>: The server sets this field: a request cannot send it" in forged.text
        assert alice.post("/tasks/new", json={"tab": "t1", "op": 3, "title": "Ship"}).json() == 2
    with sqlite3.connect(tmp_path / "tasks.db") as conn:
        assert conn.execute("SELECT title, owner, team FROM task ORDER BY id").fetchall() == [
            ("Sketch", "alice", "design"), ("Ship", "alice", "design")]
    schema = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["AddTaskBody"]
    assert sorted(schema["properties"]) == ["op", "tab", "title"]
