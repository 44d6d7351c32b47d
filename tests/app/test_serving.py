"""`python -m fastapi_lith serve`: uvicorn with the deploy unit's command line, and granian,
real processes on 127.0.0.1, with the same settings: streams, commands, the proxy's headers,
SIGTERM with streams open, a page in Chromium across a restart."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from fastapi_lith.cli import build_parser, main, serving_of
from fastapi_lith.serving import Serving, uvicorn_args
from tests.support import REPO, SUPPORT, line_with, to_the_end
from tests.support.browser import Server, wait_for_datastar

# The unit's ExecStart before it named a server: uvicorn's own command line, flag for flag.
UVICORN_AS_THE_UNIT_RAN_IT = (
    "myapp.app:app --fd 3 --workers 2 --loop uvloop --http httptools --timeout-graceful-shutdown 10"
    " --backlog 16384 --proxy-headers --forwarded-allow-ips * --no-server-header"
    " --log-config /srv/lith/myapp/logging.json"
)


def test_uvicorn_is_given_the_command_line_the_unit_gave_it() -> None:
    unit = ("serve myapp.app:app --server uvicorn --fd 3 --workers 2 --timeout-graceful-shutdown 10 --backlog 16384"
            " --forwarded-allow-ips * --log-config /srv/lith/myapp/logging.json")  # fmt: skip
    serving = serving_of(build_parser().parse_args(unit.split()))
    assert uvicorn_args(serving) == UVICORN_AS_THE_UNIT_RAN_IT.split()
    assert serving == Serving("myapp.app:app", fd=3, workers=2, forwarded_allow_ips="*",
                              log_config=Path("/srv/lith/myapp/logging.json"))  # fmt: skip
    default = uvicorn_args(serving_of(build_parser().parse_args(["serve", "app:app"])))
    assert default[:5] == ["app:app", "--host", "127.0.0.1", "--port", "8000"]


# -- granian: a stream, a command, the end of both at SIGTERM --------------------------------------


def open_stream(server: Server, tab: str) -> Iterator[Iterator[str]]:
    """The lines of one tab's stream of the board (identity: the events as they are sent)."""
    url = f"{server.url}/lith/stream?views=board&tab={tab}"
    with httpx.stream("GET", url, headers={"Accept-Encoding": "identity"}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        yield response.iter_lines()


@pytest.fixture
def board(granian: None, server_factory: Callable[..., Server], tmp_path: Path) -> Server:
    """tests/support/streamapp.py's board of 200 cards, served by granian."""
    return server_factory("streamapp:app", cwd=SUPPORT, env={"STREAM_DB": str(tmp_path / "b.db")}, server="granian")


def test_granian_serves_a_stream_its_first_frame_and_a_commands_change(board: Server) -> None:
    server = board
    context = open_stream(server, "t1")
    lines = next(context)
    assert line_with(lines, 'elements <main id="board">')  # the first frame: the whole board
    answer = httpx.post(f"{server.url}/rename", json={"card": 7, "title": "Renamed under granian"})
    assert answer.status_code == 204 and answer.headers["server"] == "granian"  # no option removes it
    assert "Renamed under granian" in line_with(lines, "Renamed under granian")
    context.close()
    assert 'INFO] Listening at: http://127.0.0.1:' in server.output


def test_sigterm_with_streams_open_ends_them_and_keeps_every_acknowledged_command(
    board: Server, tmp_path: Path
) -> None:
    """granian's worker runs the app's shutdown at the signal: the streams end, the command the
    writer holds and those queued behind it are committed and answered, and every command that
    had its 204 is in the file, with no worker killed at the graceful bound."""
    server = board
    contexts = [open_stream(server, f"t{i}") for i in range(4)]
    streams = [next(context) for context in contexts]
    for lines in streams:
        line_with(lines, 'elements <main id="board">')

    acknowledged: list[int] = []  # the cards whose rename answered 204

    def rename_until_refused() -> None:
        with httpx.Client(timeout=30) as client:
            for card in range(1, 200):
                try:
                    answer = client.post(f"{server.url}/rename", json={"card": card, "title": f"kept {card}"})
                except httpx.HTTPError:
                    return
                if answer.status_code != 204:
                    return
                acknowledged.append(card)

    renaming = threading.Thread(target=rename_until_refused)
    renaming.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < 3:  # commands are landing
        assert time.monotonic() < deadline and renaming.is_alive()
        time.sleep(0.01)
    held: list[httpx.Response] = []
    hold = {"card": 200, "title": "held through shutdown", "folder": str(tmp_path)}
    holding = threading.Thread(target=lambda: held.append(httpx.post(f"{server.url}/hold", json=hold, timeout=60)))
    holding.start()
    while not (tmp_path / "started").exists():  # the writer is applying it; renames queue behind
        assert time.monotonic() < deadline and holding.is_alive()
        time.sleep(0.01)
    assert server.proc is not None
    server.proc.send_signal(15)  # SIGTERM, as systemd stops the unit
    for lines in streams:
        to_the_end(lines)
    (tmp_path / "go").touch()
    holding.join(60)
    renaming.join(60)
    assert [answer.status_code for answer in held] == [204]  # the caller hears it landed
    assert server.proc.wait(30) == 0, server.output
    assert "refused to gracefully stop" not in server.output
    with closing(sqlite3.connect(tmp_path / "b.db")) as conn:
        titles = dict(conn.execute("SELECT id, title FROM cards").fetchall())
    assert titles[200] == "held through shutdown"
    assert [card for card in acknowledged if titles[card] != f"kept {card}"] == []
    for context in contexts:
        context.close()


def test_granian_keeps_accepting_past_as_many_open_streams_as_its_backlog(
    granian: None, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """granian's default backpressure, the backlog per worker, counts each open stream (a request
    that never ends) and stops accepting at it: serve lifts it, so the tab after that many still
    gets its page and a command its answer."""
    backlog = 128  # granian's least
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(tmp_path / "c.db")},
                            server="granian", args=["--backlog", str(backlog)])  # fmt: skip
    host, port = "127.0.0.1", server.port
    tabs = []
    try:
        for i in range(backlog + 2):
            tab = socket.create_connection((host, port), timeout=30)
            tabs.append(tab)
            tab.sendall(f"GET /lith/stream?views=counter&tab=s{i} HTTP/1.1\r\nHost: {host}\r\n"
                        "Sec-Fetch-Site: same-origin\r\nAccept-Encoding: identity\r\n\r\n".encode())  # fmt: skip
            assert tab.recv(15) == b"HTTP/1.1 200 OK"  # this one is served and stays open
        answer = httpx.post(f"{server.url}/add", json={"n": 1, "tab": "t1", "op": 1}, timeout=30,
                            headers={"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"})  # fmt: skip
        assert answer.status_code == 204
    finally:
        for tab in tabs:
            tab.close()


def test_a_granian_worker_that_dies_is_replaced_and_the_service_goes_on(
    granian: None, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """As uvicorn's supervisor does: one worker killed (-9, as the kernel's OOM killer does) is
    started again, and the service goes on instead of exiting for systemd to restart it all."""
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(tmp_path / "c.db")},
                            server="granian", args=["--workers", "2"])  # fmt: skip

    def started(count: int) -> bool:
        return server.output.count("Started worker-") >= count

    deadline = time.monotonic() + 60
    while not started(2):
        assert time.monotonic() < deadline and server.running, server.output
        time.sleep(0.05)
    first = re.search(r"Spawning worker-1 with PID: (\d+)", server.output)
    assert first, server.output
    os.kill(int(first.group(1)), 9)
    while not started(3):
        assert time.monotonic() < deadline and server.running, server.output
        time.sleep(0.05)
    assert "Respawning worker-1" in server.output
    answer = httpx.post(f"{server.url}/add", json={"n": 1, "tab": "t1", "op": 1},
                        headers={"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"})  # fmt: skip
    assert answer.status_code == 204


# -- behind Caddy: the scheme the same-origin check compares comes from its header ----------------


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_the_proxys_scheme_reaches_the_same_origin_check_from_trusted_addresses_only(
    server_factory: Callable[..., Server], tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    """A page at https://app.example.com posts through Caddy, which speaks plain HTTP to the app
    and says X-Forwarded-Proto: https. Believed from the addresses --forwarded-allow-ips names,
    the Origin matches; from any other, the request is cross-site."""
    if server == "granian":
        request.getfixturevalue("granian")
    env = {"COUNTER_DB": str(tmp_path / "c.db")}
    through_caddy = {"Host": "app.example.com", "Origin": "https://app.example.com", "Datastar-Request": "true",
                     "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}  # fmt: skip
    trusted = server_factory("examples.counter.app:app", cwd=REPO, env=env, server=server,
                             args=["--forwarded-allow-ips", "127.0.0.1"])  # fmt: skip
    answer = httpx.post(f"{trusted.url}/add", json={"n": 1, "tab": "t1", "op": 1}, headers=through_caddy)
    assert answer.status_code == 204, answer.text
    trusted.stop()
    other = server_factory("examples.counter.app:app", cwd=REPO, env=env, server=server,
                           args=["--forwarded-allow-ips", "192.0.2.1"])  # fmt: skip
    answer = httpx.post(f"{other.url}/add", json={"n": 1, "tab": "t1", "op": 2}, headers=through_caddy)
    assert answer.status_code == 403 and "Origin https://app.example.com is not http://app.example.com" in answer.text


# -- what serve refuses ------------------------------------------------------------------------------


def test_serve_refuses_a_socket_it_cannot_serve_on_with_the_reason(
    granian: None, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_socket = os.open(os.devnull, os.O_RDONLY)
    idle = socket.socket()  # never listened on
    try:
        assert main(["serve", "app:app", "--server", "granian", "--fd", str(not_a_socket)]) == 1
        assert f"error: fd {not_a_socket} is not a socket this process was given" in capsys.readouterr().err
        assert main(["serve", "app:app", "--server", "granian", "--fd", str(idle.fileno())]) == 1
        assert f"error: fd {idle.fileno()} is not a listening socket" in capsys.readouterr().err
        idle.getsockname()  # still open: serve leaves a socket it refused to the caller
    finally:
        os.close(not_a_socket)
        idle.close()
    assert main(["serve", "app:app", "--server", "granian", "--log-config", os.devnull]) == 1
    assert f"error: the log config {os.devnull} cannot be read as JSON" in capsys.readouterr().err
    assert main(["serve", "app:app", "--fd", "3", "--port", "8001"]) == 2
    assert "no --host or --port with it" in capsys.readouterr().err
    assert main(["serve", "app:app", "--workers", "0"]) == 1
    assert "workers must be 1 or more, not 0" in capsys.readouterr().err
    assert main(["serve", "app:app", "--timeout-graceful-shutdown", "0"]) == 1
    assert "the graceful shutdown's bound must be 1 s or more, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["serve", "app:app", "--server", "hypercorn"])
    assert exited.value.code == 2 and "invalid choice: 'hypercorn'" in capsys.readouterr().err


# -- in Chromium: a click shows in every page, and the pages come back after a restart -------------


@pytest.mark.browser
def test_pages_served_by_granian_update_and_come_back_after_a_restart(
    granian: None, new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(tmp_path / "c.db")},
                            server="granian")  # fmt: skip
    pages: list[Any] = [new_page(), new_page()]
    for page in pages:
        page.goto(f"{server.url}/")
        wait_for_datastar(page)
        page.evaluate("window.sameDocument = true")
    pages[0].get_by_role("button", name="Add").click()
    for page in pages:
        expect(page.locator("#counter")).to_have_text("1", timeout=10_000)
    server.restart()
    assert not server.killed, server.output  # the streams ended at SIGTERM
    pages[1].get_by_role("button", name="Add").click()
    for page in pages:
        expect(page.locator("#counter")).to_have_text("2", timeout=40_000)
        assert page.evaluate("window.sameDocument") is True  # no reload happened
