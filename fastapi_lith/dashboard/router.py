"""The dashboard's page and stream, mounted by the app behind its own guard.

```python
app.include_router(lith.dashboard_router, dependencies=[Depends(operator)])
```

`GET {prefix}/dashboard` is the page; `GET {prefix}/dashboard/stream` its stream, served by the
app's own hub from the dashboard's own views: the app's stream route cannot name them, and
neither needs the app's identity or secret. The router's dependencies guard both routes, and
a dashboard mounted with none is refused at start-up: it shows the app's internals. An app
that means it to be open says so with `dependencies=[Depends(lith.unguarded)]`.

Nobody watching costs nothing: the instances of its views exist only while a stream watches
them, and the refresher that samples the metrics and touches their topics runs only then.
Watched, each refresh renders the numbers once for every watcher (the plots at most once a
second), and each watcher's frame is compressed like any stream's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import htpy as h
from fastapi import Depends, FastAPI
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..engine.db import Db
from ..engine.encoders import Encoder
from ..engine.engine import Engine
from ..engine.hub import Hub
from ..engine.streams import Stream, Subscription
from ..engine.views import Views
from ..exceptions import SettingError, ViewError
from ..ops.metrics import Metrics
from ..web.access import StreamRoute
from ..web.layer import WebLayer, stream_expression
from ..web.operator import operator_router
from ..web.page import new_tab
from ..web.sse import stream_response
from . import views as html
from .readings import Reader, Readings, Samples

TOPIC_OF = {html.NUMBERS: "lith-dashboard:numbers", html.PLOTS: "lith-dashboard:plots"}


class Dashboard:
    """One app's dashboard: its views, its refresher and its router (`lith.dashboard_router`)."""

    def __init__(self, metrics: Metrics, engine: Engine, web: WebLayer, app_views: Views, *, prefix: str) -> None:
        self.metrics = metrics
        self.engine = engine
        self.web = web
        self.app_views = app_views
        self.url = f"{prefix}/dashboard"
        self.views = Views()
        self.views.register(html.NUMBERS, topics={TOPIC_OF[html.NUMBERS]})(self._numbers)
        self.views.register(html.PLOTS, topics={TOPIC_OF[html.PLOTS]})(self._plots)
        self.readings = Readings()
        self._drawn = Markup()
        self._reader = Reader()
        self._refresher: asyncio.Task[None] | None = None
        self.router = operator_router(self.url, included_as="lith.dashboard_router", lifespan=self._lifespan)
        self.router.add_api_route("", self.page, methods=["GET"], response_class=HTMLResponse)
        # A 403 of the guard answers the stream as a refusal, so that the page stops retrying.
        self.router.add_api_route("/stream", self._stream_endpoint(), methods=["GET"], route_class_override=StreamRoute)

    # -- what it shows ------------------------------------------------------------------------

    def _numbers(self, db: Db) -> Markup:
        return html.numbers(self.readings)

    def _plots(self, db: Db) -> Markup:
        return self._drawn

    async def _draw(self) -> None:
        """Draw the plots beside the loop and the hub's tick, which then only copies them: the
        app's own views, rendered in the same tick, never wait for pygal."""
        readings = self.readings
        self._drawn = Markup(await anyio.to_thread.run_sync(lambda: str(html.plots(readings))))

    def refresh(self) -> bool:
        """Sample the engine into the metrics and read them once; True if the plots got a point."""
        self.metrics.sample()
        self.readings, plotted = self._reader.read(Samples(self.metrics.registry.collect()))
        return plotted

    @staticmethod
    def watched(hub: Hub) -> bool:
        """Some stream watches the dashboard: the hub keeps only the instances that are watched."""
        return html.NUMBERS in hub.instances or html.PLOTS in hub.instances

    async def _refresh_while_watched(self) -> None:
        """Every hub tick while a stream watches: sample, then mark the numbers (and, once a
        second, the plots) dirty for the hub's next tick. Ends when the last watcher goes."""
        hub = self.engine.hub  # this run's: a stopped hub has ended every stream, so the loop ends
        try:
            while self.watched(hub):
                if self.refresh():
                    await self._draw()
                    hub.touched((TOPIC_OF[html.NUMBERS], TOPIC_OF[html.PLOTS]))
                else:
                    hub.touched((TOPIC_OF[html.NUMBERS],))
                await asyncio.sleep(self.engine.tick)
        finally:
            self._refresher = None

    # -- the routes ---------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        """The dashboard: both views for the first paint, then its stream."""
        tab = new_tab()
        self.refresh()
        await self._draw()
        keys = ",".join(TOPIC_OF)  # both views
        page = h.html(lang="en")[
            h.head[
                h.meta(charset="utf-8"),
                h.meta(name="viewport", content="width=device-width, initial-scale=1"),
                h.title["Dashboard · fastapi-lith"],
                h.style[Markup(html.CSS)],
            ],
            h.body(data_init=stream_expression(f"{self.url}/stream", f"views={keys}&tab={tab}"))[
                self.web.datastar(),
                h.header[h.h1["Dashboard"], h.p[f"process {os.getpid()}, every number of this app's lith.metrics"]],
                html.numbers(self.readings),
                self._drawn,
            ],
        ]
        return HTMLResponse(str(page))

    def _stream_endpoint(self) -> Callable[..., Any]:
        async def stream(request: Request, encoder: Encoder = Depends(self.web.encoder)) -> Response:
            """The dashboard's views only, for no principal: the guard is the router's."""
            settings = self.web.settings
            return await stream_response(
                self._open, request, encoder, keepalive=settings.keepalive,
                hibernate_after=settings.hibernate_after, send_timeout=settings.send_timeout,
                reconnect_within=settings.reconnect_within,
            )

        return stream

    async def _open(self, stream: Stream, keys: list[str]) -> Subscription:
        hub = self.engine.hub
        if not self.watched(hub):  # the first frames show now, not what the last watcher saw
            self.refresh()
            await self._draw()
        subscription = await hub.open(stream, keys, views=self.views)
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_while_watched(), name="lith-dashboard")
        return subscription

    # -- start-up: refuse an unguarded mount ----------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.check()
        try:
            yield
        finally:
            task = self._refresher
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def check(self) -> None:
        """Refuse an app view that would take one of the dashboard's keys (its stream would then
        watch the dashboard's frames); the router itself refuses an unguarded mount."""
        for key in TOPIC_OF:  # each view's key
            try:
                view, _ = self.app_views.resolve(key)
            except ViewError:
                continue
            raise SettingError(f"the app's view {view.pattern!r} matches {key!r}, a key the dashboard keeps for itself")
