"""Streams end the moment the server is told to stop, instead of at sse-starlette's next look.

uvicorn's SIGTERM handler only sets `server.should_exit`; sse-starlette notices it in a loop
that sleeps 0.5 s between looks, and uvicorn waits for every open response before the app's
lifespan ends. So each process held its streams for up to half a second of every restart
(bench/restart.py). A started hub puts a relay in front of the server's handler: it ends the
hubs' streams on the event loop, then calls that handler as before. It is a stream's only end
at a stop: the responses keep no exit listener of their own (web/sse.py).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

_ends: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}

def end_on_exit_signal(owner: object, end: Callable[[], None]) -> None:
    """Call `end()` on this loop when SIGTERM or SIGINT arrives, until `forget(owner)`. Only in
    front of a server's own handler, a bound method like uvicorn's `Server.handle_exit`: with
    no server (tests, scripts) signals are left alone."""
    _ends[id(owner)] = (asyncio.get_running_loop(), end)
    if threading.current_thread() is not threading.main_thread():
        return  # signals go to the main thread's handlers only
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not isinstance(previous, types.MethodType) or getattr(previous.__func__, "lith_relay", False):
            continue
        server = previous.__self__
        # Bound to the same server, so a library that finds the server through the handler
        # (sse-starlette does) still finds it.
        signal.signal(sig, types.MethodType(_relay(previous), server))


def forget(owner: object) -> None:
    _ends.pop(id(owner), None)


def end_all(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Call every registered `end()` (those of `loop` only, when given) on its own loop, from any
    thread: what an exit signal does. A server run off the main thread (a test's, on a thread)
    gets no signal, so whoever stops it calls this first."""
    for owner_loop, end in list(_ends.values()):
        if not owner_loop.is_closed() and loop in (None, owner_loop):
            owner_loop.call_soon_threadsafe(end)  # the handler may run between any two bytecodes


def _relay(previous: Callable[[int, Any], None]) -> Callable[..., None]:
    def relay(_server: object, sig: int, frame: Any) -> None:
        end_all()
        previous(sig, frame)

    relay.lith_relay = True  # type: ignore[attr-defined]
    return relay
