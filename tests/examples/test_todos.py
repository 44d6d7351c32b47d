"""The todos example: a sign-in, per-person views, server-set owners, one real uvicorn and file."""

from __future__ import annotations

import html
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect

from tests.support import REPO
from tests.support.browser import RECONNECT_AND_RELOAD_MS, Server, wait_for_datastar

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
COMMAND = {**SAME_ORIGIN, "Datastar-Request": "true"}
STREAM_URL = re.compile(r"@get\('([^']+)'")


def serve(server_factory: Callable[..., Server], tmp_path: Path) -> Server:
    env = {"TODOS_DB": str(tmp_path / "todos.db"), "TODOS_SECRET": "a test secret of some length"}
    return server_factory("examples.todos.app:app", cwd=REPO, env=env)


@contextmanager
def sign_up(server: Server, name: str) -> Iterator[httpx.Client]:
    """A client holding `name`'s session cookie, as a browser would after signing up."""
    with httpx.Client(base_url=server.url, headers=SAME_ORIGIN, timeout=30) as client:
        answer = client.post("/signup", data={"name": name, "password": "correct horse"})
        assert answer.status_code == 303 and answer.headers["location"] == "/", answer.text
        yield client


def stream_url(client: httpx.Client) -> str:
    page = client.get("/")
    assert page.status_code == 200, page.text
    match = STREAM_URL.search(html.unescape(page.text))
    assert match, page.text
    return match.group(1)


def first_event(client: httpx.Client, url: str, **headers: str) -> httpx.Response:
    """The stream's answer: its status, and the start of its body."""
    with client.stream("GET", url, headers={"Accept-Encoding": "identity", **headers}) as answer:
        answer.head = next(answer.iter_text(), "")  # type: ignore[attr-defined]
        return answer


def todos(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        query = "SELECT person.name, title FROM todo JOIN person ON person.id = todo.owner ORDER BY todo.id"
        return conn.execute(query).fetchall()


def test_a_person_streams_only_their_own_list(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = serve(server_factory, tmp_path)
    with sign_up(server, "alice") as alice, sign_up(server, "bob") as bob:
        mine = stream_url(alice)
        assert first_event(alice, mine).status_code == 200
        # Bob with Alice's URL: the token was signed for her.
        assert first_event(bob, mine).status_code == 403
        # Alice's URL with bob's list in it: the token covers the views it was signed for.
        bobs_id = re.search(r"todos/(\d+)", stream_url(bob)).group(1)  # type: ignore[union-attr]
        edited = re.sub(r"todos/\d+", f"todos/{bobs_id}", mine)
        assert first_event(alice, edited).status_code == 403
        # Signed out, the same URL is refused: the session no longer names her.
        alice.post("/signout")
        refused = first_event(alice, mine, **{"Datastar-Request": "true"})
        assert refused.status_code == 200 and 'id="lith-refused"' in refused.head  # type: ignore[attr-defined]


def test_the_owner_of_a_todo_is_who_is_signed_in(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = serve(server_factory, tmp_path)
    with sign_up(server, "alice") as alice, sign_up(server, "bob") as bob:
        bobs_id = int(re.search(r"todos/(\d+)", stream_url(bob)).group(1))  # type: ignore[union-attr]
        tab = {"tab": "t1", "op": 1}
        assert alice.post("/add", json={**tab, "title": "milk"}, headers=COMMAND).status_code == 204
        forged = alice.post("/add", json={**tab, "op": 2, "title": "bob's now", "owner": bobs_id}, headers=COMMAND)
        assert forged.status_code == 422 and "owner" in forged.text
        assert todos(tmp_path / "todos.db") == [("alice", "milk")]
        # Bob ticking Alice's todo: the update finds no todo of his, so it is refused (a tab
        # command's refusal answers 204; its outcome view says why) and hers stays open.
        ticked = bob.post("/toggle", json={"tab": "t2", "op": 1, "todo": 1}, headers=COMMAND)
        assert ticked.status_code == 204, ticked.text
        with sqlite3.connect(tmp_path / "todos.db") as conn:
            assert conn.execute("SELECT done FROM todo").fetchall() == [(0,)]
            assert conn.execute("SELECT message FROM lith_tab WHERE tab = 't2'").fetchall() == [
                ("That todo is not on your list.",)
            ]
        # Nobody signed in: no principal to own the todo.
        with httpx.Client(base_url=server.url, timeout=30) as nobody:
            assert nobody.post("/add", json={**tab, "title": "x"}, headers=COMMAND).status_code in (401, 403)
        assert todos(tmp_path / "todos.db") == [("alice", "milk")]


def sign_up_page(new_page: Callable[..., Page], server: Server, name: str) -> Page:
    page = new_page()
    page.goto(server.url + "/")
    page.get_by_label("name").fill(name)
    page.get_by_label("password").fill("correct horse")
    page.get_by_role("button", name="Sign up").click()
    expect(page.get_by_role("heading", name="Your todos")).to_be_visible()
    wait_for_datastar(page)
    return page


def add(page: Page, title: str) -> None:
    page.get_by_label("new todo").fill(title)
    page.get_by_role("button", name="Add").click()
    expect(page.locator("#todos")).to_contain_text(title)


def test_two_people_see_their_own_lists_and_a_shared_line(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(server_factory, tmp_path)
    alice = sign_up_page(new_page, server, "alice")
    bob = sign_up_page(new_page, server, "bob")
    add(alice, "milk")
    expect(bob.locator("#everyone")).to_have_text("alice: 1 open")  # the shared view, live
    add(bob, "bread")
    for page in (alice, bob):
        expect(page.locator("#everyone")).to_have_text("alice: 1 open, bob: 1 open")
    expect(alice.locator("#todos li")).to_have_text(["☐ milk"])
    expect(bob.locator("#todos li")).to_have_text(["☐ bread"])
    alice.get_by_role("button", name="toggle").click()
    for page in (alice, bob):
        expect(page.locator("#everyone")).to_have_text("bob: 1 open")
    expect(alice.locator("#todos li.done")).to_have_text(["☑ milk"])
    expect(bob.locator("#todos li")).to_have_text(["☐ bread"])


def test_signing_out_stops_every_tab_of_that_person(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(server_factory, tmp_path)
    alice = sign_up_page(new_page, server, "alice")
    other_tab = alice.context.new_page()  # the same browser: the same session cookie
    other_tab.goto(server.url + "/")
    wait_for_datastar(other_tab)
    bob = sign_up_page(new_page, server, "bob")
    add(bob, "bread")
    expect(alice.locator("#everyone")).to_have_text("bob: 1 open")
    other_tab.get_by_role("button", name="Sign out").click()
    expect(other_tab.get_by_role("button", name="Sign in")).to_be_visible()
    # Alice's first tab: its stream ended at once, its reconnect (within the stream's `retry:`,
    # up to `reconnect_within` after the end) was refused, so it reloads into the sign-in page
    # instead of receiving bob's next change.
    expect(alice.get_by_role("button", name="Sign in")).to_be_visible(timeout=RECONNECT_AND_RELOAD_MS)
    add(bob, "jam")
    expect(alice.locator("#everyone")).to_have_count(0)
