"""Several app processes on one PostgreSQL database behave as one app.

Real uvicorn processes on 127.0.0.1, the counter example on a real server; streams are read over
HTTP as a browser would, every wait is on a condition with a generous deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import psycopg
from playwright.sync_api import Page, expect

from fastapi_lith.backends.postgres.db import dsn
from fastapi_lith.backends.postgres.feed import LISTENER_NAME
from tests.engine.test_workers import (  # noqa: F401 - client is a fixture
    APP,
    REPO,
    TESTS,
    Tab,
    add,
    add_from_200_producers,
    client,
    kill_a_under_load,
)
from tests.support.browser import Server, wait_for_datastar

__all__ = ["client"]


def serve(server_factory: Callable[..., Server], url: str, args: tuple[str, ...] = ()) -> Server:
    env = {"COUNTER_DB": url, "PYTHONPATH": str(REPO)}
    return server_factory(APP, cwd=TESTS, env=env, args=list(args))


def count(url: str) -> int:
    with psycopg.connect(dsn(url)) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


async def test_commands_views_and_errors_cross_processes(
    server_factory: Callable[..., Server], pg_url: str, client: httpx.AsyncClient
) -> None:
    a, b = serve(server_factory, pg_url), serve(server_factory, pg_url)
    on_a, on_b = await Tab(a.url).open(client), await Tab(b.url).open(client)
    assert on_a.pid != on_b.pid
    # Through a, for the tab whose stream lives in b: the counter everywhere, its outcome there.
    assert (await add(a.url, on_b.id, n=5, op=7)).status_code == 204
    for tab in (on_a, on_b):
        await tab.until(lambda t: t.count() == 5)
    await on_b.until(lambda t: "You added 5: 5." in t.html.get("outcome", ""))
    # And back through b.
    assert (await add(b.url, on_a.id, n=2, op=1)).status_code == 204
    await on_a.until(lambda t: t.count() == 7 and "You added 2: 7." in t.html.get("outcome", ""))
    await on_b.until(lambda t: t.count() == 7)
    # A rejected command through a: its error reaches the acting tab in b, and only that tab.
    assert (await add(a.url, on_b.id, n=1000, op=8)).status_code == 422
    await on_b.until(lambda t: bool(t.errors))
    assert "Pick a number from 1 to 100." in on_b.errors[-1]
    assert on_a.errors == [] and count(pg_url) == 7
    for tab in (on_a, on_b):
        tab.close()


async def test_a_dropped_listening_connection_recovers(
    server_factory: Callable[..., Server], pg_url: str, client: httpx.AsyncClient
) -> None:
    a, b = serve(server_factory, pg_url), serve(server_factory, pg_url)
    watching_b = await Tab(b.url).open(client)
    await watching_b.until(lambda t: t.count() == 0)
    name = psycopg.conninfo.conninfo_to_dict(dsn(pg_url))["dbname"]
    admin_dsn = psycopg.conninfo.make_conninfo(dsn(pg_url), dbname="postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        # No new connections for a moment: the listeners stay away while a commits.
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = %s", (LISTENER_NAME, name)
        ).fetchone()[0]
        assert killed == 2  # one listening connection per process
        for op in range(1, 4):  # nobody hears these: b's tab must catch up all the same
            assert (await add(a.url, "other", n=1, op=op)).status_code == 204
        await asyncio.sleep(0.3)
        assert watching_b.count() == 0
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await watching_b.until(lambda t: t.count() == 3)
        async with asyncio.timeout(15):  # and keeps following once the listener is back
            while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                                " AND datname = %s", (LISTENER_NAME, name)).fetchone()[0] < 2:
                await asyncio.sleep(0.05)
    assert (await add(a.url, "other", n=4, op=4)).status_code == 204
    await watching_b.until(lambda t: t.count() == 7)
    watching_b.close()


async def test_kill_9_of_one_process_loses_no_acknowledged_command(
    server_factory: Callable[..., Server], pg_url: str, client: httpx.AsyncClient
) -> None:
    a, b = serve(server_factory, pg_url), serve(server_factory, pg_url)
    watching_b = await Tab(b.url).open(client)

    async def meanwhile() -> None:
        pass

    acknowledged, sent = await kill_a_under_load(a, b, meanwhile)
    total = count(pg_url)
    assert acknowledged <= total <= sent  # nothing acknowledged lost
    await watching_b.until(lambda t: t.count() == total)
    watching_b.close()


async def test_200_producers_over_two_processes_no_errors(
    server_factory: Callable[..., Server], pg_url: str
) -> None:
    args = ("--timeout-keep-alive", "60")
    a, b = serve(server_factory, pg_url, args), serve(server_factory, pg_url, args)
    assert await add_from_200_producers(a, b) == [204] * 600
    assert count(pg_url) == 600
    for server in (a, b):
        assert "Traceback" not in server.output


def test_chromium_tabs_on_different_processes_see_each_other(
    server_factory: Callable[..., Server], pg_url: str, new_page: Callable[..., Page]
) -> None:
    pages = []
    for server in (serve(server_factory, pg_url), serve(server_factory, pg_url)):
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
    assert count(pg_url) == 4
