"""The code of docs/access.md, run as virtual tabs (tests/web/test_access_browser.py runs it in
Chromium): views that know who is asking, an access rule, and a revoke."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastapi_lith import AccessDenied
from fastapi_lith.testing import Tabs
from tests.app.test_docs import SRC, load


async def test_the_access_pages_views_keep_to_their_principal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APP_SECRET", "a secret for this test only")
    app = load(SRC / "access" / "app.py", "docs_access_app")
    async with Tabs(app.lith) as tabs:
        alice = await tabs.open("tasks/{principal}", "team/staff", principal="alice")
        assert alice.html("team/staff") == '<p id="team">staff: alice</p>'
        for keys in (["tasks/alice"], ["team/staff"], ["tasks/{principal}"]):  # bob is no staff member
            with pytest.raises(AccessDenied):
                await tabs.open(*keys, principal="bob" if keys != ["tasks/{principal}"] else None)
        bob = await tabs.open("tasks/{principal}", principal="bob")
        await tabs.do(app.AddTask(tab=alice.id, op=1, owner="alice", title="Write the report"))
        await tabs.tick()
        assert alice.html("tasks/{principal}") == '<ul id="tasks"><li>Write the report</li></ul>'
        assert bob.html("tasks/{principal}") == '<ul id="tasks"></ul>'
        assert await app.lith.revoke("alice") == 1
        assert alice.stream.ended and not bob.stream.ended
