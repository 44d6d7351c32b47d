"""The exit-signal relay in front of a real uvicorn `Server`'s handler, in this process.

A real signal goes to this process; uvicorn's `handle_exit` is installed as a server installs it,
but the server is never run, so the signal only sets its flags.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import types
from collections.abc import Iterator

import pytest
import uvicorn

from fastapi_lith.engine import shutdown
from tests.support import holds, until


@pytest.fixture
def handlers() -> Iterator[None]:
    """Put back this process's own SIGTERM and SIGINT handlers, and the owners it had."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    owners = dict(shutdown._ends)
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)
    shutdown._ends.clear()
    shutdown._ends.update(owners)


async def test_every_owner_ends_at_a_signal_and_the_server_hears_which_one(handlers: None) -> None:
    server = uvicorn.Server(uvicorn.Config("unused:app"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    ended: list[str] = []
    first, second = object(), object()
    shutdown.end_on_exit_signal(first, lambda: ended.append("first"))
    shutdown.end_on_exit_signal(second, lambda: ended.append("second"))

    signal.raise_signal(signal.SIGTERM)
    await until(holds(lambda: len(ended) == 2))
    assert sorted(ended) == ["first", "second"]  # two owners in one process: both end
    assert server._captured_signals == [signal.SIGTERM] and server.should_exit

    shutdown.forget(first)
    ended.clear()
    signal.raise_signal(signal.SIGINT)
    await until(holds(lambda: ended == ["second"]))
    assert server._captured_signals == [signal.SIGTERM, signal.SIGINT]  # the server's own handler, with its signal
    assert server.force_exit  # uvicorn's second signal: a SIGINT after a SIGTERM


async def test_each_signal_with_a_servers_handler_is_relayed_whatever_the_other_has(handlers: None) -> None:
    server = uvicorn.Server(uvicorn.Config("unused:app"))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # no server's handler: left alone
    signal.signal(signal.SIGINT, server.handle_exit)
    ended: list[str] = []
    shutdown.end_on_exit_signal(object(), lambda: ended.append("ended"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    signal.raise_signal(signal.SIGINT)
    await until(holds(lambda: ended == ["ended"]))
    assert server._captured_signals == [signal.SIGINT]


async def test_the_servers_handler_is_called_as_the_signal_called_the_relay(handlers: None) -> None:
    class Recording(uvicorn.Server):
        """A server whose handler reads the frame too, as Python hands every handler."""

        def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
            heard.append((sig, frame))
            super().handle_exit(sig, frame)

    heard: list[tuple[int, types.FrameType | None]] = []
    server = Recording(uvicorn.Config("unused:app"))
    signal.signal(signal.SIGTERM, server.handle_exit)
    shutdown.end_on_exit_signal(object(), lambda: None)
    signal.raise_signal(signal.SIGTERM)
    [(sig, frame)] = heard
    assert sig == signal.SIGTERM and isinstance(frame, types.FrameType)


async def test_end_all_of_one_loop_ends_that_loops_owners_only(handlers: None) -> None:
    """A server run off the main thread hears no signal: whoever stops it ends its loop's
    streams (tests/support/inprocess.py), and another loop's go on."""
    ended: list[str] = []
    shutdown.end_on_exit_signal(object(), lambda: ended.append("here"))
    elsewhere = asyncio.new_event_loop()
    thread = threading.Thread(target=elsewhere.run_forever, daemon=True)
    thread.start()
    try:
        shutdown._ends[id(elsewhere)] = (elsewhere, lambda: ended.append("elsewhere"))
        shutdown.end_all(asyncio.get_running_loop())
        await until(holds(lambda: ended == ["here"]))
        flushed = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), elsewhere)
        await asyncio.wrap_future(flushed)  # what was queued on the other loop has run by now
        assert ended == ["here"]
        shutdown.end_all()
        await until(holds(lambda: sorted(ended) == ["elsewhere", "here", "here"]))
    finally:
        elsewhere.call_soon_threadsafe(elsewhere.stop)
        thread.join()
        elsewhere.close()
