"""The kanban example in a real browser: two people on one board, a real uvicorn, a real file.

Each browser test starts its own server on a temporary database (seeded with the 12-card demo
board on first start) and opens two pages, `a` and `b`, as two people would.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, Route, expect

from browser import Server, wait_for_datastar

REPO = Path(__file__).resolve().parent.parent
APP = "examples.kanban.app:app"
VIEWPORT = {"width": 1440, "height": 900}
LIVE = 10_000  # ms: a generous deadline for a change to show in the other page, not a timing


# -- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "kanban.db"


@pytest.fixture
def server(server_factory: Callable[..., Server], db_path: Path) -> Server:
    return server_factory(APP, cwd=REPO, env={"KANBAN_DB": str(db_path)})


@pytest.fixture
def two_pages(new_page: Callable[..., Page], server: Server) -> tuple[Page, Page]:
    """Two people on board 1, both streams live (each sees both in the presence list)."""
    a, b = open_board(new_page, server), open_board(new_page, server)
    for page in (a, b):
        expect(page.locator(".presence-count")).to_have_text("2 viewing", timeout=5_000)
    return a, b


def open_board(new_page: Callable[..., Page], server: Server) -> Page:
    page = new_page(viewport=VIEWPORT)
    page.goto(f"{server.url}/boards/1")
    wait_for_datastar(page)
    return page


def card(page: Page, title: str) -> Any:
    return page.locator(".card", has=page.locator(".card-title", has_text=re.compile(f"^{re.escape(title)}$")))


def add_card(page: Page, title: str, description: str = "") -> None:
    page.fill("#new-card-title", title)
    page.fill("#new-card-description", description)
    page.get_by_role("button", name="Add card").click()


def rows(db_path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(sql, params).fetchall()


def no_page_errors(*pages: Page) -> None:
    for page in pages:
        errors = [m for m in page.console_log if m.startswith(("error", "pageerror"))]
        assert not errors, errors


# -- browser tests -----------------------------------------------------------------------------


def test_add_move_rename_delete_show_in_the_other_page(two_pages: tuple[Page, Page], artifacts_dir: Path) -> None:
    a, b = two_pages
    expect(a.locator(".card")).to_have_count(12)  # the demo board of a first start
    expect(a.locator(".lane-title")).to_have_text(["Backlog", "In progress", "Review", "Done"])
    screenshot(a, artifacts_dir / "kanban-board.png")

    add_card(a, "Write release notes", "Everything since 1.2")
    expect(card(b, "Write release notes")).to_be_visible(timeout=LIVE)
    expect(a.locator("#new-card-title")).to_have_value("")  # the form cleared once it landed
    expect(a.locator("#outcome")).to_contain_text("Added “Write release notes” to Backlog.")
    card_id = card(b, "Write release notes").get_attribute("id")
    assert card_id and b.locator(f"#lane-1 #{card_id}").count() == 1

    card(a, "Write release notes").get_by_role("button", name="Move right").click()  # the keyboard path
    expect(b.locator(f"#lane-2 #{card_id}")).to_be_visible(timeout=LIVE)

    a.locator(f"#{card_id}").drag_to(a.locator("#lane-4 .cards"))  # HTML5 drag and drop
    expect(b.locator(f"#lane-4 #{card_id}")).to_be_visible(timeout=LIVE)
    expect(b.locator(f"#lane-2 #{card_id}")).to_have_count(0)

    a.locator(f"#{card_id}").get_by_role("button", name="Edit").click()
    expect(a.locator("#edit-title")).to_have_value("Write release notes")
    a.fill("#edit-title", "Publish the release notes")
    a.get_by_role("button", name="Save").click()
    expect(b.locator(f"#{card_id} .card-title")).to_have_text("Publish the release notes", timeout=LIVE)
    expect(a.locator("#edit-card")).to_be_hidden()

    a.locator(f"#{card_id}").get_by_role("button", name="Delete").click()
    expect(b.locator(f"#{card_id}")).to_have_count(0, timeout=LIVE)
    expect(a.locator(f"#{card_id}")).to_have_count(0)
    no_page_errors(a, b)


def screenshot(page: Page, path: Path) -> None:
    """The board as a person sees it, a card hovered, for a human to look at."""
    page.locator(".card").nth(1).hover()
    page.screenshot(path=str(path))
    assert path.stat().st_size > 20_000


def test_bad_titles_show_in_the_acting_page_only(two_pages: tuple[Page, Page], db_path: Path) -> None:
    a, b = two_pages
    before = rows(db_path, "SELECT count(*) FROM card")
    for title, error in (("   ", "at least 1 character"), ("x" * 121, "at most 120 characters")):
        add_card(a, title)
        expect(a.locator("#lith-error")).to_contain_text(error)
        expect(a.locator("#lith-error")).to_contain_text("title")
        button = a.get_by_role("button", name="Add card")
        expect(button).not_to_have_class(re.compile("pending"))  # `done` came back with the error
        expect(a.locator("#new-card-title")).to_have_value(title)  # kept, to be fixed
        expect(b.locator("#lith-error")).to_be_empty()
        assert rows(db_path, "SELECT count(*) FROM card") == before
        assert rows(db_path, "SELECT count(*) FROM card WHERE trim(title) = ?", title.strip()) == [(0,)]

    add_card(a, "Fixed title")  # the next good command clears the error
    expect(a.locator("#lith-error")).to_be_empty()
    expect(card(b, "Fixed title")).to_be_visible(timeout=LIVE)


def test_move_to_a_lane_deleted_a_moment_ago(two_pages: tuple[Page, Page], db_path: Path) -> None:
    a, b = two_pages
    held: list[Route] = []
    a.route("**/cards/move", lambda route: held.append(route))  # a's move is on the wire while b deletes the lane
    moving = a.locator("#lane-1 .card").first
    card_id = moving.get_attribute("id")
    with a.expect_request("**/cards/move"):
        moving.get_by_role("button", name="Move right").click()  # to lane 2, "In progress"
    expect(moving).to_have_class(re.compile("pending"))

    b.locator("#lane-2").get_by_role("button", name="Edit lane In progress").click()
    expect(b.locator("#rename-title")).to_have_value("In progress")
    b.get_by_role("button", name="Delete lane").click()
    expect(a.locator("#lane-2")).to_have_count(0, timeout=LIVE)

    assert len(held) == 1
    held[0].continue_()
    failure = a.locator("#outcome .failed")
    expect(failure).to_contain_text("That lane was deleted a moment ago by someone else", timeout=LIVE)
    expect(moving).not_to_have_class(re.compile("pending"))
    expect(a.locator(f"#lane-1 #{card_id}")).to_be_visible()
    expect(b.locator(f"#lane-1 #{card_id}")).to_be_visible()
    expect(b.locator("#outcome")).to_contain_text("Deleted the lane In progress")
    expect(b.locator("#outcome .failed")).to_have_count(0)
    assert rows(db_path, "SELECT lane_id FROM card WHERE id = ?", int(card_id.removeprefix("card-"))) == [(1,)]


# Records the fewest avatars a page shows from now on, however briefly.
FEWEST_AVATARS = """() => {
  const count = () => document.querySelectorAll('#presence .avatar').length;
  window.fewestAvatars = count();
  new MutationObserver(() => { window.fewestAvatars = Math.min(window.fewestAvatars, count()); })
    .observe(document.body, {childList: true, subtree: true});
}"""


def test_presence_two_viewers_a_reload_then_one(two_pages: tuple[Page, Page]) -> None:
    a, b = two_pages
    expect(a.locator("#presence .avatar")).to_have_count(2)
    b_name = b.locator(".me strong").inner_text()
    expect(a.locator(f"#presence .avatar[title='{b_name}']")).to_have_count(1)

    a.evaluate(FEWEST_AVATARS)
    b.reload()  # the same person comes back at once: a's list never drops b
    wait_for_datastar(b)
    expect(b.locator(".me strong")).to_have_text(b_name)  # kept in sessionStorage
    expect(b.locator("#presence .avatar")).to_have_count(2)
    expect(a.locator("#presence .avatar")).to_have_count(2)
    assert a.evaluate("window.fewestAvatars") == 2, "b flickered out of a's presence list"

    b.close()  # its pagehide beacon says goodbye; the list drops b after a short grace
    expect(a.locator("#presence .avatar")).to_have_count(1, timeout=15_000)
    expect(a.locator(".presence-count")).to_have_text("1 viewing")


def test_server_restart_pages_reconnect_and_keep_working(
    two_pages: tuple[Page, Page], server: Server
) -> None:
    a, b = two_pages
    for page in (a, b):
        page.evaluate("window.sameDocument = true")
    server.restart()
    assert not server.killed, "uvicorn had to be killed: the streams did not end on shutdown"

    add_card(a, "After the restart")
    expect(card(b, "After the restart")).to_be_visible(timeout=10_000)
    expect(a.get_by_role("button", name="Add card")).not_to_have_class(re.compile("pending"), timeout=10_000)
    card(b, "After the restart").get_by_role("button", name="Move right").click()
    expect(a.locator("#lane-2 .card", has_text="After the restart")).to_be_visible(timeout=10_000)
    for page in (a, b):
        assert page.evaluate("window.sameDocument") is True  # no reload happened


# -- HTTP and rendering, no browser ------------------------------------------------------------


def test_http_surface(server: Server, db_path: Path) -> None:
    home = httpx.get(server.url + "/")
    assert home.status_code == 303 and home.headers["location"] == "/boards/1"
    assert httpx.get(server.url + "/openapi.json").json()["paths"] == {}
    assert httpx.get(server.url + "/boards/99").status_code == 404
    page = httpx.get(server.url + "/boards/1").text
    assert 'id="board"' in page and "/lith/stream?views=board/1,board/1/lanes,board/1/presence,outcome/" in page
    cmd = {"tab": "t1", "op": 1, "lane_id": 1, "title": "Nope"}
    assert httpx.post(server.url + "/cards", json=cmd).status_code == 403  # not Datastar
    beacon = {"board_id": "1", "viewer": "v1"}

    def seen_at() -> list[tuple[float]]:
        with sqlite3.connect(db_path) as conn:
            return conn.execute("SELECT seen_at FROM presence WHERE viewer = 'v1'").fetchall()

    with sqlite3.connect(db_path) as conn:  # a viewer listed on board 1, as its heartbeat leaves it
        conn.execute("INSERT INTO presence VALUES (1, 'v1', 'Vee', ?)", (time.time() + 3600,))
    listed = seen_at()
    refused = httpx.post(server.url + "/presence/leave", data=beacon, headers={"Sec-Fetch-Site": "cross-site"})
    assert refused.status_code == 403
    assert seen_at() == listed  # a refused beacon changed nothing
    taken = httpx.post(server.url + "/presence/leave", data=beacon, headers={"Sec-Fetch-Site": "same-origin"})
    assert taken.status_code == 204
    deadline = time.monotonic() + 30
    while seen_at():  # the sweep after the grace period drops the viewer
        assert time.monotonic() < deadline, "the viewer who left is still listed"
        time.sleep(0.1)


def test_seeded_board_is_about_142_kb(tmp_path: Path) -> None:
    from examples.kanban.seed import seed
    from examples.kanban.views import board_view, card_item
    from fastapi_lith import Db
    from fastapi_lith.db import connect
    from fastapi_lith.statements import StatementCache

    board_id = seed(tmp_path / "bench.db", cards=200)
    conn = connect(tmp_path / "bench.db")
    db = Db(conn, StatementCache())
    card_item.cache_clear()
    html = str(board_view(db, board_id))
    assert abs(len(html) - 142_000) <= 14_200, len(html)
    assert html.count('class="card"') == 200

    conn.execute("UPDATE card SET title = 'Changed' WHERE id = 7")
    str(board_view(db, board_id))
    info = card_item.cache_info()
    assert (info.misses, info.hits) == (201, 199)  # one changed card, rendered once more
    conn.close()


def test_moving_a_card_keeps_every_other_card_cached(tmp_path: Path) -> None:
    from examples.kanban.seed import seed
    from examples.kanban.views import board_view, card_item
    from fastapi_lith import Db
    from fastapi_lith.db import connect
    from fastapi_lith.statements import StatementCache

    board_id = seed(tmp_path / "bench.db", cards=200)
    conn = connect(tmp_path / "bench.db")
    db = Db(conn, StatementCache())
    card_item.cache_clear()
    str(board_view(db, board_id))
    top = conn.execute("SELECT id, lane_id FROM card ORDER BY lane_id, position LIMIT 1").fetchone()
    other_lane = conn.execute("SELECT id FROM lane WHERE id != ? LIMIT 1", (top[1],)).fetchone()[0]
    conn.execute("UPDATE card SET lane_id = ?, position = -1 WHERE id = ?", (other_lane, top[0]))
    str(board_view(db, board_id))
    info = card_item.cache_info()
    assert (info.misses, info.hits) == (201, 199)  # only the moved card rendered again
    conn.close()
