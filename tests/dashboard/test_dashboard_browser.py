"""The dashboard in Chromium, at a desktop's width and a phone's: live numbers, SVG plots, no
overflow. Its screenshots are the docs' (docs/img/dashboard-1440.png, dashboard-390.png), written
there by `make screenshots` (LITH_SCREENSHOTS=1); a plain run keeps them in its own folder."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.test_dashboard import PASSWORD, SAME_SITE, serve
from tests.support import REPO
from tests.support.browser import wait_for_datastar
from tests.support.inprocess import InProcessServer

DOCS_SHOTS = REPO / "docs" / "img"
POINTS = 12  # seconds of plots before the screenshot: enough for a line to read as one


@pytest.fixture
def clicking(app_server: Callable[..., InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    """The docs' app under a steady load of clicks from a thread, until the test ends."""
    server = serve(app_server, tmp_path / "app.db")
    done = threading.Event()

    def click() -> None:
        with httpx.Client(timeout=30) as client:
            # The watchers' renders and the clicks' commits both show in the plots.
            stream = f"{server.url}/lith/stream?views=clicks,outcome/loader&tab=loader"
            with client.stream("GET", stream, headers={"Accept-Encoding": "gzip"}):
                for op in itertools.count(1):
                    if done.is_set():
                        return
                    body = {"tab": "loader", "op": op, "n": 1 + op % 5}
                    client.post(f"{server.url}/click", json=body, headers=SAME_SITE).raise_for_status()

    loader = threading.Thread(target=click, daemon=True)
    loader.start()
    yield server
    done.set()
    loader.join()


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_the_dashboard_is_live_and_reads_well(
    new_page: Callable[..., Page], clicking: InProcessServer, width: int, height: int, tmp_path: Path
) -> None:
    page = new_page(
        viewport={"width": width, "height": height}, http_credentials={"username": "operator", "password": PASSWORD}
    )
    page.goto(clicking.url + "/lith/dashboard")
    wait_for_datastar(page)
    committed = page.locator("#dash-committed")
    first = committed.inner_text()
    expect(committed).not_to_have_text(first)  # the stream brought newer numbers
    expect(page.locator("#dash-commands-rate")).not_to_have_text("0/s")
    for plot in ("commit", "tick"):
        expect(page.locator(f"#dash-plot-{plot} svg")).to_have_count(1)
    page.wait_for_function(
        f"Number(document.querySelector('#dash-plot-commit').dataset.points) >= {POINTS}", timeout=60_000
    )
    for plot in ("commit", "tick"):
        expect(page.locator(f"#dash-plot-{plot} svg path.line").first).to_be_attached()
    expect(page.locator("#dash-views")).to_contain_text("clicks")
    expect(page.locator("#dash-streams")).to_contain_text("open")
    # Nothing wider than the window: every card, table and plot fits.
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    shots = DOCS_SHOTS if os.environ.get("LITH_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / f"dashboard-{width}.png"), full_page=True)
    assert not [line for line in page.console_log if line.startswith(("error", "pageerror"))], page.console_log
