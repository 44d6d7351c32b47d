"""A tab's SSE response: frames written at once from the fan-out, as the response's task would
write them, and handed to that task when a send has to wait."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from pathlib import Path
from typing import Any

import pytest

from fastapi_lith.web import sse
from tests.engine.test_streams import TESTS, Exchange, open_stream, rename, stream_request

REQUEST = contextvars.ContextVar[str | None]("request", default=None)


def _from_the_fanout() -> bool:
    """Whether this call came from the fan-out's pass, not from the response's own loop."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "encoded" and frame.f_code.co_filename.endswith("streams.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Watching(Exchange):
    """An exchange whose `send` notes what an app's middleware would see: the current task, the
    request's context, and whether the fan-out called it; `checkpoint` makes it wait once
    midway, as a message passed on to another task does (`@app.middleware("http")`)."""

    def __init__(self, response: Any, encoding: str, checkpoint: bool = False) -> None:
        self.seen: list[tuple[asyncio.Task[Any] | None, str | None, bool]] = []
        self.checkpoint = checkpoint
        super().__init__(response, encoding)

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            self.seen.append((asyncio.current_task(), REQUEST.get(), _from_the_fanout()))
            if self.checkpoint:
                await asyncio.sleep(0)
        await super().send(message)


async def test_a_change_is_written_from_the_fanout_as_the_responses_task_in_its_context(tmp_path: Path) -> None:
    from fastapi_lith.engine.encoders import IdentityEncoder
    from tests.engine.test_hub import Add, make_lith

    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), IdentityEncoder())
        token = REQUEST.set("GET /stream by t1")  # the request's context, which its task copies
        exchange = Watching(response, "identity")
        REQUEST.reset(token)
        await exchange.until('<p id="board-1">0</p>')
        for n in range(1, 6):
            await lith.writer.do(Add())
            await exchange.until(f'<p id="board-1">{n}</p>')
        assert {(task, request) for task, request, _ in exchange.seen} == {(exchange.task, "GET /stream by t1")}
        assert sum(fanout for *_, fanout in exchange.seen) >= 5  # each change went out at once
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)
        assert not lith.hub.streams


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "python-without-enter-task"])
async def test_a_send_that_waits_midway_finishes_in_the_task_and_no_frame_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import Add, make_lith

    if not at_once:  # as on a Python whose asyncio lacks it: every write from the body's task
        monkeypatch.setattr(sse, "_enter_task", None)
    lith, _ = make_lith(tmp_path)
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), ZstdEncoder())
        exchange = Watching(response, "zstd", checkpoint=True)
        await exchange.until('<p id="board-1">0</p>')
        for n in range(1, 21):
            await lith.writer.do(Add())
            await exchange.until(f'<p id="board-1">{n}</p>')  # every change, decoded in order
        assert {task for task, *_ in exchange.seen} == {exchange.task}
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)
        assert exchange.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert exchange.decoder.frames_ended == 21  # every small write a whole zstd frame of its own
        assert not lith.hub.streams


def test_streams_behind_an_http_middleware_get_every_change(server_factory: Any, tmp_path: Path) -> None:
    """`@app.middleware("http")` passes each message on to another task through a memory stream:
    a write begun from the fan-out waits there, and the response's task finishes it."""
    server = server_factory(
        "streamapp:app", cwd=TESTS, env={"STREAM_DB": str(tmp_path / "b.db"), "STREAM_HTTP_MIDDLEWARE": "1"}
    )
    contexts = [open_stream(server, encoding, f"views=board&tab={encoding}") for encoding in ("identity", "zstd")]
    readers = [next(context) for context in contexts]
    assert all(r.response.headers["x-app-middleware"] == "seen" for r in readers)
    for reader in readers:
        reader.next_event()
    for i in range(10):
        rename(server, 7, f"round {i}")
        for reader in readers:
            assert f"round {i}" in reader.next_event()[0]
    for context in contexts:
        context.close()


async def test_a_hibernated_stream_woken_by_a_write_at_once_hibernates_again_on_time(tmp_path: Path) -> None:
    """A stream asleep waits for its next keep-alive; a change written at once wakes it, and it
    must hibernate again `hibernate_after` later, not at that keep-alive a minute on."""
    from fastapi_lith.engine.encoders import ZstdEncoder
    from tests.engine.test_hub import Add, make_lith
    from tests.support import until

    lith, _ = make_lith(tmp_path)
    lith.keepalive, lith.hibernate_after = 60, 0.2
    async with lith.lifespan():
        response = await lith.open_stream(stream_request("views=board/1&tab=t1"), ZstdEncoder())
        exchange = Watching(response, "zstd")
        await exchange.until('<p id="board-1">0</p>')
        stream = response.stream
        assert stream is not None

        async def asleep() -> bool:
            return stream.hibernated

        for n in range(1, 4):
            await until(asleep, timeout=10)
            await lith.writer.do(Add())
            await exchange.until(f'<p id="board-1">{n}</p>')
            assert exchange.seen[-1][2]  # written at once, from the fan-out
        await until(asleep, timeout=10)
        exchange.gone.set()
        await asyncio.wait_for(exchange.task, 10)
