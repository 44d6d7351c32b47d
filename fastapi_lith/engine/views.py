"""Views: `view = f(state)`, registered with `@lith.view(key, topics=...)`.

A view reads the database and returns HTML whose root element carries the id Datastar patches
by. Its key may carry parameters, `"board/{board_id}"`, typed by the function's annotations
FastAPI-style; its topics may use them, `"board:{board_id}"`. `"board/3"` names one instance.

Two parameter names are the server's, never the client's: a `{tab}` view is private to that tab
and a `{principal}` view to that principal (the id the web layer established for the stream).
A view may also carry an `access` rule, `fn(db, principal, **params) -> bool`, asked on every
stream open: who is asking is known to the rule, never to the render, so `view = f(db)` stays.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import string
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol

from markupsafe import Markup, escape
from pydantic import BaseModel, ValidationError, create_model

from .. import settings
from ..exceptions import AccessDenied, BadParameter, ViewError
from .db import Db, oversized_int
from .patches import root_id
from .streams import Principal

log = logging.getLogger("fastapi_lith.views")


class HasHtml(Protocol):
    def __html__(self) -> str: ...


Render = Callable[..., HasHtml]
Access = Callable[..., bool]  # fn(db, principal, **params): may this principal watch this instance?
Topics = set[str] | frozenset[str] | tuple[str, ...] | list[str]


def html_of(out: Any) -> Markup:
    """The one rule for what becomes HTML, in views and fragments alike: markup (anything with
    `__html__`: htpy elements, `Markup`) is inserted as it is, and text is escaped.

    A plain `str` is text, whatever it holds: inserted raw, a `<script>` in a card's title would
    run in every tab. HTML built elsewhere (a Jinja2 template's `render()`) is the app's to
    vouch for, with `Markup(...)`.
    """
    return escape(out)


@dataclass(eq=False)
class View:
    """One registered view: a key pattern, its topic patterns and the render function."""

    pattern: str
    topics: frozenset[str]
    render: Render
    access: Access | None = None
    names: tuple[str, ...] = ()
    _params: type[BaseModel] | None = None
    key_regex: re.Pattern[str] = field(default=re.compile(""))

    def __post_init__(self) -> None:
        names = tuple(f for _, f, _, _ in string.Formatter().parse(self.pattern) if f)
        self.names = names
        signature = inspect.signature(self.render)
        for name in names:
            if name not in signature.parameters:
                raise ViewError(f"view {self.pattern!r}: {self.render.__name__}() has no parameter {name!r}")
        for topic in self.topics:
            for _, f, _, _ in string.Formatter().parse(topic):
                if f and f not in names:
                    raise ViewError(f"view {self.pattern!r}: topic {topic!r} uses {{{f}}}, not in the key")
        fields: dict[str, Any] = {}
        for name in names:
            param = signature.parameters[name]
            annotation = str if param.annotation is inspect.Parameter.empty else param.annotation
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[name] = (annotation, default)
        self._params = create_model(f"{self.render.__name__}_params", **fields) if names else None
        if self.access is not None:
            rule = getattr(self.access, "__name__", repr(self.access))
            try:
                inspect.signature(self.access).bind(None, None, **{n: None for n in names if n != "principal"})
            except (TypeError, ValueError):
                raise ViewError(
                    f"view {self.pattern!r}: access {rule}() must take (db, principal"
                    + "".join(f", {n}" for n in names if n != "principal") + ")"
                ) from None
        regex = "".join(
            re.escape(text) + (f"(?P<{name}>[^/]+)" if name else "")
            for text, name, _, _ in string.Formatter().parse(self.pattern)
        )
        self.key_regex = re.compile(regex + r"\Z")

    def validate(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Typed parameters from strings (a URL) or values (Python), or `BadParameter` saying why.

        The one check of a view's parameters, for the stream route and a page's `lith.render`."""
        if self._params is None:
            return {}
        try:
            params = self._params(**raw).model_dump()
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise BadParameter(f"view {self.pattern!r}: {problems}") from None
        for name, value in params.items():
            if oversized_int(value) is not None:  # sqlite3 would raise OverflowError in the render
                raise BadParameter(
                    f"view {self.pattern!r}: {name}: {value} is outside SQLite's integers (-2**63 to 2**63 - 1)"
                )
        return params

    def allows(self, db: Db, principal: Principal, params: dict[str, Any]) -> bool:
        """The access rule's answer for one instance (True without a rule). Anything but True
        refuses: a rule that fails is logged and refuses, so a bug never opens a view."""
        if self.access is None:
            return True
        try:
            answer = self.access(db, principal, **{k: v for k, v in params.items() if k != "principal"})
        except Exception:  # noqa: BLE001 - refused, and logged for the app to fix
            log.exception("view %s: access rule failed for %r", self.key(params), principal)
            return False
        if not isinstance(answer, bool):
            log.error("view %s: access rule returned %r, not True or False", self.key(params), answer)
        return answer is True

    def key(self, params: dict[str, Any]) -> str:
        return self.pattern.format(**params)

    def topics_for(self, params: dict[str, Any]) -> frozenset[str]:
        return frozenset(t.format(**params) for t in self.topics)

    def html(self, db: Db, params: dict[str, Any]) -> str:
        """Render one instance; its root element must carry an id."""
        out = self.render(db, **params)
        if not isinstance(out, str) and not hasattr(out, "__html__"):
            raise ViewError(f"view {self.key(params)!r} returned {type(out).__name__}, not HTML")
        html = html_of(out)
        if root_id(html) is None:
            if not hasattr(out, "__html__"):
                raise ViewError(
                    f"view {self.key(params)!r} returned a str, which is text and is escaped: return "
                    "htpy elements, or Markup(html) for HTML you trust (a Jinja2 template's render())"
                )
            raise ViewError(
                f"view {self.key(params)!r}: its root element has no id, so Datastar cannot patch it"
            )
        return str(html)


class Views:
    """The registry behind `@lith.view`."""

    def __init__(self) -> None:
        self._views: dict[str, View] = {}

    def register(self, pattern: str, topics: Topics = (), access: Access | None = None) -> Callable[[Render], Render]:
        watched = settings.topics(f"view {pattern!r}: topics", topics)
        if access is not None and not callable(access):
            raise ViewError(f"view {pattern!r}: access must be a function (db, principal, **params) -> bool")

        def decorator(fn: Render) -> Render:
            if pattern in self._views:
                raise ViewError(f"view {pattern!r} is registered twice")
            self._views[pattern] = View(pattern, watched, fn, access)
            return fn

        return decorator

    def get(self, pattern: str) -> View | None:
        return self._views.get(pattern)

    def drop(self, pattern: str) -> None:
        del self._views[pattern]

    def resolve(self, key: str, params: dict[str, Any] | None = None) -> tuple[View, dict[str, Any]]:
        """Find the view of an instance key (`"board/3"`) or of a pattern plus parameters."""
        view = self._views.get(key)
        if view is not None and (params is not None or not view.names):
            return view, view.validate(params or {})
        for view in self._views.values():
            match = view.key_regex.match(key)
            if match:
                return view, view.validate(match.groupdict())
        raise ViewError(f"no view matches {key!r}")

    def for_tab(
        self, tab: str, keys: Iterable[str], principal: Principal = None
    ) -> list[tuple[str, View, dict[str, Any]]]:
        """The instances a tab's stream of `keys` watches: key, view and typed parameters.

        `ViewError` for a key no view matches, a bad parameter, or another tab's view (one with
        a `tab` parameter is private to that tab); `AccessDenied` for a `{principal}` view of
        anyone but `principal` (of anyone at all when it is None). The stream route and
        `lith.connect` share this check, so a page that names a wrong key fails where it is
        rendered, not in a stream answering 400 while Datastar retries it.
        """
        resolved: list[tuple[str, View, dict[str, Any]]] = []
        for raw in keys:
            view, params = self.resolve(raw)
            if "tab" in params and params["tab"] != tab:
                raise ViewError(f"view {raw!r} belongs to another tab")
            # Compared as the key spells them: the instance `tasks/42` is principal 42's.
            if "principal" in params and (principal is None or str(params["principal"]) != str(principal)):
                raise AccessDenied(f"view {raw!r} belongs to another principal")
            resolved.append((view.key(params), view, params))
        return resolved


# -- fragments ----------------------------------------------------------------------------

P = ParamSpec("P")


def fragment(maxsize: int = 4096) -> Callable[[Callable[P, Any]], Callable[P, Markup]]:
    """Cache a component's HTML by its arguments, so a board re-renders only changed cards.

    ```python
    @fragment()
    def card(row: sqlite3.Row) -> Element: ...   # a Row hashes by its values
    ```

    The arguments are the cache key, so pass what the HTML depends on (the row, a version), all
    hashable. The result is `Markup`: htpy inserts it as is, byte for byte what the element
    would have rendered (a plain `str` result is escaped: see `html_of`). Cached HTML lives as
    long as the process; `maxsize` bounds it.
    """

    def decorator(fn: Callable[P, Any]) -> Callable[P, Markup]:
        @functools.lru_cache(maxsize=maxsize)
        def cached(*args: Hashable, **kwargs: Hashable) -> Markup:
            # lru_cache needs hashable arguments, which P cannot say: they are fn's own.
            return html_of(fn(*args, **kwargs))  # type: ignore[arg-type]

        functools.update_wrapper(cached, fn)
        return cached  # type: ignore[return-value]

    return decorator
