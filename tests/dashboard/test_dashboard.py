"""The dashboard over a real uvicorn: guarded by the app's dependency, out of the app's stream,
silent while nobody watches, live for whoever does. Every wait is on a condition."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from prometheus_client.parser import text_string_to_metric_families

from fastapi_lith import Lith, SettingError
from fastapi_lith.engine.streams import Stream
from tests.support import REPO, until
from tests.support.inprocess import InProcessServer

PASSWORD = "a password for this test only"
OPERATOR = {"Authorization": "Basic " + base64.b64encode(f"operator:{PASSWORD}".encode()).decode()}
STRANGER = {"Authorization": "Basic " + base64.b64encode(b"operator:guessed").decode()}
SAME_SITE = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}  # as a page sends it
VIEWS = "lith-dashboard/numbers,lith-dashboard/plots"
DOCS_APP = REPO / "docs" / "src" / "dashboard"


def serve(app_server: Callable[..., InProcessServer], db: Path) -> InProcessServer:
    """docs/src/dashboard/app.py: the clicks, its dashboard and its metrics for the operator."""
    return app_server("app:app", app_dir=DOCS_APP, env={"DASHBOARD_DB": str(db), "OPERATOR_PASSWORD": PASSWORD})


async def renders(client: httpx.AsyncClient, base: str) -> dict[str, float]:
    """lith_hub_renders_total by view, from the app's own metrics."""
    response = await client.get(f"{base}/lith/metrics", headers=OPERATOR)
    assert response.status_code == 200, response.text
    return {
        s.labels["view"]: s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if s.name == "lith_hub_renders_total"
    }


class Reading:
    """One stream read to its end in the background, its text decoded (identity encoding)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers, self.text = url, headers or {}, ""
        self.opened: asyncio.Future[int] | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self, client: httpx.AsyncClient) -> int:
        self.opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read(client))
        return await self.opened

    async def _read(self, client: httpx.AsyncClient) -> None:
        assert self.opened is not None
        try:
            headers = {"Accept-Encoding": "identity", **self.headers}
            async with client.stream("GET", self.url, headers=headers) as response:
                self.opened.set_result(response.status_code)
                async for text in response.aiter_text():
                    self.text += text
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            if not self.opened.done():
                self.opened.set_exception(RuntimeError(f"{self.url} did not open"))

    def last(self, metric: str) -> str | None:
        """The newest value of `dash-<metric>` the stream sent."""
        found = re.findall(rf'<dd id="dash-{metric}">([^<]*)</dd>', self.text)
        return found[-1] if found else None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def client() -> Any:
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as c:
        yield c


_ops = iter(range(1, 10**9))


async def add(client: httpx.AsyncClient, base: str, count: int) -> None:
    for _ in range(count):
        response = await client.post(f"{base}/click", json={"tab": "loader", "op": next(_ops)}, headers=SAME_SITE)
        assert response.status_code == 204, response.text


async def test_the_apps_guard_refuses_the_page_and_the_stream(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = serve(app_server, tmp_path / "app.db")
    for url in ("/lith/dashboard", f"/lith/dashboard/stream?views={VIEWS}&tab=t1"):
        anonymous = await client.get(server.url + url)
        assert anonymous.status_code == 401 and "lith-dashboard" not in anonymous.text
        refused = await client.get(server.url + url, headers=STRANGER)
        assert refused.status_code == 403 and "lith-dashboard" not in refused.text
    allowed = await client.get(f"{server.url}/lith/dashboard", headers=OPERATOR)
    assert allowed.status_code == 200
    assert 'id="lith-dashboard-numbers"' in allowed.text and "<svg" in allowed.text
    assert "/lith/dashboard" not in (await client.get(f"{server.url}/openapi.json")).text


async def test_the_apps_stream_refuses_the_dashboards_views(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = serve(app_server, tmp_path / "app.db")
    for key in VIEWS.split(","):
        refused = await client.get(f"{server.url}/lith/stream?views={key}&tab=t1", headers=OPERATOR)
        assert refused.status_code == 400, refused.text
        assert "no view matches" in refused.text
    # And the dashboard's stream serves its own views only, not the app's.
    other = await client.get(f"{server.url}/lith/dashboard/stream?views=clicks&tab=t1", headers=OPERATOR)
    assert other.status_code == 400, other.text


async def test_nobody_watching_renders_nothing_and_a_watcher_sees_the_numbers_change(
    app_server: Callable[..., InProcessServer], tmp_path: Path, client: httpx.AsyncClient
) -> None:
    server = serve(app_server, tmp_path / "app.db")
    tab = Reading(f"{server.url}/lith/stream?views=clicks,outcome/t1&tab=t1")
    assert await tab.open(client) == 200
    # A page load of the dashboard paints it once, outside the hub, and watches nothing.
    assert (await client.get(f"{server.url}/lith/dashboard", headers=OPERATOR)).status_code == 200
    await add(client, server.url, 100)

    async def clicks_rendered() -> dict[str, float] | None:
        seen = await renders(client, server.url)
        return seen if seen.get("clicks", 0) >= 2 else None

    seen = await until(clicks_rendered)
    assert seen.get("lith-dashboard/numbers", 0) == 0
    assert seen.get("lith-dashboard/plots", 0) == 0

    watcher = Reading(f"{server.url}/lith/dashboard/stream?views={VIEWS}&tab=w1", OPERATOR)
    assert await watcher.open(client) == 200

    async def first_numbers() -> str | None:
        return watcher.last("committed")

    before = int((await until(first_numbers)).replace(",", ""))
    assert before >= 100
    await add(client, server.url, 50)

    async def grew() -> bool:
        value = watcher.last("committed")
        return value is not None and int(value.replace(",", "")) >= before + 50

    await until(grew)
    assert "lith-dashboard-plots" in watcher.text and "<svg" in watcher.text
    watching = await renders(client, server.url)
    assert watching["lith-dashboard/numbers"] >= 2
    await watcher.close()

    # The last watcher gone, its views render no more, however many commands land.
    async def unwatched() -> dict[str, float] | None:
        response = await client.get(f"{server.url}/lith/metrics", headers=OPERATOR)
        streams = sum(
            s.value for f in text_string_to_metric_families(response.text) for s in f.samples
            if s.name == "lith_streams_open"
        )
        return await renders(client, server.url) if streams == 1 else None

    after = await until(unwatched)
    clicks_before = after["clicks"]
    await add(client, server.url, 50)

    async def clicks_again() -> dict[str, float] | None:
        seen = await renders(client, server.url)
        return seen if seen["clicks"] > clicks_before else None

    later = await until(clicks_again)
    assert later["lith-dashboard/numbers"] == after["lith-dashboard/numbers"]
    assert later["lith-dashboard/plots"] == after["lith-dashboard/plots"]
    await tab.close()


def app_with(lith: Lith, **include: Any) -> FastAPI:
    app = FastAPI()
    app.include_router(lith.router)
    app.include_router(lith.dashboard_router, **include)
    return app


@pytest.mark.parametrize("include", [{}, {"dependencies": []}])
async def test_a_dashboard_mounted_without_a_guard_is_refused_at_start_up(
    tmp_path: Path, include: dict[str, Any]
) -> None:
    lith = Lith(tmp_path / "app.db")
    app = app_with(lith, **include)
    with pytest.raises(SettingError, match="shows the app's internals"):
        async with app.router.lifespan_context(app):
            pass


async def test_a_dashboard_open_to_anyone_says_so(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "app.db")
    app = app_with(lith, dependencies=[Depends(lith.unguarded)])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            assert (await c.get("/lith/dashboard")).status_code == 200


async def test_an_app_view_may_not_take_a_dashboard_key(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "app.db")

    @lith.view("lith-dashboard/{part}")
    def mine(db: Any, part: str) -> Any:
        raise AssertionError("never rendered")

    app = app_with(lith, dependencies=[Depends(lith.unguarded)])
    with pytest.raises(SettingError, match="keeps for itself"):
        async with app.router.lifespan_context(app):
            pass


def test_an_app_that_never_draws_a_plot_never_imports_pygal(tmp_path: Path) -> None:
    code = (
        "import sys, fastapi_lith; from fastapi_lith import Lith; "
        "Lith('unused.db').dashboard_router; print('pygal' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False", out.stderr


async def test_a_watched_dashboard_stops_with_the_app_whichever_router_came_first(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "app.db")
    app = FastAPI()
    app.include_router(lith.dashboard_router, dependencies=[Depends(lith.unguarded)])  # its lifespan outside
    app.include_router(lith.router)
    dashboard = lith._dashboard
    assert dashboard is not None
    async with app.router.lifespan_context(app):
        stream = Stream("w1")
        await dashboard._open(stream, VIEWS.split(","))
        assert {f.key for f in await stream.next(10)} == set(VIEWS.split(","))
        assert dashboard._refresher is not None
    assert dashboard._refresher is None  # ended with the app, not by an error of the stopped engine
