"""Two thousand real tabs on a real uvicorn: asleep and awake, a restart, the reconnects' spread.

Each tab is a real HTTP/1.1 SSE stream from bench/lib/tabs.py's client, decoded as it arrives
and reconnected as Datastar 1.0 does; the server is the counter example (bench/lib/tabsapp.py)
with the unit's flags. Every wait is on a condition, bounded so a hang fails instead.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.lib import client
from bench.lib.server import Server
from bench.lib.tabs import COUNTER, Herd, raise_file_limit

TABS = 2000
SHARED = "/lith/stream?views=counter,outcome/{tab}&tab={tab}"
# A view large enough to open a zstd window, for the tabs that hibernate: the counter's writes
# go alone and hold none.
STATUS = "/lith/stream?views=status,outcome/{tab}&tab={tab}"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    raise_file_limit()
    servers: list[Server] = []

    def start(*, held: bool = False, **env: str) -> Server:
        server = Server("bench.lib.tabsapp:app", env={"COUNTER_DB": str(tmp_path / "counter.db"), **env},
                        access_log=False, log=tmp_path / f"server-{len(servers)}.log", held=held)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.close()


async def change(herd: Herd, timeout: float = 40) -> int:
    """POST /add and wait until every tab shows the new count; the tabs that never did."""
    value = max(t.latest for t in herd.tabs) + 1
    herd.watch(value)
    status, _ = await herd.post("/add", {"n": 1})
    assert status == 204
    await herd.until(lambda h: h.current >= len(h.tabs), timeout)
    return herd.missed(value)


def test_two_thousand_tabs_fall_asleep_and_wake_without_losing_a_change(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(TABS_HIBERNATE_AFTER="1")

    async def run() -> None:
        herd = Herd(server.port, STATUS, COUNTER, encoding="zstd")
        try:
            await herd.open(TABS, timeout=50)
            for _ in range(2):
                assert await herd.until(lambda h: h.asleep >= TABS, 30), f"{herd.asleep} of {TABS} hibernated"
                assert await change(herd) == 0
            assert all(t.connects == 1 for t in herd.tabs), "a stream ended instead of hibernating"
        finally:
            await herd.close()

    client.run(run())


def test_a_restart_with_two_thousand_tabs_brings_every_one_back_current(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(TABS_RECONNECT_WITHIN="2")

    async def run() -> None:
        herd = Herd(server.port, SHARED, COUNTER, encoding="zstd")
        try:
            await herd.open(TABS, timeout=50)
            server.stop(signal.SIGTERM)
            server.start()
            assert await change(herd, timeout=50) == 0
            assert all(t.connects == 2 for t in herd.tabs)
            assert herd.statuses() == {}, "answers other than 200 while the tabs came back"
        finally:
            await herd.close()

    client.run(run())


def test_a_restart_on_a_held_socket_refuses_no_connect_and_brings_every_tab_back_current(serve) -> None:  # type: ignore[no-untyped-def]
    """deploy/lith@.socket's way: the socket outlives the process, so every reconnect made while
    no process serves waits in its queue; none is refused, so none is backed off from."""
    server = serve(held=True, TABS_RECONNECT_WITHIN="2")

    async def run() -> None:
        herd = Herd(server.port, SHARED, COUNTER, encoding="zstd")
        try:
            await herd.open(TABS, timeout=50)
            # Stopped and started beside the loop, so the tabs reconnect while no process serves.
            stopped_at = time.perf_counter()
            await asyncio.to_thread(server.stop, signal.SIGTERM)
            with socket.create_connection(("127.0.0.1", server.port), timeout=60) as waiting:  # queued, not refused
                waiting.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                await asyncio.to_thread(server.start)
                assert (await asyncio.to_thread(waiting.recv, 64)).startswith(b"HTTP/1.1 200")
            assert await change(herd, timeout=50) == 0
            assert herd.refused() == 0, f"{herd.refused()} connects refused"
            assert herd.failures() == {}, herd.failures()
            # Once before the restart, once after. A tab that came a third time (seen once in a
            # full suite, never alone) says when, for the next time.
            extra = [(t.id, [round(at - stopped_at, 2) for at in t.connected_at], t.retries)
                     for t in herd.tabs if t.connects != 2]
            assert not extra, f"{len(extra)} tabs connected other than twice (s after the stop, retry:): {extra[:5]}"
            assert herd.statuses() == {}, "answers other than 200 while the tabs came back"
        finally:
            await herd.close()

    client.run(run())


@pytest.mark.parametrize("encoding", ["zstd", "br", "gzip", "identity"])
def test_each_stream_tells_its_tab_when_to_come_back_spread_over_the_window(serve, encoding: str) -> None:  # type: ignore[no-untyped-def]
    server = serve(TABS_RECONNECT_WITHIN="3")
    count = 300

    async def run() -> list[int]:
        herd = Herd(server.port, SHARED, COUNTER, encoding=encoding)
        try:
            await herd.open(count, timeout=50)
            # One `retry:` per stream, in its first event: decoded out of the compressed body.
            assert all(len(t.retries) == 1 and t.arrivals for t in herd.tabs)
            return [t.retries[0] for t in herd.tabs]
        finally:
            await herd.close()

    retries = client.run(run())
    assert all(1000 <= r <= 3000 for r in retries), retries
    assert len(set(retries)) > count * 3 // 4, "the values are not drawn for each stream"
    assert min(retries) < 1500 and max(retries) > 2500, "the values do not spread over the window"
