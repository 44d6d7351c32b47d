"""tests/support/accessapp.py mounted under `/app` of another app, as a FastAPI app mounts a
sub-application: its stream path, which a token binds, is the same inside the mount. Served in
process by tests/web/test_access.py."""

from __future__ import annotations

from fastapi import FastAPI

from tests.support.inprocess import load_module

access_app = load_module("accessapp").app  # a copy of its own, with this server's environment

# A mount does not run its app's lifespan: the outer app runs it, for the app it mounts.
app = FastAPI(lifespan=lambda outer: access_app.router.lifespan_context(access_app))
app.mount("/app", access_app)
