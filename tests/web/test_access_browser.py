"""Who may watch what, in Chromium: two users side by side, a sign-out, a page its stream refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from tests.support import REPO, SUPPORT
from tests.support.browser import RECONNECT_AND_RELOAD_MS, Server, wait_for_datastar

DOCS_APP = REPO / "docs" / "src" / "access"


def signed_in(new_page: Callable[..., Page], server: Server, user: str) -> Page:
    page = new_page()
    page.goto(server.url + "/")
    page.get_by_label("Name").fill(user)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#me")).to_have_text(user)
    wait_for_datastar(page)
    return page


def test_two_users_see_their_own_tasks_and_the_shared_notes_and_a_sign_out_stops_the_stream(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory(
        "app:app", cwd=tmp_path, args=["--app-dir", str(DOCS_APP)], env={"APP_SECRET": "a secret for this test only"}
    )
    alice, bob = signed_in(new_page, server, "alice"), signed_in(new_page, server, "bob")
    for page, task in ((alice, "alice's task"), (bob, "bob's task")):
        page.get_by_label("Task").fill(task)
        page.get_by_role("button", name="Add task").click()
        expect(page.locator("#tasks")).to_have_text(task)  # its own, and only its own
    bob.get_by_label("Note").fill("hello from bob")
    bob.get_by_role("button", name="Add note").click()
    for page in (alice, bob):
        expect(page.locator("#notes")).to_have_text("bob: hello from bob")
    expect(alice.locator("#tasks")).to_have_text("alice's task")
    expect(bob.locator("#tasks")).to_have_text("bob's task")

    refused: list[Any] = []
    alice.on("response", lambda r: refused.append(r) if "/lith/stream" in r.url and r.headers.get(
        "datastar-mode") == "append" else None)
    # Alice signs out in another tab of hers: this page's stream is revoked at once, its
    # reconnect (within the stream's `retry:`, up to `reconnect_within` after the end) refused,
    # and the page reloads into the sign-in form.
    response = alice.context.request.post(server.url + "/signout", headers={"Sec-Fetch-Site": "same-origin"})
    assert response.ok
    expect(alice.get_by_role("button", name="Sign in")).to_be_visible(timeout=RECONNECT_AND_RELOAD_MS)
    assert refused, "the reconnect was not refused"
    bob.get_by_label("Note").fill("after alice left")
    bob.get_by_role("button", name="Add note").click()
    expect(bob.locator("#notes")).to_contain_text("after alice left")
    expect(alice.locator("#notes")).to_have_count(0)


def test_a_page_its_stream_refuses_reloads_once_then_shows_the_notice(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory("accessapp:app", cwd=SUPPORT, env={
        "ACCESS_DB": str(tmp_path / "access.db"), "ACCESS_SECRET": "a secret for this test only", "PYTHONPATH": str(REPO),
    })
    assert httpx.post(f"{server.url}/signin", json={"session": "s-bob", "user": "bob"}).status_code == 204
    page = new_page(extra_http_headers={"X-Session": "s-bob"})
    page.goto(server.url + "/page?keys=board,team/1")  # bob is no member of team 1
    notice = page.get_by_role("alert").filter(has_text="This page is out of date")
    expect(page.locator("#loads")).to_have_text("2")  # the first refusal reloaded the page
    expect(notice).to_be_visible()  # the second, soon after, only says so
    assert httpx.get(f"{server.url}/loads").json() == {"page": 2}
