"""Several uvicorn processes on one SQLite file behave as one app.

Real processes on 127.0.0.1 and a real file: `--workers 2` (one port, the kernel picks the
process of each connection) and two servers on two ports. Streams are read over HTTP as a
browser would; every wait is on a condition, with a generous deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support import REPO, SUPPORT
from tests.support.browser import Server, wait_for_datastar

TESTS = SUPPORT  # the helper apps' folder
APP = "workersapp:app"
COMMAND_HEADERS = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
ELEMENT_ID = re.compile(r'^<\w+[^>]*\bid="([^"]+)"')
_tabs = itertools.count(1)


def serve(server_factory: Callable[..., Server], db: Path, args: tuple[str, ...] = ()) -> Server:
    env = {"COUNTER_DB": str(db), "PYTHONPATH": str(REPO)}
    return server_factory(APP, cwd=TESTS, env=env, args=list(args))


def count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


class Tab:
    """One tab's stream over HTTP, read in the background: the newest HTML of each element."""

    def __init__(self, base: str) -> None:
        self.id = f"tab{next(_tabs)}"
        self.url = f"{base}/lith/stream?views=counter,outcome/{self.id}&tab={self.id}"
        self.pid = ""
        self.html: dict[str, str] = {}
        self.errors: list[str] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, client: httpx.AsyncClient) -> Tab:
        opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read(client, opened))
        await opened
        return self

    async def _read(self, client: httpx.AsyncClient, opened: asyncio.Future[None]) -> None:
        try:
            async with client.stream("GET", self.url, headers={"Accept-Encoding": "identity"}) as response:
                assert response.status_code == 200, response.status_code
                self.pid = response.headers["x-pid"]
                opened.set_result(None)
                lines: list[str] = []
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
                        continue
                    html = "\n".join(ln[len("data: elements "):] for ln in lines if ln.startswith("data: elements "))
                    match = ELEMENT_ID.match(html)
                    if match:
                        self.html[match.group(1)] = html
                        if match.group(1) == "lith-error":
                            self.errors.append(html)
                        self._changed.set()
                    lines = []
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            if not opened.done():
                opened.set_exception(RuntimeError(f"stream {self.url} did not open"))

    def count(self) -> int | None:
        match = re.search(r">(\d+)<", self.html.get("counter", ""))
        return int(match.group(1)) if match else None

    async def until(self, condition: Callable[[Tab], bool], timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition(self):
                self._changed.clear()
                await self._changed.wait()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def add(base: str, tab: str, n: int = 1, op: int = 1) -> httpx.Response:
    """One command on a connection of its own, so that `--workers` may hand it to any process."""
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{base}/add", json={"n": n, "tab": tab, "op": op}, headers=COMMAND_HEADERS)


@pytest.fixture
async def client() -> Any:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=httpx.Limits(max_connections=None)) as c:
        yield c


async def test_workers_2_every_command_reaches_every_stream_of_both(
    server_factory: Callable[..., Server], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = serve(server_factory, tmp_path / "app.db", ("--workers", "2"))
    deadline = time.monotonic() + 60
    while server.output.count("Application startup complete") < 2:  # the port answers with one
        assert time.monotonic() < deadline, "the second worker never started"
        await asyncio.sleep(0.05)
    tabs: list[Tab] = []
    for _ in range(60):  # the kernel picks the process: open streams until both serve two
        tabs.append(await Tab(server.url).open(client))
        pids = [t.pid for t in tabs]
        if len(set(pids)) == 2 and all(pids.count(p) >= 2 for p in set(pids)):
            break
    assert len({t.pid for t in tabs}) == 2, "every stream landed in one process"
    served: set[str] = set()
    for i in range(1, 41):
        response = await add(server.url, tabs[i % len(tabs)].id, op=i)
        assert response.status_code == 204, response.text
        served.add(response.headers["x-pid"])
        if len(served) == 2 and i >= 10:
            break
    assert len(served) == 2, "every command landed in one process"
    total = count(tmp_path / "app.db")
    for tab in tabs:
        await tab.until(lambda t: t.count() == total)
    assert len(os.listdir(tmp_path / "app.db-wake")) == 2  # each worker listens for the other's rings
    for tab in tabs:
        tab.close()


async def test_two_ports_one_file_commands_views_and_errors_cross(
    server_factory: Callable[..., Server], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    db = tmp_path / "app.db"
    a, b = serve(server_factory, db), serve(server_factory, db)
    on_a, on_b, bystander = (await Tab(a.url).open(client), await Tab(b.url).open(client),
                             await Tab(b.url).open(client))
    assert on_a.pid != on_b.pid
    # A command through a, for the tab whose stream lives in b: counter everywhere, its outcome there.
    assert (await add(a.url, on_b.id, n=5, op=7)).status_code == 204
    for tab in (on_a, on_b, bystander):
        await tab.until(lambda t: t.count() == 5)
    await on_b.until(lambda t: "You added 5: 5." in t.html.get("outcome", ""))
    assert 'data-signals:done="7"' in on_b.html["outcome"]
    assert "No clicks from this tab yet." in bystander.html["outcome"]
    # And back: through b, for the tab in a.
    assert (await add(b.url, on_a.id, n=2, op=1)).status_code == 204
    await on_a.until(lambda t: t.count() == 7 and "You added 2: 7." in t.html.get("outcome", ""))
    await on_b.until(lambda t: t.count() == 7)
    # A rejected command through a: its error reaches the acting tab in b, and only that tab.
    rejected = await add(a.url, on_b.id, n=1000, op=8)
    assert rejected.status_code == 422
    await on_b.until(lambda t: bool(t.errors))
    assert "Pick a number from 1 to 100." in on_b.errors[-1]
    assert count(db) == 7
    # Ordered after it, a good command shows; the bystander never saw the error.
    assert (await add(a.url, bystander.id, op=2)).status_code == 204
    await bystander.until(lambda t: t.count() == 8)
    assert bystander.errors == [] and on_a.errors == []
    for tab in (on_a, on_b, bystander):
        tab.close()


async def test_kill_9_of_one_process_under_load(
    server_factory: Callable[..., Server], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    db = tmp_path / "app.db"
    a, b = serve(server_factory, db), serve(server_factory, db)
    watching_b = await Tab(b.url).open(client)

    async def meanwhile() -> None:
        shown = watching_b.count() or 0  # b keeps serving, and its tabs keep updating
        await watching_b.until(lambda t: (t.count() or 0) > shown)
        a.start()  # the killed process restarts and catches up
        watching_a = await Tab(a.url).open(client)
        await watching_a.until(lambda t: t.count() is not None)
        watching_a.close()

    acknowledged, sent = await kill_a_under_load(a, b, meanwhile)
    total = count(db)
    assert acknowledged <= total <= sent  # nothing acknowledged lost
    watching_a = await Tab(a.url).open(client)
    for tab in (watching_a, watching_b):
        await tab.until(lambda t: t.count() == total)
        tab.close()


async def kill_a_under_load(a: Server, b: Server, meanwhile: Callable[[], Awaitable[None]]) -> tuple[int, int]:
    """Ten producers on each process; once a acknowledged 100 commands it is killed (SIGKILL,
    mid-batch most likely), b serves 100 more, then `meanwhile` runs before the producers stop.
    Returns the commands acknowledged and the commands sent."""
    acknowledged = {"a": 0, "b": 0}
    sent = 0
    stop = asyncio.Event()

    async def producer(name: str, server: Server) -> None:
        nonlocal sent
        async with httpx.AsyncClient(timeout=10) as c:
            while not stop.is_set():
                sent += 1
                try:
                    r = await c.post(f"{server.url}/add", json={"n": 1, "tab": "load"}, headers=COMMAND_HEADERS)
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)  # a is gone: its producers keep knocking
                    continue
                if r.status_code == 204:
                    acknowledged[name] += 1

    producers = [asyncio.create_task(producer(n, s)) for n, s in (("a", a), ("b", b)) for _ in range(10)]
    async with asyncio.timeout(30):
        while acknowledged["a"] < 100:
            await asyncio.sleep(0.02)
    a.proc.kill()  # type: ignore[union-attr]
    a.proc.wait()  # type: ignore[union-attr]
    before = acknowledged["b"]
    async with asyncio.timeout(30):
        while acknowledged["b"] < before + 100:
            await asyncio.sleep(0.02)
    await meanwhile()
    stop.set()
    await asyncio.gather(*producers)
    return acknowledged["a"] + acknowledged["b"], sent


async def add_from_200_producers(a: Server, b: Server) -> list[int]:
    """100 producers on each process, three commands each, all at once: their statuses.

    Each command has a key. 200 connections opened at once on a machine busy with other tests
    now and then lose one before its answer (`httpx.ReadError`); the producer sends that command
    again with its key, as a page's retry does, and the server applies it once either way.
    """
    results: list[int] = []
    keys = itertools.count(1)

    async def producer(c: httpx.AsyncClient, server: Server) -> None:
        for _ in range(3):
            headers = {**COMMAND_HEADERS, "Idempotency-Key": f"load-{next(keys)}"}
            for attempt in range(3):
                try:
                    r = await c.post(f"{server.url}/add", json={"n": 1, "tab": "load"}, headers=headers)
                except httpx.TransportError:
                    if attempt == 2:
                        raise
                    continue
                results.append(r.status_code)
                break

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as c:
        await asyncio.gather(*(producer(c, s) for s in (a, b) for _ in range(100)))
    return results


async def test_200_producers_over_two_processes_no_busy_errors(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    db = tmp_path / "app.db"
    # Connections wait their turn in the client's pool: keep them open longer than uvicorn's 5 s.
    args = ("--timeout-keep-alive", "60")
    a, b = serve(server_factory, db, args), serve(server_factory, db, args)
    assert await add_from_200_producers(a, b) == [204] * 600
    assert count(db) == 600
    for server in (a, b):
        assert "database is locked" not in server.output and "Traceback" not in server.output


@pytest.fixture
def two_servers(server_factory: Callable[..., Server], tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    db = tmp_path / "app.db"
    yield serve(server_factory, db), serve(server_factory, db)


def test_chromium_tabs_on_different_processes_see_each_other(
    two_servers: tuple[Server, Server], new_page: Callable[..., Page], tmp_path: Path
) -> None:
    pages = []
    for server in two_servers:
        page = new_page()
        page.goto(server.url)
        wait_for_datastar(page)
        pages.append(page)
    first, second = pages
    first.get_by_role("button", name="Add").click()
    for page in pages:
        expect(page.locator("#counter")).to_have_text("1")
    second.fill("input[aria-label=amount]", "3")
    second.get_by_role("button", name="Add").click()
    for page in pages:
        expect(page.locator("#counter")).to_have_text("4")
    expect(second.locator(".message")).to_have_text("You added 3: 4.")
    expect(first.locator(".message")).to_have_text("You added 1: 1.")
    assert count(tmp_path / "app.db") == 4
