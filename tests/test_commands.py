"""The per-tab protocol the library owns: `TabCommand`, `Rejected`, the outcome view, the page
helpers, and command routes made by `lith.command`."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from fastapi_lith import Lith, Rejected, TabCommand, Tx, WriterClosed, pending, send, tab_signals
from fastapi_lith.testing import Tabs

HERE = Path(__file__).parent
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


async def test_an_app_may_replace_the_outcome_view(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)

    @lith.view("outcome/{tab}", topics={"tab:{tab}"})
    def mine(db: object, tab: str) -> str:
        return f'<p id="outcome">mine {tab}</p>'

    async with Tabs(lith) as tabs:
        alice = await tabs.open("outcome/{tab}")
        assert alice.html("outcome/{tab}") == f'<p id="outcome">mine {alice.id}</p>'


def test_the_tab_id_is_checked_in_one_place() -> None:
    with pytest.raises(ValidationError):
        AddNote(tab="no spaces", op=1, text="x")
    with pytest.raises(ValidationError):
        AddNote(tab="t", op=-1, text="x")
    with pytest.raises(ValueError):
        tab_signals("a/b")
    assert tab_signals("t1", n=1) == {"data-signals": '{"tab": "t1", "op": 0, "done": 0, "n": 1}'}


def test_the_page_helpers() -> None:
    assert send("/add") == '$op = $op + 1; @post("/add", {"requestCancellation": "disabled"})'
    body = send("/cards/move", card_id="$drag")
    assert body.startswith("$op = $op + 1; @post(\"/cards/move\"")
    assert '"payload": {"tab": ($tab), "op": ($op), "card_id": ($drag)}' in body
    attrs = pending()
    assert attrs["data-class"] == '{"pending": ($op != $done)}'
    assert "$busy == 3" in pending("$busy == 3")["data-class"]


async def test_touch_later_re_renders_through_the_writer(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", migrations=MIGRATIONS)
    renders = []

    @lith.view("clock", topics={"clock"})
    def clock(db: object) -> str:
        renders.append(1)
        return f'<p id="clock">{len(renders)}</p>'

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


# -- routes ---------------------------------------------------------------------------------------


@pytest.fixture
def server(server_factory: Callable[..., object], tmp_path: Path) -> object:
    return server_factory("commandsapp:app", cwd=HERE, env={"COMMANDS_DB": str(tmp_path / "c.db")})


def test_one_line_routes_answer_204_and_stay_out_of_openapi(server: object, tmp_path: Path) -> None:
    url = server.url  # type: ignore[attr-defined]
    ok = httpx.post(url + "/notes", json={"tab": "t1", "op": 1, "text": "hi"}, headers=SAME_ORIGIN)
    assert ok.status_code == 204 and ok.content == b""
    # Rejected tab command: 204, the tab's outcome view has the message, nothing else written.
    no = httpx.post(url + "/notes", json={"tab": "t1", "op": 2, "text": "no"}, headers=SAME_ORIGIN)
    assert no.status_code == 204
    assert notes(tmp_path / "c.db") == ["hi"]
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
