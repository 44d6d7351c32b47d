"""The page's side of a form Datastar posts as a form (urlencoded, or multipart for an upload).

Datastar sends a form's fields, not the page's signals, so the tab and op travel as hidden
fields: `form_fields(tab)` renders them and `send_form(url)` numbers the click and copies the
new `op` into its field before the form is read (a bound attribute would update too late).
The route reads them with `Form()` and builds the command; its refusals reach the tab as a JSON
command's do (guard.py reads `tab` and `op` from the start of a form's body too).
"""

from __future__ import annotations

import htpy as h
from datastar_py import action_generator as _action
from markupsafe import Markup

from ..engine.commands import TAB_ID
from ..exceptions import SettingError


def form_fields(tab: str) -> Markup:
    """Hidden `tab` and `op` fields: put them first in the form, before any file, so that a
    body refused as too large still names its tab in the part that is read."""
    if not TAB_ID.fullmatch(tab):
        raise SettingError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
    fields = h.fragment[h.input(type="hidden", name="tab", value=tab), h.input(type="hidden", name="op", value="0")]
    return Markup(fields)


def send_form(url: str) -> str:
    """The Datastar expression that posts the form it is on (or its button's) as a command.

    Multipart when the form has `enctype="multipart/form-data"` (an upload), urlencoded
    otherwise; like `send`, a fresh `op` per click and never cancelled.
    """
    post = _action.post(url, content_type="form", request_cancellation="disabled")
    return f"$op = $op + 1; (el.form || el).elements.namedItem('op').value = $op; {post}"
