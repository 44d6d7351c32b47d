"""The per-tab protocol the library owns: `TabCommand`, `Rejected`, the outcome view, the page
helpers, and command routes made by `lith.command`."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from markupsafe import Markup
from playwright.sync_api import Page, expect
from pydantic import ValidationError

from fastapi_lith import (
    Accounts,
    Command,
    FromServer,
    Lith,
    LithError,
    OutcomeLost,
    Rejected,
    TabCommand,
    Tx,
    WriterClosed,
    new_tab,
    pending,
    send,
    tab_signals,
)
from fastapi_lith.testing import Tabs
from tests.support import SUPPORT
from tests.support.browser import Server, wait_for_datastar

HERE = SUPPORT  # the helper apps' folder
MIGRATIONS = HERE / "commands_migrations"
SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


class AddNote(TabCommand):
    text: str

    def apply(self, tx: Tx) -> int:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))
        tx.touch("notes")
        if self.text == "no":
            raise Rejected("Notes cannot say no.")
        if self.text == "bug":
            raise KeyError("a bug")
        self.say(f"Noted: {self.text}.")
        return 7


def notes(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT text FROM note ORDER BY id")]


async def test_a_tab_command_tells_its_tab_and_moves_done(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        bob = await tabs.open("outcome/{tab}")
        assert 'data-signals:done="0"' in alice.html("outcome/{tab}")
        assert await alice.do(AddNote(tab=alice.id, op=3, text="hello")) == 7
        await tabs.tick()
        html = alice.html("outcome/{tab}")
        assert "Noted: hello." in html and 'data-signals:done="3"' in html and 'data-signals:ok_op="3"' in html
        assert "Noted" not in bob.html("outcome/{tab}")  # only the tab that sent it is told


async def test_rejected_rolls_back_and_only_the_outcome_is_written(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        with pytest.raises(Rejected, match="Notes cannot say no."):
            await alice.do(AddNote(tab=alice.id, op=1, text="no"))
        await tabs.tick()
        html = alice.html("outcome/{tab}")
        assert 'class="message failed"' in html and "Notes cannot say no." in html
        assert 'data-signals:done="1"' in html and "ok_op" not in html
        # A retry of the same op is not applied again, and says the same.
        with pytest.raises(Rejected, match="Notes cannot say no."):
            await alice.do(AddNote(tab=alice.id, op=1, text="no"))
        # A bug is not shown as is: the tab gets a general message, the caller the error.
        with pytest.raises(KeyError):
            await alice.do(AddNote(tab=alice.id, op=2, text="bug"))
        await tabs.tick()
        assert "Something went wrong, so nothing changed." in alice.html("outcome/{tab}")
    assert notes(tmp_path / "a.db") == []


class AddNoteAgain(AddNote):
    pass


async def test_commands_of_two_classes_with_the_same_tab_and_op_both_apply(tmp_path: Path) -> None:
    # The key names the class: another command of the same click is not taken for a repeat.
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        assert await alice.do(AddNote(tab=alice.id, op=1, text="one")) == 7
        assert await alice.do(AddNoteAgain(tab=alice.id, op=1, text="two")) == 7
        assert await alice.do(AddNote(tab=alice.id, op=1, text="three")) == 7  # a repeat of the first
    assert notes(tmp_path / "a.db") == ["one", "two"]


class SignedNote(TabCommand):
    text: str
    owner: Annotated[str, FromServer()]

    def apply(self, tx: Tx) -> str:
        tx.execute("INSERT INTO note (text) VALUES (?)", (f"{self.owner}: {self.text}",))
        return self.owner


async def test_who_sent_a_click_is_part_of_its_key(tmp_path: Path) -> None:
    # Another principal naming the same tab and op is another click: it neither reads the first
    # one's outcome nor stops it applying. The same principal's repeat is still a repeat.
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        tab = await tabs.open("outcome/{tab}")
        assert await tab.do(SignedNote(tab=tab.id, op=1, text="mine", owner="mallory")) == "mallory"
        assert await tab.do(SignedNote(tab=tab.id, op=1, text="hers", owner="alice")) == "alice"
        assert await tab.do(SignedNote(tab=tab.id, op=1, text="again", owner="alice")) == "alice"
    assert notes(tmp_path / "a.db") == ["mallory: mine", "alice: hers"]


async def test_an_older_op_landing_late_does_not_move_done_back(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        await alice.do(AddNote(tab=alice.id, op=5, text="new"))
        await alice.do(AddNote(tab=alice.id, op=4, text="old"))
        await tabs.tick()
        html = alice.html("outcome/{tab}")
        assert 'data-signals:done="5"' in html and "Noted: new." in html
    assert notes(tmp_path / "a.db") == ["new", "old"]


class AddQuietly(TabCommand):
    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES ('quiet')")


async def test_a_new_op_starts_a_fresh_outcome(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS, outcome_hint="Nothing yet.")
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        assert '<p class="message hint" data-show="$done == 0">Nothing yet.</p>' in alice.html("outcome/{tab}")
        await alice.do(AddNote(tab=alice.id, op=1, text="hello"))
        await tabs.tick()
        # The message is op 1's: shown while `done` is 1, hidden once an error for op 2 sets it to 2.
        assert '<p class="message ok" data-show="$done == 1">Noted: hello.</p>' in alice.html("outcome/{tab}")
        await alice.do(AddQuietly(tab=alice.id, op=2))
        await tabs.tick()
        html = alice.html("outcome/{tab}")
        assert 'data-signals:done="2"' in html and 'data-signals:ok_op="2"' in html
        assert "Noted" not in html and "<p" not in html  # no message, not the last one nor an empty one


async def test_op_0_is_no_click_so_it_leaves_the_outcome_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice, bob = await tabs.open("outcome/{tab}"), await tabs.open("outcome/{tab}")
        await alice.do(AddNote(tab=alice.id, op=3, text="first"))
        await tabs.tick()
        before = alice.html("outcome/{tab}")
        with caplog.at_level("WARNING", logger="fastapi_lith"):
            assert await alice.do(AddNote(tab=alice.id, op=0, text="zero")) == 7
            await bob.do(AddNote(tab=bob.id, text="none"))  # op 0 by default
        await tabs.tick()
        assert alice.html("outcome/{tab}") == before  # `done` stays 3, the message op 3's
        assert 'data-signals:done="0"' in bob.html("outcome/{tab}") and "Noted" not in bob.html("outcome/{tab}")
        said = [r.getMessage() for r in caplog.records if "op 0" in r.getMessage()]
        assert said[0] == ("AddNote said 'Noted: zero.' with op 0, so no tab is told: a page's send() "
                           "numbers its clicks from 1")
        assert len(said) == 2
        caplog.clear()
        with caplog.at_level("WARNING", logger="fastapi_lith"):
            await alice.do(AddQuietly(tab=alice.id))  # said nothing: nothing to warn of
            with pytest.raises(Rejected):
                await alice.do(AddNote(tab=alice.id, text="no"))  # said nothing before it failed
        assert caplog.records == []
    assert notes(tmp_path / "a.db") == ["first", "zero", "none", "quiet"]  # applied all the same
    with sqlite3.connect(tmp_path / "a.db") as conn:
        assert conn.execute("SELECT count(*) FROM lith_tab").fetchone() == (1,)


async def test_an_app_may_replace_the_outcome_view(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)

    @lith.view("outcome/{tab}", topics={"tab:{tab}"})
    def mine(db: object, tab: str) -> Markup:
        return Markup('<p id="outcome">mine {}</p>').format(tab)

    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        assert alice.html("outcome/{tab}") == f'<p id="outcome">mine {alice.id}</p>'


def test_the_tab_id_is_checked_in_one_place() -> None:
    with pytest.raises(ValidationError):
        AddNote(tab="no spaces", op=1, text="x")
    with pytest.raises(ValidationError):
        AddNote(tab="t", op=-1, text="x")
    with pytest.raises(ValueError, match=r"bad tab id 'a/b': 1 to 64 letters"):
        tab_signals("a/b")
    assert tab_signals("t1", n=1) == {"data-signals": '{"tab": "t1", "op": 0, "done": 0, "n": 1}'}


def test_the_page_helpers() -> None:
    assert send("/add") == '$op = $op + 1; @post("/add", {"requestCancellation": "disabled"})'
    body = send("/cards/move", card_id="$drag")
    assert body.startswith("$op = $op + 1; @post(\"/cards/move\"")
    assert body.endswith('"payload": {"tab": ($tab), "op": ($op), "card_id": ($drag)}, "requestCancellation": "disabled"})')
    # A screen reader hears the button busy too, not only the page's CSS.
    assert pending() == {
        "data-class": '{"pending": ($op != $done)}',
        "data-attr": '{"aria-busy": (($op != $done) ? \'true\' : false)}',
    }
    assert "$busy == 3" in pending("$busy == 3")["data-class"]
    tabs = {new_tab() for _ in range(20)}
    assert len(tabs) == 20 and all(re.fullmatch(r"[A-Za-z0-9_-]{12}", tab) for tab in tabs)


def test_delegate_reads_the_rows_attribute_and_refuses_what_is_not_one() -> None:
    from fastapi_lith import delegate

    click = delegate("/cards/finish", "data-card-id", lane_id="row.dataset.lane")["data-on:click"]
    assert click.startswith("const row = evt.target.closest('[data-card-id]'); if (row && el.contains(row)) {")
    assert '"card_id": (row.getAttribute(\'data-card-id\')), "lane_id": (row.dataset.lane)' in click
    for bad in ("card-id", "data-Card", "data-card]", "data-"):
        with pytest.raises(ValueError, match="data attribute"):
            delegate("/x", bad)
    with pytest.raises(ValueError, match="'card_id' is the field"):
        delegate("/x", "data-card-id", card_id="1")


async def test_touch_later_re_renders_through_the_writer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    renders = []

    @lith.view("clock", topics={"clock"})
    def clock(db: object) -> Markup:
        renders.append(1)
        return Markup('<p id="clock">{}</p>').format(len(renders))

    async with Tabs(lith) as tabs:
        tab = await tabs.open("clock")
        commands = lith.writer.commands
        lith.touch_later(0.01, "clock")
        for _ in range(500):
            if lith.writer.commands > commands:
                break
            await asyncio.sleep(0.01)
        await tabs.tick()
        assert tab.html("clock") == '<p id="clock">2</p>'
        lith.touch_later(60, "clock")  # pending at shutdown: dropped, no error
    with pytest.raises(WriterClosed):
        await lith.writer.do(AddNote(tab="t", text="late"))
    lith.touch_later(0, "clock")  # after the stop: dropped too
    later = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "touch"]  # touch_later's
    assert len(later) == 1
    await asyncio.gather(*later)  # no WriterClosed out of it
    await asyncio.sleep(0)  # the task's done callbacks
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_lith_writer_outside_a_request_applies_a_keyed_command_once(tmp_path: Path) -> None:
    """A background job's retry: the key is the job's own, `lith.writer` the app's writer."""
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith):
        first = await lith.writer.do(AddNote(tab="t", text="nightly"), key="job:2026-12-03")
        again = await lith.writer.do(AddNote(tab="t", text="nightly"), key="job:2026-12-03")
        assert again == first
    with sqlite3.connect(tmp_path / "a.db") as conn:
        assert conn.execute("SELECT text FROM note").fetchall() == [("nightly",)]


def test_accounts_writer_outside_a_request_names_the_way_to_one(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path / "accounts", migrations=MIGRATIONS)
    with pytest.raises(LithError) as refused:
        accounts.writer.commands  # noqa: B018  # any use of it
    assert str(refused.value) == "accounts.writer has no writer of its own outside a request: use accounts.use(name)"


def test_a_dunder_probed_on_accounts_writer_is_missing_by_its_name(tmp_path: Path) -> None:
    """copy, pickle and inspect look for dunders such as `__wrapped__`: none is the writer's,
    so the probe finds nothing, and says which name it missed, not that no writer is open."""
    accounts = Accounts(tmp_path / "accounts", migrations=MIGRATIONS)
    assert not hasattr(accounts.writer, "__wrapped__")
    with pytest.raises(AttributeError) as missing:
        accounts.writer.__wrapped__  # noqa: B018
    assert str(missing.value) == "__wrapped__"


# -- routes ---------------------------------------------------------------------------------------


@pytest.fixture
def server(app_server: Callable[..., object], tmp_path: Path) -> object:
    return app_server("commandsapp:app", env={"COMMANDS_DB": str(tmp_path / "c.db")})


def test_one_line_routes_answer_204_and_stay_out_of_openapi(server: object, tmp_path: Path) -> None:
    url = server.url  # type: ignore[attr-defined]
    ok = httpx.post(url + "/notes", json={"tab": "t1", "op": 1, "text": "hi"}, headers=SAME_ORIGIN)
    assert ok.status_code == 204 and ok.content == b""
    # Rejected tab command: 204, the tab's outcome view has the message, nothing else written.
    no = httpx.post(url + "/notes", json={"tab": "t1", "op": 2, "text": "no"}, headers=SAME_ORIGIN)
    assert no.status_code == 204
    assert notes(tmp_path / "c.db") == ["hi"]
    # An apply that returned a coroutine is the app's bug: a 500, not a 204 that wrote nothing.
    deferred = httpx.post(url + "/deferred", json={"tab": "t2", "op": 1, "text": "lost"}, headers=SAME_ORIGIN)
    assert deferred.status_code == 500
    assert notes(tmp_path / "c.db") == ["hi"]
    with sqlite3.connect(tmp_path / "c.db") as conn:  # and its tab is told it failed
        assert conn.execute("SELECT ok FROM lith_tab WHERE tab = 't2'").fetchone() == (0,)
    with sqlite3.connect(tmp_path / "c.db") as conn:
        assert conn.execute("SELECT op, ok, message FROM lith_tab WHERE tab = 't1'").fetchone() == (
            2, 0, "Notes cannot say no.")
    # Still a guarded command route: cross-site refused, bad body refused as HTML.
    assert httpx.post(url + "/notes", json={"tab": "t1", "text": "x"}).status_code == 403
    bad = httpx.post(url + "/notes", json={"tab": "t 1", "text": "x"}, headers=SAME_ORIGIN)
    assert bad.status_code == 422 and bad.text.startswith('<div id="lith-error"')
    paths = httpx.get(url + "/openapi.json").json()["paths"]
    assert "/notes" not in paths and "/purge" not in paths and "/lith/stream" not in paths


def test_a_route_takes_other_dependencies_and_a_plain_rejection_is_409(server: object, tmp_path: Path) -> None:
    url = server.url  # type: ignore[attr-defined]
    assert httpx.post(url + "/notes", json={"tab": "t1", "text": "kept"}, headers=SAME_ORIGIN).status_code == 204
    refused = httpx.post(url + "/purge", json={"confirm": True}, headers=SAME_ORIGIN)
    assert refused.status_code == 401 and "admins only" in refused.text
    admin = {**SAME_ORIGIN, "X-Admin": "yes"}
    rejected = httpx.post(url + "/purge", json={"confirm": False}, headers=admin)
    assert rejected.status_code == 409 and "Say confirm to purge." in rejected.text
    assert re.match(r'<div id="lith-error"', rejected.text)
    assert notes(tmp_path / "c.db") == ["kept"]
    assert httpx.post(url + "/purge", json={"confirm": True}, headers=admin).status_code == 204
    assert notes(tmp_path / "c.db") == []


def test_a_tab_command_rejected_with_op_0_is_409_as_no_outcome_holds_its_message(server: object) -> None:
    url = server.url  # type: ignore[attr-defined]
    for body in ({"tab": "t1", "text": "no"}, {"tab": "t1", "op": 0, "text": "no"}):
        rejected = httpx.post(url + "/notes", json=body, headers=SAME_ORIGIN)
        assert rejected.status_code == 409 and "Notes cannot say no." in rejected.text
        assert rejected.text.startswith('<div id="lith-error"')
    assert httpx.post(url + "/notes", json={"tab": "t1", "op": 1, "text": "no"}, headers=SAME_ORIGIN).status_code == 204


def test_a_new_op_starts_a_fresh_outcome_in_the_page(new_page: Callable[..., Page], server: Server) -> None:
    """What a person sees: each click's outcome replaces the last, an error included."""
    page = new_page()
    page.goto(server.url + "/")
    wait_for_datastar(page)
    outcome, error = page.locator("#outcome .message"), page.locator("#lith-error")
    note, add = page.get_by_label("Note"), page.get_by_role("button", name="Add", exact=True)
    note.fill("hello")
    add.click()
    expect(outcome).to_have_text("Noted: hello.")  # through the stream: it is live from here on
    note.fill("x" * 41)
    add.click()  # 422, pushed to this tab with `done` set to this op
    expect(error).to_contain_text("at most 40 characters")
    expect(page.get_by_text("Noted: hello.")).to_be_hidden()  # not left above the error
    note.fill("no")
    add.click()
    expect(page.get_by_role("alert")).to_have_text("Notes cannot say no.")
    expect(error).to_be_empty()  # the outcome of the new op replaced the error
    page.get_by_role("button", name="Add quietly").click()
    expect(page.get_by_text("Notes cannot say no.")).to_have_count(0)  # said nothing: no message
    expect(page.locator("[aria-busy=true]")).to_have_count(0)  # nothing left pending


def test_a_page_render_refuses_a_parameter_sqlite_cannot_store_with_400(server: object) -> None:
    url = server.url  # type: ignore[attr-defined]
    assert httpx.get(url + "/notes/1").text == '<main><p id="note-1">No such note.</p></main>'
    for path in ("/notes/", "/notes-by-param/"):
        for note_id in (2**63, -(2**63) - 1):
            page = httpx.get(f"{url}{path}{note_id}")
            assert page.status_code == 400, (path, note_id, page.text)
            assert "outside SQLite's integers" in page.json()["detail"]
    # the stream's answer for the same key: the same check, the same words
    stream = httpx.get(f"{url}/lith/stream?views=note/{2**63}&tab=t1")
    assert stream.status_code == 400 and "outside SQLite's integers" in stream.text
    assert "Traceback" not in server.output  # type: ignore[attr-defined]


# -- mistakes that must not pass silently ------------------------------------------------------


@pytest.mark.parametrize("base", [Command, TabCommand])
def test_an_async_apply_is_refused_when_the_class_is_defined(base: type[Command]) -> None:
    said = (r"Later\.apply is async def, but the writer runs it on its thread inside a transaction and "
            r"cannot await it: write a plain def apply\(self, tx\), and do awaited work in the route "
            r"before writer\.do$")
    with pytest.raises(TypeError, match=said):
        class Later(base):  # type: ignore[valid-type,misc]
            async def apply(self, tx: Tx) -> None:
                tx.execute("INSERT INTO note (text) VALUES ('x')")
    with pytest.raises(TypeError, match=said):
        class Later(base):  # type: ignore[valid-type,misc,no-redef]
            async def apply(self, tx: Tx) -> object:  # an async generator: no more awaitable
                yield tx.execute("INSERT INTO note (text) VALUES ('x')")


class Forgot(TabCommand):
    text: str

    def apply(self, tx: Tx) -> object:
        tx.execute("INSERT INTO note (text) VALUES (?)", (self.text,))
        return self.later(tx)  # a coroutine: the writer cannot await it

    async def later(self, tx: Tx) -> None:
        tx.execute("INSERT INTO note (text) VALUES ('later')")


class _Awaitable:
    def __await__(self) -> object:
        return iter(())


class Awaits(TabCommand):
    def apply(self, tx: Tx) -> object:
        tx.execute("INSERT INTO note (text) VALUES ('awaited')")
        return _Awaitable()


async def test_an_apply_returning_an_awaitable_fails_and_writes_nothing(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the coroutine is closed, never left to warn
            with pytest.raises(TypeError, match="Forgot.apply returned a coroutine"):
                await alice.do(Forgot(tab=alice.id, op=1, text="lost"))
            gc.collect()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Another awaitable than a coroutine: named as what it is, and nothing to close.
            with pytest.raises(TypeError, match=r"^Awaits\.apply returned an awaitable, which the writer "
                               r"cannot await: apply must do its work itself, synchronously$"):
                await alice.do(Awaits(tab=alice.id, op=2))
            gc.collect()
        assert [str(w.message) for w in caught] == []
        assert await alice.do(AddNote(tab=alice.id, op=3, text="kept")) == 7
        await tabs.tick()
        assert "Noted: kept." in alice.html("outcome/{tab}")
    assert notes(tmp_path / "a.db") == ["kept"]


# -- what the mutants of outcomes.py once changed unseen -------------------------------------------


async def test_the_outcome_view_exactly_and_a_repeat_of_a_command_that_returned_none(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        assert alice.html("outcome/{tab}") == (
            '<div id="outcome" class="outcome" data-signals:done="0" role="status"><div id="lith-error"></div></div>')
        with pytest.raises(Rejected):
            await alice.do(AddNote(tab=alice.id, op=1, text="no"))
        await tabs.tick()
        assert alice.html("outcome/{tab}") == (
            '<div id="outcome" class="outcome" data-signals:done="1" role="status"><p class="message failed" '
            'data-show="$done == 1" role="alert">Notes cannot say no.</p><div id="lith-error"></div></div>')
        assert await alice.do(AddQuietly(tab=alice.id, op=2)) is None
        assert await alice.do(AddQuietly(tab=alice.id, op=2)) is None  # found, not applied again
    assert notes(tmp_path / "a.db") == ["quiet"]


def test_an_outcome_that_cannot_be_stored_or_read_back_says_so() -> None:
    from fastapi_lith import OutcomeRefused
    from fastapi_lith.engine.outcomes import dump_outcome, load_outcome

    _, lost = load_outcome(AddNote, dump_outcome(AddNote, lambda: None, None))
    assert type(lost) is OutcomeLost and str(lost) == (
        "the command was applied once; its result (function) could not be stored as int: "
        "Input should be a valid integer")
    _, error = load_outcome(AddNote, dump_outcome(AddNote, None, KeyError("a bug")))
    assert str(error) == "the first send of this command failed with KeyError: 'a bug'; it is not applied again"
    _, refused = load_outcome(AddNote, b"not JSON")
    assert type(refused) is OutcomeRefused and str(refused) == (
        "the command's first send committed, so it is not applied again, but its recorded outcome is refused: "
        "not JSON of an outcome with a result of int (Invalid JSON: expected ident at line 1 column 2)")
