"""The browser harness itself: Datastar from the (routed) CDN, Chromium, real servers."""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import threading
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from bench.lib.proc import listens
from tests.support import REPO
from tests.support.browser import (
    DATASTAR_CDN_URL,
    Server,
    ServerError,
    alive,
    port_answers,
    wait_for_datastar,
)

# A throwaway app. Datastar 1.0 syntax: data-init runs on load (data-on-load is the
# pre-1.0 name), data-on:click (colon, not dash), actions are @get/@post.
APP = r'''
import asyncio, os
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from datastar_py.fastapi import DatastarResponse, ServerSentEventGenerator as SSE

app = FastAPI()
released = asyncio.Event()
clicks = 0
BOOT = os.environ.get("BOOT", "?")

def shell(body_attrs: str, body: str) -> str:
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>harness</title>
<script type="module" src="{os.environ["DATASTAR_URL"]}"></script></head>
<body {body_attrs}>{body}</body></html>"""

@app.get("/", response_class=HTMLResponse)
def index():
    return shell("data-init=\"@get('/stream')\"", '<div id="out">waiting</div>')

@app.get("/stream")
async def stream():
    async def events():
        yield SSE.patch_elements('<div id="out">hello 1</div>')
        await released.wait()
        yield SSE.patch_elements('<div id="out">hello 2</div>')
    return DatastarResponse(events())

@app.post("/release", status_code=204)
def release():
    released.set()

@app.get("/button", response_class=HTMLResponse)
def button():
    return shell("", """<button id="inc" data-on:click="@post('/inc')">inc</button>
<div id="result">none</div>""")

@app.post("/inc")
async def inc(request: Request):
    global clicks
    clicks += 1
    header = request.headers.get("datastar-request", "missing")
    body = (await request.body()).decode()
    return DatastarResponse(SSE.patch_elements(
        f'<div id="result">clicks={clicks} datastar-request={header} body={body}</div>'))

@app.get("/boot", response_class=HTMLResponse)
def boot_page():
    return shell("data-init=\"@get('/boot-stream', {retry: 'always'})\"", '<div id="boot">none</div>')

@app.get("/boot-stream")
def boot_stream():
    # ends at once: with retry 'always' Datastar opens it again after retryInterval
    return DatastarResponse(SSE.patch_elements(f'<div id="boot">boot {BOOT}</div>'))
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "harness_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


@pytest.fixture
def server(server_factory, app_dir: Path) -> Server:
    return server_factory("harness_app:app", cwd=app_dir, env={"DATASTAR_URL": DATASTAR_CDN_URL})


def post(url: str) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5) as r:
        return r.status


def test_datastar_js_is_cached_v1_0_1(datastar_js: Path) -> None:
    assert datastar_js.is_relative_to(REPO / ".cache" / "datastar")
    text = datastar_js.read_text(encoding="utf-8")
    assert text.startswith("// Datastar v1.0.1")
    assert 'name:"init"' in text and 'name:"on"' in text  # data-init, data-on:*


@pytest.mark.browser
def test_stream_patches_arrive_live(page, server: Server, artifacts_dir: Path) -> None:
    page.goto(server.url + "/")
    out = page.locator("#out")
    expect(out).to_have_text("hello 1")
    assert post(server.url + "/release") == 204  # only now does the stream send more
    expect(out).to_have_text("hello 2")
    page.screenshot(path=str(artifacts_dir / "harness-stream.png"))
    assert (artifacts_dir / "harness-stream.png").stat().st_size > 1000
    assert not [m for m in page.console_log if m.startswith(("error", "pageerror"))], page.console_log


@pytest.mark.browser
def test_cdn_routed_and_network_blocked(page, server: Server) -> None:
    page.goto(server.url + "/button")
    # both spellings of the 1.0.1 tag (and any datastar*.js on the CDN) are local
    for url in (DATASTAR_CDN_URL, DATASTAR_CDN_URL.replace("@1.0.1", "@v1.0.1")):
        head = page.evaluate("u => fetch(u).then(r => r.text()).then(t => t.slice(0, 18))", url)
        assert head == "// Datastar v1.0.1"
    # any other non-loopback request fails at once instead of waiting on the network
    outcome = page.evaluate("fetch('https://example.com/').then(() => 'fetched', () => 'blocked')")
    assert outcome == "blocked"


@pytest.mark.browser
def test_click_posts_with_datastar_request_header(page, server: Server) -> None:
    page.goto(server.url + "/button")
    wait_for_datastar(page)  # a click before Datastar binds data-on:click does nothing
    result = page.locator("#result")
    page.locator("#inc").click()
    expect(result).to_have_text("clicks=1 datastar-request=true body={}")
    page.locator("#inc").click()
    expect(result).to_contain_text("clicks=2 datastar-request=true")
    assert "POST /inc HTTP/1.1\" 200" in server.output


@pytest.mark.browser
def test_server_restart_same_port_page_reconnects(page, server_factory, app_dir: Path) -> None:
    server = server_factory(
        "harness_app:app", cwd=app_dir, env={"DATASTAR_URL": DATASTAR_CDN_URL, "BOOT": "1"}
    )
    page.goto(server.url + "/boot")
    expect(page.locator("#boot")).to_have_text("boot 1")
    port, pid = server.port, server.pid
    server.restart(env={"BOOT": "2"})
    assert (server.port, server.starts) == (port, 2) and server.pid != pid
    assert not server.killed, "the server ignored SIGTERM"
    # While the server was down Datastar's retries backed off (doubling from 1 s, at most 30 s
    # apart): the next one may come that long after the server is back.
    expect(page.locator("#boot")).to_have_text("boot 2", timeout=40_000)
    assert server.output.count("=== start #") == 2


def test_server_stop_leaves_nothing_behind(app_dir: Path) -> None:
    """No browser needed: start, stop, and the port and the process are gone."""
    log = app_dir / "server.log"
    with Server("harness_app:app", cwd=app_dir, env={"DATASTAR_URL": DATASTAR_CDN_URL}, log_path=log) as server:
        pid, port = server.pid, server.port
        assert port_answers("127.0.0.1", port)
        with urllib.request.urlopen(server.url + "/button", timeout=5) as r:
            assert DATASTAR_CDN_URL in r.read().decode()
    assert not port_answers("127.0.0.1", port)
    assert not Path(f"/proc/{pid}").exists()
    assert server.stopped_cleanly, (server.returncode, server.killed)
    assert "Finished server process" in server.output


def test_server_that_dies_reports_its_output(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise SystemExit('boom: broken app')\n")
    server = Server("broken:app", cwd=tmp_path)
    with pytest.raises(RuntimeError, match="boom: broken app"):
        server.start()
    server.close()


def test_a_port_another_process_listens_on_is_not_taken_for_the_server(app_dir: Path) -> None:
    """The port answers, but not from the server started: a chosen port is given up for
    another, a fixed one fails with the bind's error, never a test against the wrong server."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        assert listens(os.getpid(), taken) is True
        env = {"DATASTAR_URL": DATASTAR_CDN_URL}
        fixed = Server("harness_app:app", cwd=app_dir, env=env, port=taken, log_path=app_dir / "fixed.log")
        with pytest.raises(ServerError, match="address already in use"):
            fixed.start()
        fixed.close()
        chosen = Server("harness_app:app", cwd=app_dir, env=env, log_path=app_dir / "chosen.log")
        chosen.port = taken  # as if another test's server had taken it since it was chosen
        with chosen:
            assert chosen.port != taken and listens(chosen.pid or 0, chosen.port) is True
        assert "address already in use" in chosen.output


def test_a_server_imports_the_package_of_this_checkout_from_any_folder(tmp_path: Path) -> None:
    """Served from a folder outside the checkout, the app imports this checkout's package (in
    mutmut's copy, the mutated one), not the one the virtualenv's editable install names."""
    (tmp_path / "which.py").write_text(
        "import fastapi_lith\nfrom fastapi import FastAPI\n"
        "print('package at', fastapi_lith.__file__, flush=True)\napp = FastAPI()\n"
    )  # fmt: skip
    with Server("which:app", cwd=tmp_path, log_path=tmp_path / "server.log") as server:
        pass
    assert f"package at {REPO / 'fastapi_lith' / '__init__.py'}\n" in server.output


def test_alive_is_false_for_a_process_reaped_while_it_looks() -> None:
    """A child is reaped by another thread while `alive` polls it: the answer is False, never
    an error, wherever in its reading of `/proc` the reaping lands."""
    for _ in range(300):
        child = subprocess.Popen(["true"])
        reaper = threading.Thread(target=child.wait)
        reaper.start()
        while alive(child.pid):
            pass
        reaper.join()
        assert child.returncode == 0


def test_alive_is_false_for_a_zombie() -> None:
    """A child that exited but is not yet reaped has no process left to wait for."""
    child = subprocess.Popen(["true"])
    try:
        while alive(child.pid):
            pass
        assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z"
    finally:
        child.wait()
