"""The accounts example on a real uvicorn: two teams side by side in Chromium, and kill -9."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
from playwright.sync_api import Page, Route, expect

from tests.support import REPO
from tests.support.browser import Server, wait_for_datastar

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}


def serve(server_factory: Callable[..., Server], folder: Path) -> Server:
    return server_factory("examples.accounts.app:app", cwd=REPO, env={"ACCOUNTS_DIR": str(folder)})


def create(server: Server, name: str) -> None:
    response = httpx.post(
        f"{server.url}/accounts", data={"name": name}, headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False
    )
    assert response.status_code == 303 and response.headers["location"] == f"/a/{name}/"


def count(folder: Path, name: str) -> int:
    with sqlite3.connect(folder / f"{name}.db") as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


def test_a_tab_command_in_an_account_tells_its_tab_through_the_built_in_outcome_view(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Every account has the built-in `outcome/{tab}` view: its stream opens (not a 400), a
    command that lands sets `done` and shows its message, and a `Rejected` one answers 204 (not
    a 500) and tells the tab why."""
    server = serve(server_factory, tmp_path / "accounts")
    create(server, "alpha")
    query = {"views": "counter,outcome/t1", "tab": "t1"}
    with (
        httpx.Client(base_url=server.url, headers=SAME_ORIGIN, timeout=30) as client,
        client.stream("GET", "/a/alpha/lith/stream", params=query, headers={"Accept-Encoding": "identity"}) as stream,
    ):
        assert stream.status_code == 200, stream.read()
        chunks = stream.iter_text()
        seen = ""

        def until(text: str) -> None:
            nonlocal seen
            while text not in seen:
                seen += next(chunks)

        until('id="outcome"')
        assert client.post("/a/alpha/add", json={"tab": "t1", "op": 1, "n": 2}).status_code == 204
        until('data-signals:done="1"')
        until("Added 2: the count is 2.")
        assert client.post("/a/alpha/note", json={"tab": "t1", "op": 2, "text": "hello"}).status_code == 204
        until('data-signals:done="2"')
        again = client.post("/a/alpha/note", json={"tab": "t1", "op": 3, "text": "hello"})
        assert again.status_code == 204, again.text
        until('data-signals:done="3"')
        until("That note is already the newest one.")


def test_a_tab_command_in_an_account_releases_its_button_and_shows_its_message(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(server_factory, tmp_path / "accounts")
    create(server, "acme")
    page = new_page()
    page.goto(f"{server.url}/a/acme/")
    wait_for_datastar(page)
    button = page.get_by_role("button", name="Add one")
    held: list[Route] = []
    page.route("**/a/acme/add", lambda route: held.append(route))
    with page.expect_request("**/a/acme/add"):
        button.click()
    expect(button).to_have_class(re.compile("pending"))  # until its op lands
    held[0].continue_()
    expect(page.locator("#outcome .message")).to_have_text("Added 1: the count is 1.")
    expect(button).not_to_have_class(re.compile("pending"))
    expect(button).not_to_have_attribute("aria-busy", re.compile(".*"))
    page.unroute("**/a/acme/add")
    for _ in range(2):  # the second is refused: the same note as the newest
        page.locator("#text").fill("twice")
        page.get_by_role("button", name="Add note").click()
    expect(page.locator("#outcome .message")).to_have_text("That note is already the newest one.")
    expect(page.locator("#notes li")).to_have_text(["twice"])


def test_two_teams_side_by_side_never_see_each_others_changes(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    folder = tmp_path / "accounts"
    server = serve(server_factory, folder)
    assert httpx.get(f"{server.url}/a/acme/").status_code == 404
    assert not folder.exists() or list(folder.iterdir()) == []  # a GET made no file
    assert httpx.post(f"{server.url}/accounts", data={"name": "acme"}).status_code == 403  # no origin
    create(server, "acme")
    home = new_page()  # globex is made by the home page's form, as a person would
    home.goto(server.url + "/")
    home.locator("input[name=name]").fill("globex")
    home.get_by_role("button", name="Create").click()
    expect(home.locator("h1")).to_have_text("Team globex")
    pages: dict[str, list[Page]] = {}
    for name in ("acme", "globex"):
        for _ in range(2):  # two tabs per team
            page = new_page()
            page.goto(f"{server.url}/a/{name}/")
            wait_for_datastar(page)
            expect(page.locator("h1")).to_have_text(f"Team {name}")
            pages.setdefault(name, []).append(page)
    acme, globex = pages["acme"], pages["globex"]
    for _ in range(3):
        acme[0].get_by_role("button", name="Add one").click()
    for page in acme:  # both acme tabs follow ...
        expect(page.locator("#counter")).to_have_text("3")
    globex[1].get_by_role("button", name="Add one").click()
    for page in globex:  # ... and globex has its own "counter", the same view key
        expect(page.locator("#counter")).to_have_text("1")
    globex[0].locator("#text").fill("globex only")
    globex[0].get_by_role("button", name="Add note").click()
    expect(globex[1].locator("#notes li")).to_have_text(["globex only"])
    acme[1].locator("#text").fill("acme only")
    acme[1].get_by_role("button", name="Add note").click()
    expect(acme[0].locator("#notes li")).to_have_text(["acme only"])
    for page in acme:
        expect(page.locator("#counter")).to_have_text("3")
        expect(page.locator("#notes li")).to_have_text(["acme only"])
    for page in globex:
        expect(page.locator("#counter")).to_have_text("1")
        expect(page.locator("#notes li")).to_have_text(["globex only"])
    acme[0].reload()  # first paint comes from the team's own file too
    expect(acme[0].locator("#counter")).to_have_text("3")
    assert (count(folder, "acme"), count(folder, "globex")) == (3, 1)
    home.goto(server.url + "/")
    expect(home.get_by_role("link")).to_have_text(["acme", "globex"])


def test_kill_9_loses_no_acknowledged_command_in_any_account(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    folder = tmp_path / "accounts"
    server = serve(server_factory, folder)
    names = [f"team{i}" for i in range(6)]
    for name in names:
        create(server, name)
    acked: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def produce(name: str, tab: str) -> None:
        # A slow answer on a busy machine is not the server dying: only the kill ends a producer.
        with httpx.Client(base_url=server.url, headers=SAME_ORIGIN, timeout=60) as client:
            op = 0
            while not stop.is_set():
                op += 1
                with lock:
                    sent[name] += 1
                try:
                    response = client.post(f"/a/{name}/add", json={"n": 1, "tab": tab, "op": op})
                except httpx.HTTPError:
                    return  # the server died: this command may or may not have landed
                assert response.status_code == 204, response.text
                with lock:
                    acked[name] += 1

    threads = [threading.Thread(target=produce, args=(name, f"{name}-{k}")) for name in names for k in range(2)]
    for thread in threads:
        thread.start()
    deadline = threading.Event()
    while sum(acked.values()) < 300 and not deadline.wait(0.05):
        pass
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert all(acked[name] > 0 for name in names), acked
    for name in names:  # every acknowledged command is in its account's file, none twice
        assert acked[name] <= count(folder, name) <= sent[name], (name, acked[name], sent[name])
