"""Security headers for a live page: a Content-Security-Policy that Datastar runs under.

```python
app.add_middleware(SecurityHeaders, datastar_url=lith.datastar_url)
```

In the app rather than in the proxy: the policy depends on what the app's pages load (where
Datastar comes from, the app's own inline scripts), the tests that open the pages in Chromium
run without the proxy, and every way of serving the app then sends the same headers.

What Datastar 1.0 needs: it compiles each `data-*` expression with `Function`, so `script-src`
has `'unsafe-eval'`; its requests and streams are `fetch` to the page's own origin
(`connect-src 'self'`); morphed fragments carry `style` attributes (`style-src 'unsafe-inline'`).
Inline scripts and handlers are allowed by their hashes only.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .page import DATASTAR_CDN, DATASTAR_NOTICE


def content_security_policy(datastar_url: str = DATASTAR_CDN, inline_scripts: Iterable[str] = ()) -> str:
    """The policy for pages that load Datastar from `datastar_url` and run `inline_scripts`."""
    parts = urlsplit(datastar_url)
    sources = ["'self'"]
    if parts.netloc:  # a scheme-relative `//host/...` is allowed by its host, on the page's scheme
        sources.append(f"{parts.scheme}://{parts.netloc}" if parts.scheme else parts.netloc)
    hashes = [_sha256(script) for script in (DATASTAR_NOTICE, *inline_scripts)]
    # 'unsafe-hashes' lets a hash allow an event handler attribute (the script's onerror) too.
    script_src = " ".join([*sources, "'unsafe-eval'", "'unsafe-hashes'", *hashes])
    return "; ".join([
        "default-src 'self'",
        f"script-src {script_src}",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ])  # fmt: skip


def _sha256(script: str) -> str:
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


class SecurityHeaders:
    """ASGI middleware: the CSP above, `nosniff`, a same-origin referrer, no framing.

    A header the route set itself is kept. Pure ASGI, so the streams pass through untouched.
    """

    def __init__(self, app: ASGIApp, *, datastar_url: str = DATASTAR_CDN, inline_scripts: Iterable[str] = ()) -> None:
        self.app = app
        self.headers = [
            (b"content-security-policy", content_security_policy(datastar_url, inline_scripts).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"),
            (b"x-frame-options", b"DENY"),  # frame-ancestors, for browsers without CSP 2
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in self.headers if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
