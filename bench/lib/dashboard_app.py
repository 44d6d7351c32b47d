"""The kanban example with its dashboard and its metrics open to anyone: what bench/dashboard.py
serves (a bench on 127.0.0.1; an app guards both with its own dependency)."""

from fastapi import Depends

from examples.kanban.app import app, lith

app.include_router(lith.dashboard_router, dependencies=[Depends(lith.unguarded)])
app.include_router(lith.metrics_router, dependencies=[Depends(lith.unguarded)])

__all__ = ["app"]
