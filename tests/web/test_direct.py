"""A `lith.command` route is served without FastAPI's dependency solving, with FastAPI's answers.

The helper app has one command on two routes: `/direct`, served directly, and `/solved`, the
same with a dependency of its own, which FastAPI serves. Any request at all gets the same
answer from both (status, content type, the HTML a page shows) and writes the same; an override
of one of the route's dependencies, set while the app runs, is obeyed from the next request.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fastapi_lith.web.direct import DirectRoute
from fastapi_lith.web.guard import GuardedRoute, api_routes
from tests.support.inprocess import InProcessServer
from tests.web.test_input_fuzz import (
    FUZZ,
    SAME_ORIGIN,
    Answer,
    bodies,
    content_types,
    exchange,
    extra_headers,
    keys,
    request,
    same_origin,
)

# FastAPI's settings the route reads: its defaults; a body sent with no content type read as
# JSON; FastAPI's own body limit, below the app's `max_body` (then FastAPI serves the route).
FASTAPI_SETTINGS = [{}, {"strict_content_type": False}, {"max_body_size": 1000}]


@pytest.fixture(scope="module", params=FASTAPI_SETTINGS, ids=["defaults", "not-strict", "fastapi-body-limit"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    db = tmp_path_factory.mktemp("direct") / "direct.db"
    env = {"DIRECT_DB": str(db), "DIRECT_FASTAPI": json.dumps(request.param)}
    with InProcessServer("directapp:app", env=env) as served:
        served.db = db  # type: ignore[attr-defined]
        yield served


def served_by(app: Any, path: str) -> Any:
    """What serves `path` inside its guard."""
    for route, holder in api_routes(app.router.routes):
        if route.path == path:
            assert isinstance(holder.app, GuardedRoute), path
            return holder.app.app
    raise AssertionError(path)


def notes(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT route, count(*) FROM note GROUP BY route").fetchall())


def send(server: InProcessServer, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
    return exchange(server.port, request(server.port, "POST", path.encode(), headers, body, chunked=False))


def test_a_command_route_with_only_the_librarys_dependencies_is_served_directly(server: InProcessServer) -> None:
    app = server.module.app
    # FastAPI's own body limit wraps each route: FastAPI serves it, so that its limit holds.
    assert isinstance(served_by(app, "/direct"), DirectRoute) is (app.max_body_size is None)
    assert not isinstance(served_by(app, "/solved"), DirectRoute)  # a dependency of its own


signals = st.fixed_dictionaries(
    {"tab": st.sampled_from(["t1", "t2", "", "x" * 70])},
    optional={"op": st.one_of(st.integers(-1, 5), st.text(max_size=3)), "text": st.sampled_from(["a", "no", "", "x" * 60]),
              "count": st.one_of(st.integers(0, 12), st.none())},
).map(lambda s: json.dumps(s).encode())


@FUZZ
@given(body=st.one_of(bodies, signals), content_type=content_types, origin=same_origin, key=keys, extra=extra_headers)
@example(body=b"", content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b"null", content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'{"tab": "t", "op": 1, "text": "a"}', content_type=None, origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'{"tab": "t", "op": 2, "text": "no"}', content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'{"tab": "t", "op": 0, "text": "no"}', content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'{"tab": "t", "op": 3', content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'"\xff"', content_type=b"application/json", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b"tab=t&op=4&text=form", content_type=b"application/x-www-form-urlencoded", origin=SAME_ORIGIN, key=None, extra=[])
@example(body=b'{"tab": "t", "op": 5, "text": "' + b"x" * 2000 + b'"}', content_type=b"application/json",
         origin=SAME_ORIGIN, key=None, extra=[])
def test_both_routes_answer_any_request_alike(
    server: InProcessServer, body: bytes, content_type: bytes | None, origin: list[tuple[bytes, bytes]], key: Any,
    extra: list[tuple[bytes, bytes]],
) -> None:
    headers = [(name, value.replace(b"{port}", str(server.port).encode())) for name, value in origin]
    if content_type is not None:
        headers.append((b"Content-Type", content_type))
    headers += [(name, value) for name, value in extra if name.lower() not in (b"content-length", b"transfer-encoding", b"host")]
    answers = []
    for path, suffix in (("/direct", b"-d"), ("/solved", b"-s")):
        # Each route its own idempotency key: one route's first send is not the other's repeat.
        keyed = headers if key is None else [*headers, (b"Idempotency-Key", (key.encode() if isinstance(key, str) else key) + suffix)]
        answer = send(server, path, keyed, body)
        answers.append((answer.status, answer.headers.get(b"content-type"), answer.body))
    assert answers[0] == answers[1]
    written = notes(server.db)  # type: ignore[attr-defined]
    assert written.get("direct", 0) == written.get("solved", 0)


def test_an_override_set_while_the_app_runs_is_obeyed(server: InProcessServer) -> None:
    app, lith = server.module.app, server.module.lith
    command = server.module.ToDirect
    page = [*SAME_ORIGIN, (b"Content-Type", b"application/json")]

    async def fixed() -> Any:
        return command(tab="o", op=0, text="overridden", count=2)

    before = notes(server.db).get("direct", 0)  # type: ignore[attr-defined]
    app.dependency_overrides[lith.body(command)] = fixed
    try:
        assert send(server, "/direct", page, b'{"tab": "o", "text": "sent"}').status == 204
        assert notes(server.db)["direct"] == before + 2  # type: ignore[attr-defined]
    finally:
        del app.dependency_overrides[lith.body(command)]
    assert send(server, "/direct", page, b'{"tab": "o", "text": "sent"}').status == 204
    assert notes(server.db)["direct"] == before + 3  # type: ignore[attr-defined]
