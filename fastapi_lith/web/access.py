"""Who may watch what: stream tokens, the principal a page renders for, and refusals.

Two checks guard a stream, and both are kept. With `Lith(secret=...)` the page signs what it
rendered into its stream's URL (Turbo's way): the tab, the exact view instances and the
principal, so a client that edits the URL, or replays it as someone else, is refused. And on
every open and reconnect the stream asks the app's identity again and each view's `access`
rule (LiveView's way, in the hub), so access that ended is refused even with a valid token.

A refused stream is answered so that the page stops: Datastar 1.0.1 retries every answer but a
200 or a 204 forever (`retry: 'always'`), so a Datastar request gets a 200 `text/html` notice
appended to the body, which reloads the page once; any other client gets the status.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import htpy as h
from fastapi import HTTPException
from fastapi.routing import APIRoute
from itsdangerous import BadSignature, TimestampSigner
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from ..engine.streams import Principal
from ..exceptions import AccessDenied, LithError
from .identity import asked

# Distinguishes these signatures from any other the app makes with the same secret (its
# session cookie): one can never stand for the other.
SALT = "fastapi-lith stream token"
# Seconds a token may seem to come from the future: hosts' clocks differ a little, and a
# timestamp is whole seconds.
CLOCK_SKEW = 5
NOTICE_ID = "lith-refused"
# Reload once: the reload asks the page's route again (a sign-in page after a logout, a fresh
# token). A second refusal soon after a reload shows the notice only, so a page whose own views
# its stream refuses does not reload forever.
RELOAD_ONCE = (
    "Date.now() - Number(sessionStorage.getItem('lith-refused') || 0) > 10000"
    " && (sessionStorage.setItem('lith-refused', Date.now()), location.reload())"
)


class _Signer(TimestampSigner):
    def __init__(self, keys: Sequence[str], clock: Callable[[], float]) -> None:
        super().__init__(list(keys), salt=SALT, digest_method=hashlib.sha256)
        self.clock = clock

    def get_timestamp(self) -> int:
        return int(self.clock())


class StreamTokens:
    """Sign and check the token that binds a stream's URL to what its page rendered.

    The signed message is the stream's path (an account's, under `Accounts`), the tab, the
    sorted view instance keys and the principal; the token holds only the time and the
    signature (about 50 characters however many views), since the stream recomputes the
    message from its own request and principal. `secret` is one key or a
    list, the oldest first: the newest signs, every one verifies, so a key is rotated in by
    appending it and out by dropping it once `max_age` has passed.
    """

    def __init__(self, secret: str | Sequence[str], max_age: float, *, clock: Callable[[], float] = time.time) -> None:
        keys = [secret] if isinstance(secret, str) else list(secret)
        self._signer = _Signer(keys, clock)
        self.max_age = max_age
        self.clock = clock

    @staticmethod
    def _message(path: str, tab: str, keys: Iterable[str], principal: Principal) -> bytes:
        return json.dumps([path, tab, sorted(set(keys)), principal], separators=(",", ":")).encode()

    def sign(self, path: str, tab: str, keys: Iterable[str], principal: Principal) -> str:
        message = self._message(path, tab, keys, principal)
        return self._signer.sign(message)[len(message) + 1 :].decode()

    def check(self, token: str | None, path: str, tab: str, keys: Iterable[str], principal: Principal) -> None:
        """`AccessDenied` unless `token` was signed for exactly this stream path, tab, keys and
        principal, by one of the keys, at most `max_age` seconds ago."""
        if not token:
            raise AccessDenied("this stream needs the token its page signed: open it with lith.connect")
        message = self._message(path, tab, keys, principal)
        try:
            _, signed_at = self._signer.unsign(message + b"." + token.encode(), return_timestamp=True)
        except (BadSignature, UnicodeError):
            raise AccessDenied("the stream token does not match this stream") from None
        age = self.clock() - signed_at.timestamp()
        if not -CLOCK_SKEW <= age <= self.max_age:
            raise AccessDenied("the stream token has expired: reload the page")


def page_principal(identity: Callable[..., Any] | None, why: str) -> Principal:
    """The principal the page's request established, for `lith.connect` and `lith.render`.

    Without an identity nobody is ever signed in (None). With one, the page's route must have
    asked it, `Depends(lith.principal)`: a guess here would bind the stream to the wrong person.
    """
    if identity is None:
        return None
    answer = asked()
    if answer is None:
        raise LithError(f"{why} needs the page's principal: the page route must take Depends(lith.principal)")
    return answer[0]


def fill(key: str, tab: str, principal: Principal) -> str:
    """A key with `{tab}` and `{principal}` filled in, as the stream receives it."""
    if "{principal}" in key:
        if principal is None:
            raise AccessDenied(f"view {key!r} needs a signed-in principal, and nobody is signed in")
        if "," in str(principal) or "/" in str(principal):
            raise LithError(f"principal {principal!r} cannot key a view: its id holds ',' or '/'")
    return key.replace("{tab}", tab).replace("{principal}", str(principal))


def stream_path(request: Request) -> str:
    """The stream's path within the app, as `lith.connect` names it (a mount's prefix left out)."""
    path: str = request.scope["path"]
    root = request.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def refusal(request: Request, exc: AccessDenied | HTTPException) -> Response:
    """The stream's answer to a refused request: the notice for Datastar, the status otherwise."""
    if request.headers.get("datastar-request") == "true":
        notice = h.p(id=NOTICE_ID, role="alert", data_init=RELOAD_ONCE)[
            "This page is out of date: ", h.a(href="")["reload"]
        ]
        headers = {"datastar-selector": "body", "datastar-mode": "append", "Cache-Control": "no-store"}
        return HTMLResponse(str(notice), headers=headers)
    if isinstance(exc, HTTPException):
        return PlainTextResponse(str(exc.detail), exc.status_code, headers=exc.headers)
    return PlainTextResponse(str(exc), 403)


class StreamRoute(APIRoute):
    """The stream route: a 401 or 403 its dependencies raise (the app's identity refusing a
    session) is a refusal like the stream's own, so that a Datastar page stops retrying."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def refusing(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                if exc.status_code not in (401, 403):  # an unknown account, a 503: as they were
                    raise
                return refusal(request, exc)

        return refusing
