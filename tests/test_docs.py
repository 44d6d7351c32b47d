"""The code the docs show is code the tests run.

The apps in docs/src/ are included into the pages by pymdownx.snippets; here they run for real,
from another working directory, online and offline. Pages that quote a generated app instead
quote it line for line.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from browser import NON_LOOPBACK_RE, Server, wait_for_datastar
from fastapi_lith.__main__ import render_text
from fastapi_lith.testing import Tabs

REPO = Path(__file__).resolve().parent.parent
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


def test_a_local_copy_of_datastar_works_with_no_network(
    browser: Any, datastar_js: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    folder = tmp_path / "app"
    shutil.copytree(SRC / "local_datastar", folder, ignore=shutil.ignore_patterns("__pycache__", "static"))
    (folder / "static").mkdir()
    shutil.copy(datastar_js, folder / "static" / "datastar.js")  # what `curl -o` fetches
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
