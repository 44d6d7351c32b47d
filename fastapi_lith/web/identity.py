"""Who is asking: the app's own identity dependency, as `lith.principal`.

The app already knows its users through a FastAPI dependency (a signed session cookie, a bearer
token). `Lith(identity=current_user)` names it; it returns the principal's id, a `str` or an
`int`, or None when nobody is signed in, and it may refuse the request itself (raise
`HTTPException(401)`). `lith.principal` is that dependency, wrapped, and the one answer every
part reads: the stream route on each connect and reconnect, a command's fields set by the
server, and `lith.connect`, which binds a page's stream to the principal it was rendered for.

An id rather than a user object: it keys views (`"tasks/{principal}"`), travels in signed stream
tokens and names whose streams `lith.revoke` ends, so it must be small, stable and comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from fastapi import Depends

from ..engine.streams import Principal
from ..exceptions import LithError

__all__ = ["IdentityError", "Principal", "asked", "principal_dependency"]

# The principal `lith.principal` gave in this request, boxed so that "nobody signed in" (None)
# differs from "not asked". A dependency runs in the request's own context, so the page's
# `lith.connect` after it sees the value; each request runs in a context of its own.
_asked: ContextVar[tuple[Principal] | None] = ContextVar("lith_principal", default=None)


class IdentityError(LithError):
    """The app's identity dependency returned something that is not a principal's id."""


def principal_dependency(identity: Callable[..., Any] | None) -> Callable[..., Any]:
    """`lith.principal`: `identity`'s answer, checked and remembered for the request.

    Without an identity every request is anonymous: the principal is None.
    """
    if identity is None:
        async def anonymous() -> Principal:
            _asked.set((None,))
            return None

        return anonymous

    async def principal(who: Any = Depends(identity)) -> Principal:
        """The request's principal: the app's identity dependency, once per request."""
        if who is not None and (type(who) not in (str, int)):
            raise IdentityError(
                f"identity {getattr(identity, '__name__', identity)!r} returned {type(who).__name__}: "
                "it must return the principal's id (a str or an int), or None for nobody signed in"
            )
        checked: Principal = who
        _asked.set((checked,))
        return checked

    return principal


def asked() -> tuple[Principal] | None:
    """`(principal,)` if `lith.principal` ran in this request, else None."""
    return _asked.get()
