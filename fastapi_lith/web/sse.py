"""A tab's stream over HTTP: the query and its access checked, then the body as an SSE response."""

from __future__ import annotations

import asyncio
import contextvars
import random
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from ..engine.commands import TAB_ID
from ..engine.encoders import Encoder
from ..engine.streams import Principal, Stream, Subscription, WriteAtOnce
from ..exceptions import AccessDenied, ViewError
from .access import StreamTokens, refusal, stream_path
from .server_send import server_send

_HEADERS: dict[tuple[tuple[bytes, bytes], ...], tuple[tuple[bytes, bytes], ...]] = {}

# What asyncio's own eager tasks (3.12) use to run a step of a task's code from outside it; a
# Python without them writes every frame from the response's task, as before.
_enter_task = getattr(asyncio.tasks, "_enter_task", None)
_leave_task = getattr(asyncio.tasks, "_leave_task", None)


class StreamResponse(EventSourceResponse):
    """sse-starlette's response (its headers, its HEAD), streamed in the request's own task.

    sse-starlette runs every response in an AnyIO task group: the body, a listener for the
    server's exit and one for the client's disconnect, each a task with its event, under a
    cancel scope, about 18 KiB a tab (bench/memory.py). A tab's stream needs only the last: the
    hub ends every stream at the server's stop signal (engine/shutdown.py), and uvicorn's `send`
    returns quietly once the client is gone, so a waiter on `receive()` is the one way to learn
    of a disconnect; it ends `stream`, the tab's stream the body writes, and the body finishes.
    A send that takes `send_timeout` (a client that stops reading, its socket's buffer full) is
    ended, and its stream counts it (the metrics' `lith_stream_send_timeouts_total`). One timer
    per response watches the sends, armed again only when it fires: nearly every send returns
    at once, and a timer armed and cancelled around each would cost the loop more than the send.
    """

    def __init__(
        self, content: AsyncIterator[bytes], *, stream: Stream | None, send_timeout: float, headers: dict[str, str],
        on_close: Callable[[], object] | None = None,
    ) -> None:
        # sse-starlette's own ping is off: a raw ping would corrupt a compressed body, so
        # keep-alives go through the encoder.
        super().__init__(content, headers=headers, ping=0, send_timeout=send_timeout)
        del self._send_lock  # it keeps sse-starlette's ping apart from the body: no ping here
        # Every stream of an encoding sends the same headers: one copy of them for all.
        raw = tuple(self.raw_headers)
        self.raw_headers = list(_HEADERS.setdefault(raw, raw))
        self.stream = stream
        self.on_close = on_close  # once the response is done, however it ended (a subscription's close)
        self._sending_since: float | None = None  # loop time the send in progress began
        self._watchdog: asyncio.TimerHandle | None = None
        self._timed_out = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] != "http" or scope["method"] == "HEAD":
                await super().__call__(scope, receive, send)  # headers only: no body starts
            else:
                await self._stream(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnect = asyncio.ensure_future(self._until_disconnect(receive))
        body = self.body_iterator
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            # Every layer saw the headers; the body skips those that would only hand it on.
            send = server_send(scope, receive) or send
            if self.stream is not None and task is not None:
                self.stream.write_at_once = self._write_at_once(send, loop, task)
            async for chunk in body:
                self._sending(loop, task)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self._sending_since = None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except BaseException as exc:
            # Counted before the body closes: its stream's counts then go to the hub's totals.
            timed_out = self._timed_out and isinstance(exc, asyncio.CancelledError)
            timed_out = timed_out and task is not None and task.uncancel() == 0  # the watchdog's cancel alone
            if timed_out and self.stream is not None:
                self.stream.send_timeouts += 1
            # The body waits at a `yield`: closing it runs its cleanup (the subscription closes)
            # before the error goes on.
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
            if timed_out:
                raise SendTimeoutError() from None
            raise
        finally:
            if self.stream is not None:
                self.stream.write_at_once = None
            disconnect.cancel()
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _write_at_once(self, send: Send, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> WriteAtOnce:
        """The stream's way to write a chunk from the fan-out's callback while the body waits.

        The send runs as the response's task would run it (that task current, its context), up
        to where it would wait: nearly always the end, the bytes handed to the socket. When it
        must wait (a client slow to read, a middleware that passes the message on to a task),
        the rest goes to the body, which awaits it in the task, watched for `send_timeout`.
        """
        context = contextvars.copy_context()

        def write(chunk: bytes) -> Awaitable[None] | None:
            sending = send({"type": "http.response.body", "body": chunk, "more_body": True})
            rest: Awaitable[None] = sending
            step = getattr(sending, "send", None)  # a server's own awaitable may be no coroutine
            if step is not None and _enter_task is not None and _leave_task is not None:
                try:
                    _enter_task(loop, task)
                except RuntimeError:  # called from a task, not a callback: the body sends it
                    pass
                else:
                    try:
                        waits_on = context.run(step, None)
                    except StopIteration:
                        return None
                    finally:
                        _leave_task(loop, task)
                    rest = _rest_of(sending, waits_on)  # type: ignore[arg-type]
            self._sending(loop, task)
            return self._finish(rest)

        return write

    async def _finish(self, rest: Awaitable[None]) -> None:
        try:
            await rest
        finally:
            self._sending_since = None

    def _sending(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None) -> None:
        """A send begins: the watchdog ends it if it takes `send_timeout`."""
        timeout = self.send_timeout
        if timeout is None:
            return
        self._sending_since = now = loop.time()
        if self._watchdog is None:
            self._watchdog = loop.call_at(now + timeout, self._watch, loop, task, timeout)

    async def _until_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.end()

    def end(self) -> None:
        if self.stream is not None:
            self.stream.end()

    def _watch(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object] | None, timeout: float) -> None:
        """The watchdog's turn: end a send begun `timeout` ago; else look again when the one in
        progress would be late, or at the next send if none is."""
        self._watchdog = None
        since = self._sending_since
        if since is None:
            return
        if loop.time() >= since + timeout:
            if task is not None and not self._timed_out:
                self._timed_out = True
                task.cancel()
            return
        self._watchdog = loop.call_at(since + timeout, self._watch, loop, task, timeout)


@types.coroutine
def _rest_of(coroutine: Coroutine[Any, Any, None], waits_on: Any) -> Generator[Any, Any, None]:
    """Await the rest of `coroutine`, whose first step ran elsewhere and yielded `waits_on`:
    the task awaiting this waits on that, and each later step runs in the task, as `await`
    would have run it from the start."""
    while True:
        try:
            value = yield waits_on
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as exc:  # a cancel, or the future's error: the coroutine's to handle
            try:
                waits_on = coroutine.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waits_on = coroutine.send(value)
            except StopIteration:
                return


async def stream_response(
    open_views: Callable[[Stream, list[str]], Awaitable[Subscription]],
    request: Request,
    encoder: Encoder,
    *,
    principal: Principal = None,
    tokens: StreamTokens | None = None,
    keepalive: float,
    hibernate_after: float,
    send_timeout: float,
    reconnect_within: float,
) -> Response:
    """`GET {prefix}/stream?views=key1,key2&tab=…&token=…`: one tab's SSE response, a 400
    saying what is malformed, or a refusal (web/access.py).

    `open_views` is the hub's `open`: it checks what `principal` may watch, subscribes a new
    stream and gives its first frames. With `tokens` (a secret is set) the URL must carry the
    token its page signed for this tab, these keys and this principal.

    The first event carries SSE's `retry:` field, drawn uniformly from 1 s to
    `reconnect_within` s for each stream: when a deploy ends every stream at once, the pages
    come back spread over that window instead of all together a second later.
    """
    tab = request.query_params.get("tab", "")
    if not TAB_ID.fullmatch(tab):
        return PlainTextResponse("tab must be 1 to 64 letters, digits, '-' or '_'", 400)
    keys = [k for v in request.query_params.getlist("views") for k in v.split(",") if k]
    if not keys:
        return PlainTextResponse("views is required: ?views=key1,key2&tab=…", 400)
    try:
        if tokens is not None:
            tokens.check(request.query_params.get("token"), stream_path(request), tab, keys, principal)
        subscription = await open_views(Stream(tab, principal), keys)
    except AccessDenied as exc:
        return refusal(request, exc)
    except ViewError as exc:
        return PlainTextResponse(str(exc), 400)
    headers = {"Vary": "Accept-Encoding"}
    if encoder.name:
        headers["Content-Encoding"] = encoder.name
    stream = subscription.stream
    # The stream ends cleanly at server shutdown (the hub ends it), so the page's
    # `retry: 'always'` reconnects to the next process; then its subscription closes.
    body = stream.body(
        encoder, keepalive=keepalive, hibernate_after=hibernate_after,
        retry=round(1000 * random.uniform(1.0, reconnect_within)),
    )
    return StreamResponse(body, stream=stream, send_timeout=send_timeout, headers=headers, on_close=subscription.close)
