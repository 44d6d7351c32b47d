"""The kanban example in a real browser: two people on one board, a real uvicorn, a real file.

Each browser test starts its own server on a temporary database (seeded with the 12-card demo
board on first start) and opens two pages, `a` and `b`, as two people would.
"""

from __future__ import annotations

import json
import random
import re
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, Route, expect

from tests.support import REPO
from tests.support.browser import NON_LOOPBACK_RE, Server, wait_for_datastar

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


def rows(db_path: Path | str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Query the app's database: the SQLite file, or the PostgreSQL URL of test_kanban_pg.py."""
    if isinstance(db_path, str) and db_path.startswith("postgresql"):
        import psycopg

        from fastapi_lith.backends.postgres.db import dsn

        with psycopg.connect(dsn(db_path)) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()  # type: ignore[arg-type]
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


def test_a_page_patched_through_many_moves_is_the_page_a_reload_shows(
    new_page: Callable[..., Page], server: Server, db_path: Path
) -> None:
    """The other tabs get a board's changes as patches (a card removed here, inserted there, a
    count morphed) from the render they show: after many moves at once, in and across lanes,
    the watching page's board is the one a fresh page renders, element for element."""
    watching = open_board(new_page, server)
    expect(watching.locator(".card")).to_have_count(12)
    rnd = random.Random(7)
    cards = [c for (c,) in rows(db_path, "SELECT id FROM card")]
    with httpx.Client(base_url=server.url, headers=SAME_ORIGIN) as client:
        for op in range(1, 41):
            move = {"tab": "mover", "op": op, "card_id": rnd.choice(cards), "lane_id": rnd.randint(1, 4),
                    "position": rnd.randint(0, 5)}
            assert client.post("/cards/move", json=move).status_code == 204
    order = rows(db_path, "SELECT lane_id, id FROM card ORDER BY lane_id, position")
    expected = ",".join(f"{lane}:{card}" for lane, card in order)
    watching.wait_for_function(
        """expected => [...document.querySelectorAll('#board .card')]
             .map(c => c.closest('.lane').id.slice(5) + ':' + c.id.slice(5)).join(',') == expected""",
        arg=expected, timeout=LIVE,
    )
    fresh = open_board(new_page, server).locator("#board").evaluate("e => e.outerHTML")
    # Equal as DOM nodes: the same elements, text and attributes (a morph may order them anew).
    same = """html => { const t = document.createElement('template'); t.innerHTML = html;
                      return t.content.firstElementChild.isEqualNode(document.getElementById('board')) }"""
    assert watching.evaluate(same, fresh)
    no_page_errors(watching)


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


def test_a_draft_over_the_body_limit_says_so_and_stops_pending(new_page: Callable[..., Page], server: Server, db_path: Path) -> None:
    a = open_board(new_page, server)
    before = rows(db_path, "SELECT count(*) FROM card")
    add_card(a, "Pasted a novel", "x" * 70_000)
    expect(a.locator("#lith-error")).to_contain_text("The request is too large: at most 65536 bytes.")
    expect(a.get_by_role("button", name="Add card")).not_to_have_class(re.compile("pending"))
    expect(a.locator("#new-card-description")).to_have_value("x" * 70_000)  # the draft is kept
    assert rows(db_path, "SELECT count(*) FROM card") == before


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


# -- offline, phones, more boards --------------------------------------------------------------


def test_without_datastar_the_page_says_so_and_keeps_the_draft(browser: Any, server: Server) -> None:
    """The Datastar CDN unreachable: a notice, and a form that does not reload the page."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(10_000)
    context.route(NON_LOOPBACK_RE, lambda route: route.abort("internetdisconnected"))
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{server.url}/boards/1")
    expect(page.get_by_role("alert")).to_contain_text("could not load Datastar")
    page.fill("#new-card-title", "Written on a train")
    page.get_by_role("button", name="Add card").click()
    page.press("#new-card-title", "Enter")
    expect(page.locator("#new-card-title")).to_have_value("Written on a train")
    assert page.url == f"{server.url}/boards/1"
    assert not [url for url in requests if url.startswith(server.url + "/boards/1?")], requests
    context.close()


def test_with_datastar_there_is_no_notice(two_pages: tuple[Page, Page]) -> None:
    a, _ = two_pages
    expect(a.locator("#no-datastar")).to_be_hidden()
    a.wait_for_timeout(4_500)  # past the delay after which the stylesheet alone would show it
    expect(a.locator("#no-datastar")).to_be_hidden()


@pytest.mark.parametrize("width,height", [(390, 844), (820, 1180), (1440, 900)])
def test_the_board_at_phone_tablet_and_desktop_widths(
    new_page: Callable[..., Page], server: Server, artifacts_dir: Path, width: int, height: int
) -> None:
    page = new_page(viewport={"width": width, "height": height}, is_mobile=width < 1000, has_touch=width < 1000)
    page.goto(f"{server.url}/boards/1")
    wait_for_datastar(page)
    page.screenshot(path=str(artifacts_dir / f"kanban-{width}.png"))
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways page scroll
    lane = page.locator("#lane-1").bounding_box()
    assert lane and lane["y"] < height * 0.6  # the board is in the first screen
    assert lane["width"] >= min(258, width * 0.75)  # a lane, not a sliver
    add_card(page, f"From a {width} px screen")
    expect(card(page, f"From a {width} px screen")).to_be_visible(timeout=LIVE)
    expect(page.locator("#new-card-title")).to_have_value("")
    no_page_errors(page)


def test_every_board_is_listed_even_one_seeded_later(
    new_page: Callable[..., Page], server: Server, db_path: Path
) -> None:
    from examples.kanban.seed import seed

    board_id = seed(db_path, cards=20)  # the app runs on this file: a second board, 20 cards
    page = new_page(viewport=VIEWPORT)
    page.goto(server.url + "/")
    expect(page.locator(".board-list li")).to_have_count(2)
    expect(page.locator(".board-list li").nth(1)).to_contain_text("20 cards")
    page.locator(".board-list a").nth(1).click()
    expect(page).to_have_url(f"{server.url}/boards/{board_id}")
    wait_for_datastar(page)
    expect(page.locator(".card")).to_have_count(20)
    page.get_by_role("link", name="All boards").click()
    expect(page.locator(".board-list li")).to_have_count(2)


def test_generated_titles_read_like_tasks() -> None:
    from examples.kanban.seed import _PARTS, _VERBS, demo_cards

    generated = [title for title, _ in demo_cards(200)[12:]]
    assert any(title.startswith("Speed up ") for title in generated)
    for title in generated:
        verb = next((v for v in _VERBS if title.startswith(v + " ")), None)
        assert verb is not None and title.split()[-1] in _PARTS, title
        assert len(title.removeprefix(verb).split()) == 2, title


# -- HTTP and rendering, no browser ------------------------------------------------------------


def test_http_surface(server: Server, db_path: Path) -> None:
    home = httpx.get(server.url + "/")
    assert home.status_code == 200 and 'href="/boards/1"' in home.text
    for path in ("/openapi.json", "/docs", "/redoc"):  # no API docs in production
        assert httpx.get(server.url + path).status_code == 404, path
    assert httpx.get(server.url + "/boards/99").status_code == 404
    page = httpx.get(server.url + "/boards/1").text
    assert 'id="board"' in page and "/lith/stream?views=board/1,board/1/lanes,board/1/presence,outcome/" in page
    cmd = {"tab": "t1", "op": 1, "lane_id": 1, "title": "Nope"}
    assert httpx.post(server.url + "/cards", json=cmd).status_code == 403  # not Datastar
    beacon = {"board_id": "1", "viewer": "v1"}

    def seen_at() -> list[tuple[float]]:
        return rows(db_path, "SELECT seen_at FROM presence WHERE viewer = 'v1'")

    def listed() -> bool:  # what a person sees: the name in the board's presence list
        return 'title="Vee"' in httpx.get(server.url + "/boards/1").text

    beat = {"board_id": 1, "viewer": "v1", "name": "Vee"}
    assert httpx.post(server.url + "/presence/heartbeat", json=beat, headers=SAME_ORIGIN).status_code == 204
    assert listed()
    before = seen_at()
    refused = httpx.post(server.url + "/presence/leave", data=beacon, headers={"Sec-Fetch-Site": "cross-site"})
    assert refused.status_code == 403
    assert seen_at() == before  # a refused beacon changed nothing
    taken = httpx.post(server.url + "/presence/leave", data=beacon, headers={"Sec-Fetch-Site": "same-origin"})
    assert taken.status_code == 204
    assert seen_at()[0][0] < before[0][0]  # listed for the reload grace only, not a whole heartbeat's time
    deadline = time.monotonic() + 30
    while listed():  # after the reload grace the viewer is gone from the list
        assert time.monotonic() < deadline, "the viewer who left is still listed"
        time.sleep(0.1)


SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}


def send_and_drop(server: Server, path: str, body: dict[str, Any], db_path: Path, sql: str) -> None:
    """Send a command, wait until it has committed, then drop the connection unread: the
    answer never reaches the client, as when a deploy or a network drop cuts it off."""
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: {len(payload)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in SAME_ORIGIN.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + payload)
        deadline = time.monotonic() + 10
        while rows(db_path, sql) == [(0,)]:
            assert time.monotonic() < deadline, "the command never committed"
            time.sleep(0.01)


def test_the_operator_pages_need_the_operator_password(server_factory: Callable[..., Server], db_path: Path) -> None:
    """The dashboard and the scrape are mounted behind the deploy's password; unset, nobody opens them."""
    closed = server_factory(APP, cwd=REPO, env={"KANBAN_DB": str(db_path)})
    for path in ("/lith/dashboard", "/lith/metrics"):
        assert httpx.get(closed.url + path).status_code == 401, path
        assert httpx.get(closed.url + path, auth=("operator", "")).status_code == 403, path
    closed.stop()
    opened = server_factory(APP, cwd=REPO, env={"KANBAN_DB": str(db_path), "KANBAN_OPERATOR_PASSWORD": "s3cret"})
    assert httpx.get(opened.url + "/lith/metrics", auth=("operator", "wrong")).status_code == 403
    scrape = httpx.get(opened.url + "/lith/metrics", auth=("operator", "s3cret"))
    assert scrape.status_code == 200 and "lith_writer_commands_total" in scrape.text
    dashboard = httpx.get(opened.url + "/lith/dashboard", auth=("operator", "s3cret"))
    assert dashboard.status_code == 200 and "/lith/dashboard/stream" in dashboard.text


@pytest.mark.parametrize("restart", [False, True], ids=["same server", "after a restart"])
def test_a_command_retried_after_a_lost_answer_applies_once(server: Server, db_path: Path, restart: bool) -> None:
    cmd = {"tab": "t1", "op": 1, "lane_id": 1, "title": "Exactly once"}
    count = "SELECT count(*) FROM card WHERE title = 'Exactly once'"
    send_and_drop(server, "/cards", cmd, db_path, count)
    if restart:
        server.restart()
    for _ in range(2):  # Datastar retries the same request: the same tab, the same op
        retry = httpx.post(server.url + "/cards", content=json.dumps(cmd), headers=SAME_ORIGIN)
        assert retry.status_code == 204
    assert rows(db_path, count) == [(1,)]
    again = httpx.post(server.url + "/cards", content=json.dumps({**cmd, "op": 2}), headers=SAME_ORIGIN)
    assert again.status_code == 204  # the tab's next action is a new op: it applies
    assert rows(db_path, count) == [(2,)]


def test_integers_sqlite_cannot_store_are_refused_on_every_route(server: Server, db_path: Path) -> None:
    before = rows(db_path, "SELECT count(*), max(id), (SELECT group_concat(title) FROM lane) FROM card")
    huge = 2**63
    for path, cmd in [
        ("/cards", {"tab": "t1", "op": 1, "lane_id": huge, "title": "x"}),
        ("/cards", {"tab": "t1", "op": huge, "lane_id": 1, "title": "x"}),
        ("/cards/move", {"tab": "t1", "op": 2, "card_id": 1, "lane_id": 1, "position": 0, "extra": huge}),
        ("/cards/move", {"tab": "t1", "op": 2, "card_id": huge, "lane_id": 1, "position": 0}),
        ("/cards/delete", {"tab": "t1", "op": 3, "card_id": huge}),
        ("/lanes/rename", {"tab": "t1", "op": 4, "lane_id": huge * 4, "title": "y"}),
    ]:
        response = httpx.post(server.url + path, content=json.dumps(cmd), headers=SAME_ORIGIN)
        if "extra" in cmd:  # not a field: pydantic drops it, nothing reaches SQLite
            assert response.status_code == 204
            continue
        assert response.status_code == 422, (path, cmd, response.text)
        assert response.text.startswith('<div id="lith-error"') and "SQLite&#39;s range" in response.text
    assert rows(db_path, "SELECT count(*), max(id), (SELECT group_concat(title) FROM lane) FROM card") == before
    stream = httpx.get(f"{server.url}/lith/stream?views=board/{huge}&tab=t1")
    assert stream.status_code == 400 and "outside SQLite's integers" in stream.text
    assert "Traceback" not in server.output


def test_a_board_id_sqlite_cannot_store_is_refused_by_the_page_route(server: Server) -> None:
    for board_id in (2**63, -(2**63) - 1, 0, -1):  # bounded by the route's type: FastAPI's 422
        page = httpx.get(f"{server.url}/boards/{board_id}")
        assert page.status_code == 422 and "board_id" in page.text, (board_id, page.text)
    assert httpx.get(f"{server.url}/boards/{2**63 - 1}").status_code == 404  # in range: no such board
    assert "Traceback" not in server.output


def test_seeded_board_is_about_156_kb(tmp_path: Path) -> None:
    from examples.kanban.seed import seed
    from examples.kanban.views import board_view, card_item
    from fastapi_lith import Db
    from fastapi_lith.backends.sqlite.db import open_sqlite
    from fastapi_lith.engine.statements import StatementCache

    board_id = seed(tmp_path / "bench.db", cards=200)
    conn = open_sqlite(tmp_path / "bench.db")
    db = Db(conn, StatementCache())
    card_item.cache_clear()
    html = str(board_view(db, board_id))
    assert abs(len(html) - 156_000) <= 4_000, len(html)  # the size seed.py and the README state
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
    from fastapi_lith.backends.sqlite.db import open_sqlite
    from fastapi_lith.engine.statements import StatementCache

    board_id = seed(tmp_path / "bench.db", cards=200)
    conn = open_sqlite(tmp_path / "bench.db")
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


async def test_moves_keep_the_order_a_person_asked_for(tmp_path: Path) -> None:
    """Random moves through the real writer leave each lane in the order of a list model where
    the card is taken out and inserted at `position`; each move writes at most two rows' worth
    of UPDATEs besides the outcome (the room it makes is one statement)."""
    import random

    from examples.kanban.commands import MoveCard
    from examples.kanban.seed import MIGRATIONS, seed
    from fastapi_lith import Lith
    from fastapi_lith.testing import Tabs

    db_path = tmp_path / "moves.db"
    board_id = seed(db_path, cards=40)
    conn = sqlite3.connect(db_path)
    lanes = [r[0] for r in conn.execute("SELECT id FROM lane WHERE board_id = ? ORDER BY position", (board_id,))]
    model = {
        lane: [r[0] for r in conn.execute("SELECT id FROM card WHERE lane_id = ? ORDER BY position, id", (lane,))]
        for lane in lanes
    }
    conn.close()
    rng = random.Random(7)
    lith = Lith(db_path, migrations=MIGRATIONS)
    async with Tabs(lith) as tabs:
        for op in range(300):
            card_id = rng.choice([c for cards in model.values() for c in cards])
            to_lane = rng.choice(lanes)
            position = rng.randrange(0, len(model[to_lane]) + 2)
            await tabs.do(MoveCard(tab="t", op=op, card_id=card_id, lane_id=to_lane, position=position))
            for cards in model.values():
                if card_id in cards:
                    cards.remove(card_id)
            model[to_lane].insert(min(position, len(model[to_lane])), card_id)
    conn = sqlite3.connect(db_path)
    for lane in lanes:
        rows = conn.execute("SELECT id, position FROM card WHERE lane_id = ? ORDER BY position, id", (lane,)).fetchall()
        assert [r[0] for r in rows] == model[lane]
        assert len({r[1] for r in rows}) == len(rows)  # positions stay distinct within a lane
    conn.close()


def test_a_move_makes_room_with_one_update(tmp_path: Path) -> None:
    """Moving to the top of a long lane writes the lane in one statement, not one per card."""
    from examples.kanban.commands import MoveCard
    from examples.kanban.seed import seed
    from fastapi_lith.backends.sqlite.db import open_sqlite
    from fastapi_lith.engine.statements import StatementCache
    from fastapi_lith.engine.tx import Tx

    board_id = seed(tmp_path / "one.db", cards=200)
    conn = open_sqlite(tmp_path / "one.db")
    lane_id, cards = conn.execute(
        "SELECT lane_id, count(*) FROM card JOIN lane ON lane.id = lane_id WHERE board_id = ? "
        "GROUP BY lane_id ORDER BY count(*) DESC LIMIT 1", (board_id,)
    ).fetchone()
    mover = conn.execute("SELECT id FROM card WHERE lane_id != ? LIMIT 1", (lane_id,)).fetchone()[0]
    updates: list[str] = []
    conn.set_trace_callback(lambda sql: updates.append(sql) if sql.lstrip().upper().startswith("UPDATE") else None)
    conn.execute("BEGIN IMMEDIATE")
    MoveCard(tab="t", op=1, card_id=mover, lane_id=lane_id, position=0).apply(Tx(conn, StatementCache()))
    conn.execute("COMMIT")
    conn.set_trace_callback(None)
    assert cards > 40
    assert len(updates) == 2, updates  # make room, place the card
    first = conn.execute("SELECT id FROM card WHERE lane_id = ? ORDER BY position, id LIMIT 1", (lane_id,)).fetchone()
    assert first[0] == mover
    conn.close()
