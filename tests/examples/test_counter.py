"""The counter example in a real browser: two pages, one real uvicorn, one real SQLite file."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect

from tests.support import REPO
from tests.support.browser import NON_LOOPBACK_RE, Server, wait_for_datastar


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "counter.db"


@pytest.fixture
def two_pages(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], db_path: Path
) -> tuple[Page, Page]:
    """Two tabs on one counter, each showing the count its stream sent."""
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(db_path)})
    pages = []
    for _ in range(2):
        page = new_page()
        page.goto(server.url + "/")
        wait_for_datastar(page)
        pages.append(page)
    return pages[0], pages[1]


def count(db_path: Path) -> int:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


def test_a_click_in_one_page_updates_both(two_pages: tuple[Page, Page], db_path: Path) -> None:
    a, b = two_pages
    a.locator("input").fill("3")
    a.get_by_role("button", name="Add").click()
    expect(a.locator("#counter")).to_have_text("3", timeout=10_000)
    expect(b.locator("#counter")).to_have_text("3", timeout=10_000)
    b.get_by_role("button", name="Add").click()  # b's amount is still 1
    expect(a.locator("#counter")).to_have_text("4", timeout=10_000)
    expect(b.locator("#counter")).to_have_text("4", timeout=10_000)
    expect(a.locator("#outcome .message")).to_have_text("You added 3: 3.")
    expect(b.locator("#outcome .message")).to_have_text("You added 1: 4.")
    assert count(db_path) == 4


def test_chromium_morphs_its_zstd_stream_of_frames_each_of_its_own(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], db_path: Path
) -> None:
    """The counter's writes are small, so each goes as a zstd frame of its own and the stream
    keeps no compressor (docs/encoders.md): Chromium decodes one after another in one body."""
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(db_path)})
    page = new_page()
    encodings: list[str] = []
    page.on("response", lambda r: "/lith/stream" in r.url and encodings.append(r.headers.get("content-encoding", "")))
    page.goto(server.url + "/")
    wait_for_datastar(page)
    total = 0
    for n in (2, 5, 7):
        page.locator("input").fill(str(n))
        page.get_by_role("button", name="Add").click()
        total += n
        expect(page.locator("#counter")).to_have_text(str(total), timeout=10_000)
        expect(page.locator("#outcome .message")).to_have_text(f"You added {n}: {total}.")
    assert encodings == ["zstd"]


def test_the_button_is_pending_until_its_frame_arrives(two_pages: tuple[Page, Page], db_path: Path) -> None:
    """The POST is held in the browser while we look: pending shows without any sleep or a
    slowed tick (the counter reads no tick setting from the environment)."""
    a, _ = two_pages
    button = a.get_by_role("button", name="Add")
    held: list[Route] = []
    a.route("**/add", lambda route: held.append(route))
    with a.expect_request("**/add"):
        button.click()
    expect(button).to_have_class(re.compile("pending"))
    expect(button).to_have_attribute("aria-busy", re.compile(".*"))
    assert len(held) == 1 and count(db_path) == 0
    held[0].continue_()
    expect(a.locator("#counter")).to_have_text("1")
    expect(button).not_to_have_class(re.compile("pending"))
    expect(button).not_to_have_attribute("aria-busy", re.compile(".*"))


def test_a_bad_amount_shows_in_the_acting_page_only_and_writes_nothing(
    two_pages: tuple[Page, Page], db_path: Path
) -> None:
    a, b = two_pages
    a.locator("input").fill("500")
    a.get_by_role("button", name="Add").click()
    error = a.locator("#lith-error")
    expect(error).to_contain_text("Pick a number from 1 to 100.")  # the app's own wording
    expect(error).to_have_attribute("role", "alert")
    expect(a.get_by_role("button", name="Add")).not_to_have_class(re.compile("pending"))
    expect(b.locator("#lith-error")).to_be_empty()
    expect(a.locator("#counter")).to_have_text("0")
    expect(b.locator("#counter")).to_have_text("0")
    assert count(db_path) == 0


def test_without_datastar_the_page_says_so_and_enter_does_not_reload_it(
    browser: Any, server_factory: Callable[..., Server], db_path: Path
) -> None:
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(db_path)})
    context = browser.new_context()
    context.route(NON_LOOPBACK_RE, lambda route: route.abort("internetdisconnected"))
    page = context.new_page()
    page.goto(server.url + "/")
    expect(page.get_by_role("alert")).to_have_text("Datastar did not load: reload to try again.")
    page.locator("input").fill("7")
    page.locator("input").press("Enter")
    page.get_by_role("button", name="Add").click()
    expect(page.locator("input")).to_have_value("7")
    assert page.url == server.url + "/"
    context.close()
