"""The code of docs/access.md, run as virtual tabs (tests/web/test_access_browser.py runs it in
Chromium): views that know who is asking, an access rule, and a revoke."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fastapi_lith import AccessDenied
from fastapi_lith.testing import Tabs
from tests.app.test_docs import SRC, load
from tests.support.inprocess import InProcessServer


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
    # A page may render another principal's instance by naming it; nobody's is not asked for.
    async with Tabs(app.lith):
        assert await app.lith.render("tasks/{principal}", principal="alice") == (
            '<ul id="tasks"><li>Write the report</li></ul>'
        )


def test_the_access_page_renders_the_signed_in_users_own_tasks(
    app_server: Callable[..., InProcessServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the app's database is notes.db, beside the process
    server = app_server("app:app", app_dir=SRC / "access", env={"APP_SECRET": "a secret for this test only"})
    with httpx.Client(base_url=server.url, headers={"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}) as client:
        assert 'aria-label="Name"' in client.get("/").text  # nobody signed in: the sign-in form
        # `Depends(lith.same_origin)`: a sign-in posted from another site is refused.
        forged = httpx.post(f"{server.url}/signin", data={"user": "mallory"}, headers={"Sec-Fetch-Site": "cross-site"})
        assert (forged.status_code, forged.json()) == (403, {"detail": "cross-site request refused (Sec-Fetch-Site: cross-site)"})
        assert client.post("/signin", data={"user": "alice"}).status_code == 303
        assert client.post("/tasks", json={"tab": "t1", "op": 1, "title": "Mine"}).status_code == 204
        page = client.get("/")
        assert page.status_code == 200 and '<strong id="me">alice</strong>' in page.text
        assert '<ul id="tasks"><li>Mine</li></ul>' in page.text  # her own instance, and its stream's
        assert "views=notes,tasks/alice,outcome/" in page.text
