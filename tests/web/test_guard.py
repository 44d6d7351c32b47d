"""The tab and op a refused command's body names (`fastapi_lith.web.guard.acting_tab`), at the
edges of what a `TabCommand` can carry: the error handlers push the refusal to that tab, and a
wrong answer tells another tab or none. Any body at all is tests/web/test_input_fuzz.py's."""

from __future__ import annotations

from typing import Any

import pytest

from fastapi_lith.web.guard import acting_tab

FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        ({"tab": "t1", "op": 0}, None, ("t1", 0)),  # op 0: no click yet, still the tab's
        ({"tab": "t1", "op": 200}, None, ("t1", 200)),
        ({"tab": "t1", "op": 2**63 - 1}, None, ("t1", 2**63 - 1)),  # the largest SQLite integer
        ({"tab": "t1", "op": 2**63}, None, ("t1", None)),
        ({"tab": "t1", "op": -1}, None, ("t1", None)),
        ({"tab": "t1", "op": "7"}, None, ("t1", 7)),  # a form's field is text
        ({"tab": "t1", "op": "1" + "0" * 17}, None, ("t1", 10**17)),  # 18 digits
        ({"tab": "t1", "op": "1" + "0" * 18}, None, ("t1", None)),  # 19: more than an op needs
        ({"tab": "t1", "op": "seven"}, None, ("t1", None)),
        ({"tab": "t1", "op": True}, None, ("t1", None)),  # JSON's true is no number
        ({"tab": "a tab", "op": 1}, None, (None, 1)),  # no tab id
        ({"tab": 7, "op": 1}, None, (None, 1)),
        (["t1", 1], None, (None, None)),  # JSON, but no object
        (b'{"tab": "t1", "op": 3}', "application/json", ("t1", 3)),
        (b'{"tab": "t1", "op": 3, "text": "cut off', "application/json", ("t1", 3)),  # found in the start
        (b"tab=t1&op=4&text=hi", FORM, ("t1", 4)),
        # Text holding bytes that are no UTF-8, as surrogate escapes: read as those bytes.
        ('{"tab": "t1", "op": 5, "text": "\udcff"', "application/json", ("t1", 5)),
    ],
)
def test_the_acting_tab_and_op_of_a_body(body: Any, content_type: str | None, expected: tuple[Any, Any]) -> None:
    assert acting_tab(body, content_type) == expected
