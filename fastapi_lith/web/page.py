"""The page's side: a tab's id and signals, and the Datastar expressions that send commands.

A page names itself with a `tab` id and numbers its clicks with an `op` signal; a
`TabCommand` carries both, and the tab's outcome view sets `done` to the `op` that landed.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, cast

from datastar_py import action_generator as _action
from datastar_py import attribute_generator as _data
from datastar_py.attributes import JSExpression as _JS

from ..engine.commands import TAB_ID
from ..exceptions import SettingError

DATASTAR_CDN = "https://cdn.jsdelivr.net/gh/starfederation/datastar@1.0.1/bundles/datastar.js"
# The `onerror` of `Lith.datastar()`'s script: SecurityHeaders allows it by its hash.
DATASTAR_NOTICE = "document.getElementById('no-datastar').hidden = false"



def new_tab() -> str:
    """A fresh tab id for a page: random and URL-safe, a valid `TabId` (12 of `A-Z a-z 0-9 - _`)."""
    return secrets.token_urlsafe(9)


def tab_signals(tab: str, **signals: Any) -> dict[str, str]:
    """The page's `data-signals` attribute: `tab`, `op` and `done`, then the app's own signals."""
    if not TAB_ID.fullmatch(tab):
        raise SettingError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
    return cast("dict[str, str]", dict(_data.signals({"tab": tab, "op": 0, "done": 0, **signals})))


def send(url: str, **fields: str | int) -> str:
    """The Datastar expression that sends a command: a fresh `op`, then `@post(url)`.

    With no `fields` the body is every signal of the page (Datastar's default); with `fields` it
    is exactly `tab`, `op` and those fields, whose values are JavaScript (numbers, or signals
    such as `$title`). Requests are never cancelled: two quick clicks are two intents.
    """
    if not fields:
        return f"$op = $op + 1; {_action.post(url, request_cancellation='disabled')}"
    payload = {name: _JS(str(value)) for name, value in {"tab": "$tab", "op": "$op", **fields}.items()}
    return f"$op = $op + 1; {_action.post(url, payload=payload, request_cancellation='disabled')}"


# A data attribute a CSS selector and `getAttribute` take as is: `data-card-id`.
_DATA_ATTR = re.compile(r"data-[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def delegate(url: str, attr: str, **fields: str | int) -> dict[str, str]:
    """One click handler on a list's root that sends a command for the row clicked.

    A click on (or inside) an element of the list carrying `attr`, `data-card-id="3"`, sends
    `send(url, card_id="3", **fields)`: the attribute's value, a string that pydantic turns into
    an `int` field's 3, under the field named after it. `fields` are JavaScript, as for `send`,
    and may read `row`, the element carrying `attr`. A row holds only its data: a `send()` on
    every row repeats the whole expression, escaped, in each.
    """
    if not _DATA_ATTR.fullmatch(attr):
        raise SettingError(f"attr must be a data attribute such as 'data-card-id', not {attr!r}")
    name = attr.removeprefix("data-").replace("-", "_")
    if name in fields:
        raise SettingError(f"{name!r} is the field {attr!r} fills: leave it out of fields")
    post = send(url, **{name: f"row.getAttribute('{attr}')", **fields})
    # `el` is the list's root: a row is looked for inside it only, never in a page around it.
    return {"data-on:click": f"const row = evt.target.closest('[{attr}]'); if (row && el.contains(row)) {{ {post} }}"}


def pending(mine: str | None = None) -> dict[str, str]:
    """Attributes that mark a button busy from its click until its `op` lands (`$op != $done`).

    `mine` is a JavaScript condition that picks this button when several share the page's `op`
    (e.g. `"$busy == 3"`): only it shows pending.
    """
    busy = "$op != $done" if mine is None else f"({mine}) && $op != $done"
    attrs = {**_data.class_(pending=busy), **_data.attr({"aria-busy": f"({busy}) ? 'true' : false"})}
    return cast("dict[str, str]", attrs)
