"""A stream's body straight to uvicorn (fastapi_lith.web.server_send): taken behind layers that
only watch a response begin, never past one that reads bodies, an `@app.middleware("http")` or
a mount; either way the tab gets every change. The counter example on a real uvicorn, in process."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope

from fastapi_lith.web.server_send import server_send
from tests.support import holds, until
from tests.support.inprocess import InProcessServer
from tests.web.test_input import JSON, TabStream

Serve = Callable[[str], InProcessServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Starts the counter behind layers of a kind (tests/support/layersapp.py); stops them after."""
    servers: dict[str, InProcessServer] = {}

    def start(kind: str) -> InProcessServer:
        env = {"LAYERS_KIND": kind, "COUNTER_DB": str(tmp_path / f"{kind}.db")}
        servers[kind] = InProcessServer("layersapp:app", env=env).start()
        return servers[kind]

    yield start
    for server in servers.values():
        server.close()


def add(server: InProcessServer, tab: str, n: int, prefix: str = "") -> None:
    """The page's click that adds `n`, its `n`th (a tab numbers its clicks from 1)."""
    response = httpx.post(f"{server.url}{prefix}/add", json={"tab": tab, "op": n, "n": n}, headers=JSON)
    assert response.status_code == 204, response.text


def counts(stream: TabStream) -> list[int]:
    return [int(n) for n in re.findall(rb'<p id="counter" class="count">(\d+)</p>', stream.data)]


async def shows(stream: TabStream, total: int) -> None:
    """Until the newest count the stream sent is `total`."""
    await until(holds(lambda: counts(stream)[-1:] == [total]))


async def test_behind_layers_that_pass_bodies_on_a_stream_writes_to_uvicorn_itself(serve: Serve) -> None:
    server = serve("known")
    assert httpx.get(server.url + "/direct").json() == {"direct": True}
    stream = TabStream(server, "t1", views="counter,outcome/{tab}")
    try:
        stream.wait_for('<p id="counter" class="count">0</p>')
        for n, total in ((1, 1), (2, 3), (3, 6)):
            add(server, "t1", n)
            await shows(stream, total)
        stream.wait_for("You added 3: 6.")
    finally:
        stream.close()


async def test_a_layer_that_reads_bodies_gets_every_chunk_of_a_stream(serve: Serve) -> None:
    server = serve("recorder")
    assert httpx.get(server.url + "/direct").json() == {"direct": False}
    stream = TabStream(server, "t1", views="counter,outcome/{tab}")
    try:
        for n, total in ((1, 1), (2, 3), (3, 6)):
            add(server, "t1", n)
            await shows(stream, total)
        recorded = server.module.RECORDED["/lith/stream"]  # type: ignore[union-attr]
        # Everything the tab read went through the layer, and nothing else did.
        await until(holds(lambda: bytes(recorded) == stream.data))
        assert b"You added 3: 6." in recorded
    finally:
        stream.close()


@pytest.mark.parametrize(("kind", "prefix"), [("http", ""), ("mounted", "/app"), ("telemetry", "")])
async def test_an_http_middleware_a_mount_or_fastapis_telemetry_keeps_the_whole_chain(serve: Serve, kind: str, prefix: str) -> None:
    server = serve(kind)
    assert httpx.get(f"{server.url}{prefix}/direct").json() == {"direct": False}
    stream = TabStream(_Under(server, prefix), "t1", views="counter,outcome/{tab}")  # type: ignore[arg-type]
    try:
        add(server, "t1", 5, prefix)
        await shows(stream, 5)
    finally:
        stream.close()


async def another_servers_receive() -> Message:
    return {"type": "http.disconnect"}


class _Wrapper:
    """A layer that wraps `receive` in a method of its own."""

    async def receive(self) -> Message:
        return {"type": "http.disconnect"}


@pytest.mark.parametrize(
    ("scope", "receive"),
    [
        ({"type": "http", "app": FastAPI()}, another_servers_receive),
        ({"type": "http", "app": FastAPI()}, _Wrapper().receive),
        ({"type": "http"}, another_servers_receive),
    ],
    ids=["another-server", "a-wrapped-receive", "no-app"],
)
def test_without_uvicorns_own_receive_or_an_app_a_body_takes_the_chain(scope: Scope, receive: Receive) -> None:
    assert server_send(scope, receive) is None


class _Under:
    """A server's address under a mount, for TabStream."""

    def __init__(self, server: InProcessServer, prefix: str) -> None:
        self.url = server.url + prefix
