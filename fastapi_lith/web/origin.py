"""The same-origin rule for command requests.

A browser sends `Sec-Fetch-Site` on every fetch; older ones send `Origin`. A command must come
from the app's own pages, and from Datastar (`Datastar-Request: true`), which makes a plain HTML
form on another site useless.
"""

from __future__ import annotations

from starlette.requests import Request


def cross_site_reason(request: Request) -> str | None:
    """Why a command request is refused, or None: it must be same-origin and from Datastar."""
    if request.headers.get("datastar-request") != "true":
        return "command requests must come from Datastar (Datastar-Request: true)"
    return same_origin_reason(request)


def same_origin_reason(request: Request) -> str | None:
    """Why a request is refused as cross-site, or None when it is same-origin.

    Routes that cannot carry `Datastar-Request` (a `navigator.sendBeacon`) check this alone.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is None:
        return "cross-site request refused (no Sec-Fetch-Site or Origin header)"
    # Scheme and host both: `https://host` and `http://host.evil.example` are other origins.
    expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin != expected:
        return f"cross-site request refused (Origin {origin} is not {expected})"
    return None
