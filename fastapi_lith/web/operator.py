"""Routes for an app's operator (the scrape, the dashboard): mounted only behind a guard.

They show the app's internals (its load, its views, its memory), so a router made here
refuses, at start-up, to serve a route that the app mounted without any dependency:

```python
app.include_router(lith.metrics_router, dependencies=[Depends(operator)])
app.include_router(lith.dashboard_router, dependencies=[Depends(lith.unguarded)])  # open, said aloud
```
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.responses import Response

from ..exceptions import SettingError
from .guard import api_routes

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def unguarded() -> None:
    """`Depends(lith.unguarded)`: an operator's route open to anyone, said aloud (a local
    server, or a guard the app keeps in a middleware). An empty list of dependencies is refused."""


def operator_router(prefix: str, *, included_as: str, lifespan: Lifespan | None = None) -> APIRouter:
    """An `APIRouter` out of OpenAPI whose lifespan first refuses any of its routes that the app
    mounted without a dependency; `included_as` is how the error tells the app to include it."""

    @contextlib.asynccontextmanager
    async def checked(app: FastAPI) -> AsyncIterator[None]:
        ours = {route.endpoint for route in router.routes if isinstance(route, APIRoute)}
        for route, mounted in api_routes(app.routes):
            if route.endpoint in ours and not mounted.dependencies:
                raise SettingError(
                    f"{route.path} shows the app's internals (its load, its views, its memory) and has no guard: "
                    f"include it with the app's own, app.include_router({included_as}, "
                    f"dependencies=[Depends(operator)]), or say that anyone may see it with "
                    f"dependencies=[Depends(lith.unguarded)]"
                )
        if lifespan is None:
            yield
        else:
            async with lifespan(app):
                yield

    router = APIRouter(prefix=prefix, include_in_schema=False, lifespan=checked)
    return router


def scrape_router(
    scrape: Callable[[], Awaitable[bytes]], content_type: str, prefix: str, *, included_as: str
) -> APIRouter:
    """`GET {prefix}/metrics`: what `scrape` writes, behind the app's guard."""
    router = operator_router(prefix, included_as=included_as)

    @router.get("/metrics")
    async def metrics() -> Response:
        """Every metric of the app (of every process, in multiprocess mode)."""
        return Response(await scrape(), media_type=content_type)

    return router
