"""The in-process server harness: a real uvicorn on a thread, an app loaded afresh with its
environment, its log kept, and a stop that ends the app's lifespan."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.support.browser import port_answers
from tests.support.inprocess import InProcessServer

APP = '''
import contextlib, logging, os
from fastapi import FastAPI

SETTING = os.environ["HARNESS_SETTING"]
calls = 0
ended = False

@contextlib.asynccontextmanager
async def lifespan(app):
    global ended
    yield
    ended = True

app = FastAPI(lifespan=lifespan)

@app.get("/")
def index():
    global calls
    calls += 1
    return {"setting": SETTING, "calls": calls}

@app.get("/fail")
def fail():
    raise ValueError("broken on purpose")
'''


@pytest.fixture
def harness_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "harness_app.py").write_text(textwrap.dedent(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("HARNESS_SETTING", raising=False)
    return "harness_app:app"


def test_each_server_is_its_own_app_with_its_own_environment(harness_app: str) -> None:
    with InProcessServer(harness_app, env={"HARNESS_SETTING": "one"}) as one, \
            InProcessServer(harness_app, env={"HARNESS_SETTING": "two"}) as two:  # fmt: skip
        assert "HARNESS_SETTING" not in os.environ  # set only while each loads and starts
        assert httpx.get(one.url).json() == {"setting": "one", "calls": 1}
        assert httpx.get(one.url).json() == {"setting": "one", "calls": 2}
        assert httpx.get(two.url).json() == {"setting": "two", "calls": 1}


def test_what_the_app_logs_is_its_output_and_a_stop_ends_its_lifespan(harness_app: str) -> None:
    server = InProcessServer(harness_app, env={"HARNESS_SETTING": "x"}).start()
    assert httpx.get(f"{server.url}/fail").status_code == 500
    deadline = time.monotonic() + 30  # uvicorn logs the error after the 500 has gone out
    while "ValueError: broken on purpose" not in server.output:
        assert time.monotonic() < deadline, "the error was never logged"
        time.sleep(0.01)
    assert "Traceback (most recent call last)" in server.output
    server.close()
    assert server.module is not None and server.module.ended
    assert not port_answers(server.host, server.port)
    assert not server.running


def test_an_app_that_fails_to_load_fails_the_start_with_its_error(harness_app: str) -> None:
    with pytest.raises(KeyError, match="HARNESS_SETTING"):
        InProcessServer(harness_app).start()
