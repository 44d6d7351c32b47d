"""A tab's stream over HTTP: the query and its access checked, then the body as an SSE response."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Message, Send

from ..engine.commands import TAB_ID
from ..engine.encoders import Encoder
from ..engine.streams import Principal, Stream, Subscription
from ..exceptions import AccessDenied, ViewError
from .access import StreamTokens, refusal, stream_path


class StreamResponse(EventSourceResponse):
    """sse-starlette's response, its send timeout kept on a cheaper clock.

    sse-starlette opens an AnyIO cancel scope around every chunk it sends, which costs about as
    much as the rest of its path per chunk; one asyncio timeout does the same job for a third
    of that (bench/send.py). A client that stops reading is still ended after `send_timeout`,
    and its stream counts it (the metrics' `lith_stream_send_timeouts_total`).
    """

    stream: Stream | None = None

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
            return
        try:
            async with asyncio.timeout(self.send_timeout):
                await send(message)
        except TimeoutError:
            if self.stream is not None:
                self.stream.send_timeouts += 1
            raise SendTimeoutError() from None


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
    shutdown = anyio.Event()
    headers = {"Vary": "Accept-Encoding"}
    if encoder.name:
        headers["Content-Encoding"] = encoder.name
    response = StreamResponse(
        tab_body(
            subscription, encoder, shutdown, keepalive=keepalive, hibernate_after=hibernate_after,
            retry=round(1000 * random.uniform(1.0, reconnect_within)),
        ),
        headers=headers,
        ping=0,  # a raw ping would corrupt a compressed body: keep-alives go through the encoder
        send_timeout=send_timeout,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
    )
    response.stream = subscription.stream
    return response


async def tab_body(
    subscription: Subscription, encoder: Encoder, shutdown: anyio.Event, *,
    keepalive: float, hibernate_after: float, retry: int | None = None,
) -> AsyncIterator[bytes]:
    """`stream.body`, ended cleanly by server shutdown (sse-starlette sees uvicorn's signal), so
    the page's `retry: 'always'` reconnects to the next process; the subscription closes after."""
    stream = subscription.stream
    on_shutdown = asyncio.ensure_future(shutdown.wait())
    on_shutdown.add_done_callback(lambda _: stream.end())
    try:
        async for chunk in stream.body(encoder, keepalive=keepalive, hibernate_after=hibernate_after, retry=retry):
            yield chunk
    finally:
        on_shutdown.cancel()
        subscription.close()
