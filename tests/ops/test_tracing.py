"""OpenTelemetry spans of a command's path, from a real uvicorn with a real SDK provider.

The served app is the docs' traced counter (docs/src/tracing/app.py, instrumented by
opentelemetry-instrumentation-fastapi) with an in-memory exporter (tests/support/tracingapp.py):
a POST with the tab's stream open, then the spans read back over HTTP. Without a provider, a
subprocess shows the library imports nothing for tracing and the command still lands. Which
frame ends a `lith.frame` is tested in process, over virtual tabs, with the SDK's provider
handed to the tracer (never set for the whole test process, where it would trace every app).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fastapi_lith import Command, Rejected, Tx
from fastapi_lith.ops import tracing
from fastapi_lith.ops.tracing import traced
from fastapi_lith.testing import Tabs
from tests.support import CHILD_HANG_LIMIT, REPO, SUPPORT, child_env
from tests.support.browser import Server
from tests.support.orphan import Orphan, add_orphan_tables
from tests.web.test_input import JSON, TabStream

Span = dict[str, Any]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("tracing")  # counter.db goes here, as the docs' app opens it
    server = Server("tracingapp:app", cwd=folder, env={"PYTHONPATH": f"{REPO}{os.pathsep}{SUPPORT}"})
    server.start()
    yield server
    server.close()


def spans_when(server: Server, ready: Callable[[list[Span]], bool]) -> list[Span]:
    """The server's ended spans, once `ready` holds for them (a server span ends after its
    response went out, so it may still be open when the client has the answer)."""
    deadline = time.monotonic() + 10
    while True:
        spans: list[Span] = httpx.get(f"{server.url}/spans").json()
        if ready(spans):
            return spans
        names = [span["name"] for span in spans if span["name"].startswith(("lith.", "POST"))]
        assert time.monotonic() < deadline, f"the spans never got there: {names}"
        time.sleep(0.01)


def path_of(spans: list[Span], command: Span) -> dict[str, Span]:
    """`command`'s children by name, and the server span it is a child of once that ended."""
    family = {span["name"]: span for span in spans if span["parent"] == command["id"]}
    family.update(("server", span) for span in spans if span["id"] == command["parent"])
    return family


def command_span(spans: list[Span], name: str, key: str | None = None) -> Span | None:
    """The `lith.command NAME` span whose commit carries idempotency key `key` (if given)."""
    for span in spans:
        if span["name"] != f"lith.command {name}":
            continue
        commits = [s for s in spans if s["parent"] == span["id"] and s["name"] == "lith.commit"]
        if key is None or any(c["attributes"].get("lith.idempotency_key") == key for c in commits):
            return span
    return None


def test_a_command_is_one_trace_from_its_request_to_its_first_frame(served: Server) -> None:
    stream = TabStream(served, "traced", views="counter,outcome/{tab}")
    try:
        stream.wait_for('<p id="counter">')
        before = int(stream.data.decode().rsplit('<p id="counter">', 1)[1].split("<", 1)[0])
        response = httpx.post(f"{served.url}/add", json={"tab": "traced", "op": 1, "n": 1}, headers=JSON)
        assert response.status_code == 204, response.text
        stream.wait_for(f'<p id="counter">{before + 1}</p>')
    finally:
        stream.close()

    def complete(spans: list[Span]) -> bool:
        command = command_span(spans, "Add", "Add:traced:1")
        return command is not None and {"server", "lith.frame"} <= set(path_of(spans, command))

    spans = spans_when(served, complete)
    command = command_span(spans, "Add", "Add:traced:1")
    assert command is not None
    family = path_of(spans, command)
    server, queued, commit, frame = (family[k] for k in ("server", "lith.queued", "lith.commit", "lith.frame"))
    assert server["kind"] == "SERVER" and "/add" in server["name"]
    assert {span["trace"] for span in (server, command, queued, commit, frame)} == {server["trace"]}
    # Nested in time as in the tree: the request holds the command, whose path runs in order.
    assert server["start"] <= command["start"] == queued["start"] <= queued["end"] == commit["start"]
    assert commit["start"] <= commit["end"] == command["end"] <= server["end"]
    assert commit["end"] == frame["start"] <= frame["end"]
    assert commit["attributes"] == {
        "lith.batch.size": commit["attributes"]["lith.batch.size"],
        "lith.idempotency_key": "Add:traced:1",
        "lith.outcome": "applied",
    }
    assert commit["attributes"]["lith.batch.size"] >= 1
    assert set(frame["attributes"]["lith.views"]) <= {"counter", "outcome/traced"}
    assert frame["attributes"]["lith.views"]
    assert all(span["status"] == "UNSET" for span in (command, queued, commit, frame))


def test_a_rejected_command_and_its_commit_have_an_error_status(served: Server) -> None:
    response = httpx.post(f"{served.url}/add", json={"tab": "refused", "op": 1, "n": 11}, headers=JSON)
    assert response.status_code == 204, response.text  # the tab is told, on its stream

    def rejected(spans: list[Span]) -> bool:
        command = command_span(spans, "Add", "Add:refused:1")
        return command is not None and "server" in path_of(spans, command)

    spans = spans_when(served, rejected)
    command = command_span(spans, "Add", "Add:refused:1")
    assert command is not None
    commit = path_of(spans, command)["lith.commit"]
    assert command["status"] == commit["status"] == "ERROR"
    assert command["description"] == commit["description"] == "The counter stops at 10."
    assert commit["attributes"]["lith.outcome"] == "rejected"
    assert commit["events"] == []  # a refusal is an answer, not an exception


def test_a_batch_that_fails_to_commit_marks_its_commands_failed(served: Server) -> None:
    response = httpx.post(f"{served.url}/orphan", json={}, headers=JSON)
    assert response.status_code == 500, response.text

    def failed(spans: list[Span]) -> bool:
        command = command_span(spans, "Orphan")
        return command is not None and "server" in path_of(spans, command)

    spans = spans_when(served, failed)
    command = command_span(spans, "Orphan")
    assert command is not None
    family = path_of(spans, command)
    commit = family["lith.commit"]
    assert command["status"] == commit["status"] == "ERROR"
    assert commit["attributes"]["lith.outcome"] == "not committed"
    assert commit["events"] == ["exception"]
    assert "FOREIGN KEY" in commit["description"]
    assert "lith.frame" not in family  # nothing landed, so no frame shows it


NO_PROVIDER = """
import asyncio, importlib.util, json, sys
import fastapi  # FastAPI may import OpenTelemetry's API itself: that much is not the library's

before = {name for name in sys.modules if name.startswith("opentelemetry")}
from fastapi_lith.testing import Tabs

spec = importlib.util.spec_from_file_location("counter_app", sys.argv[1])
app = importlib.util.module_from_spec(spec)
spec.loader.exec_module(app)


async def main():
    async with Tabs(app.lith) as tabs:
        tab = await tabs.open("counter")
        count = await tab.do(app.Add(n=2))
        await tabs.tick()
        return count, tab.html("counter"), app.lith.writer.trace, app.lith.hub.trace


count, html, writer_trace, hub_trace = asyncio.run(main())
print(json.dumps({
    "count": count, "html": html, "traced": [writer_trace is not None, hub_trace is not None],
    "imported": sorted({name for name in sys.modules if name.startswith("opentelemetry")} - before),
    "tracing": "fastapi_lith.ops.tracing" in sys.modules,
}))
"""


def test_without_a_provider_nothing_is_imported_and_the_command_lands(tmp_path: Path) -> None:
    counter = REPO / "docs" / "src" / "counter" / "app.py"
    env = child_env({**os.environ, "PYTHONPATH": str(REPO)})
    for name in [n for n in env if n.startswith("OTEL_")]:
        del env[name]  # no provider set from the environment either
    run = subprocess.run(
        [sys.executable, "-c", NO_PROVIDER, str(counter)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=CHILD_HANG_LIMIT,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen == {
        "count": 2, "html": '<p id="counter">2</p>', "traced": [False, False], "imported": [], "tracing": False,
    }


# -- which frame ends a lith.frame, in process -------------------------------------------------


class Nudge(Command):
    """Touches the counter's topic and changes nothing: its view renders the same HTML."""

    def apply(self, tx: Tx) -> None:
        tx.touch("counter")


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)  # the docs' counter opens counter.db here
    spec = importlib.util.spec_from_file_location("tracing_counter", REPO / "docs" / "src" / "counter" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sdk() -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def frames_of(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    """The `lith.frame` spans of every `lith.command NAME`."""
    ids = {s.context.span_id for s in spans if s.name == f"lith.command {name}" and s.context}
    return [s for s in spans if s.name == "lith.frame" and s.parent is not None and s.parent.span_id in ids]


async def test_only_a_commit_that_changes_a_watched_view_gets_a_frame(counter: Any) -> None:
    provider, memory = sdk()
    async with Tabs(counter.lith) as tabs:
        with traced(counter.lith.engine, provider):
            await counter.lith.writer.do(counter.Add(n=1))  # no tab watches the counter yet
            tab = await tabs.open("counter")
            await tab.do(Nudge())  # the view renders the same HTML: nothing shows it
            await tabs.tick()
            assert tab.read() == []
            await tab.do(counter.Add(n=1))
            await tabs.tick()
            assert tab.html("counter") == '<p id="counter">2</p>'
    spans = memory.get_finished_spans()
    assert [s.name for s in spans].count("lith.command Add") == 2
    assert frames_of(spans, "Nudge") == []
    (frame,) = [s for s in spans if s.name == "lith.frame"]  # the second Add's, not the first's
    assert frame in frames_of(spans, "Add")
    assert frame.attributes is not None and frame.attributes["lith.views"] == ("counter",)


async def test_the_commands_of_one_batch_share_its_first_frame(counter: Any) -> None:
    provider, memory = sdk()
    async with Tabs(counter.lith) as tabs:
        with traced(counter.lith.engine, provider):
            tab = await tabs.open("counter")
            # Queued before the writer task runs again: one batch.
            await asyncio.gather(*(tab.do(counter.Add(n=1)) for _ in range(3)))
            await tabs.tick()
            assert tab.html("counter") == '<p id="counter">3</p>'
    spans = memory.get_finished_spans()
    commits = [s for s in spans if s.name == "lith.commit"]
    assert [c.attributes["lith.batch.size"] for c in commits if c.attributes] == [3, 3, 3]
    frames = frames_of(spans, "Add")
    assert len(frames) == 3 and len({(f.start_time, f.end_time) for f in frames}) == 1


class Refused(Command):
    def apply(self, tx: Tx) -> None:
        raise Rejected("Not today.")


class Broken(Command):
    def apply(self, tx: Tx) -> None:
        raise RuntimeError("a bug in the command")


def commit_outcomes(spans: tuple[ReadableSpan, ...]) -> dict[str, tuple[str, str]]:
    """Each command's name: its commit's `lith.outcome` and status."""
    names = {s.context.span_id: s.name.removeprefix("lith.command ") for s in spans if s.name.startswith("lith.command")}
    return {
        names[s.parent.span_id]: (s.attributes["lith.outcome"], s.status.status_code.name)  # type: ignore[index]
        for s in spans if s.name == "lith.commit" and s.parent is not None
    }


async def test_each_commands_outcome_is_on_its_commit(counter: Any) -> None:
    add_orphan_tables("counter.db")  # where the docs' counter opens it
    provider, memory = sdk()
    writer = counter.lith.writer
    async with Tabs(counter.lith):
        with traced(counter.lith.engine, provider):
            await writer.do(counter.Add(n=1))
            with pytest.raises(Rejected, match="Not today"):
                await writer.do(Refused())
            with pytest.raises(RuntimeError, match="a bug in the command"):
                await writer.do(Broken())
            with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
                await writer.do(Orphan())
    assert commit_outcomes(memory.get_finished_spans()) == {
        "Add": ("applied", "UNSET"),
        "Refused": ("rejected", "ERROR"),
        "Broken": ("failed", "ERROR"),
        "Orphan": ("not committed", "ERROR"),
    }


async def test_past_the_waiting_bound_the_oldest_commits_get_no_frame(counter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits wait in memory for the frame that shows them; a view that never renders must not
    hold them all: past `WAITING` commands the oldest are forgotten, the newer still traced."""
    monkeypatch.setattr(tracing, "WAITING", 2)
    provider, memory = sdk()
    async with Tabs(counter.lith) as tabs:
        with traced(counter.lith.engine, provider):
            tab = await tabs.open("counter")
            for _ in range(3):  # three batches, no tick between: all three wait
                await tab.do(counter.Add(n=1))
            await tabs.tick()
            assert tab.html("counter") == '<p id="counter">3</p>'
            await tab.do(counter.Add(n=1))  # the queue emptied: a later commit waits afresh
            await tabs.tick()
            assert tab.html("counter") == '<p id="counter">4</p>'
    spans = memory.get_finished_spans()
    commands = sorted((s for s in spans if s.name == "lith.command Add"), key=lambda s: s.start_time or 0)
    framed = {f.parent.span_id for f in frames_of(spans, "Add") if f.parent is not None}
    assert [c.context.span_id in framed for c in commands if c.context] == [False, True, True, True]
