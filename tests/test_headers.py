"""Security headers (fastapi_lith.headers) on the examples, and their pages working in Chromium
under the Content-Security-Policy: Datastar binds, a click lands, the stream morphs it in, and
the browser reports no violation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from browser import Server, wait_for_datastar
from fastapi_lith import content_security_policy

REPO = Path(__file__).resolve().parent.parent
# Every violation the page reports, also those of report-only checks, kept for the test.
WATCH = ("window.__violations = [];"
         "document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective))")  # fmt: skip

APPS = {
    "counter": ("examples.counter.app:app", "COUNTER_DB", "/", "#counter", "Add"),
    "kanban": ("examples.kanban.app:app", "KANBAN_DB", "/boards/1", "#board", None),
}


@pytest.mark.parametrize("name", list(APPS))
def test_a_page_works_under_its_content_security_policy(
    name: str, new_page: Callable[..., Any], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    app, variable, path, root, button = APPS[name]
    server = server_factory(app, cwd=REPO, env={variable: str(tmp_path / "app.db")})
    headers = httpx.get(server.url + path).headers
    csp = headers["content-security-policy"]
    assert "'unsafe-eval'" in csp and "frame-ancestors 'none'" in csp and "https://cdn.jsdelivr.net" in csp
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "same-origin"
    with httpx.stream("GET", server.url + "/lith/stream?views=outcome/t1&tab=t1") as stream:
        assert stream.headers["x-content-type-options"] == "nosniff"  # the streams pass through

    page = new_page()
    page.add_init_script(WATCH)
    page.goto(server.url + path)
    wait_for_datastar(page)
    expect(page.locator(root)).to_be_visible()
    if button is not None:  # a click, its POST, and the frame the stream sends back
        page.get_by_role("button", name=button).click()
        expect(page.locator("#counter")).to_have_text("1")
    assert page.evaluate("window.__violations") == []
    # The policy is enforced: a script it does not allow never runs.
    with pytest.raises(PlaywrightError):
        page.add_script_tag(content="window.__injected = true")
    assert page.evaluate("window.__injected === undefined")


def test_a_custom_datastar_url_is_allowed_by_its_origin_and_inline_scripts_by_hash() -> None:
    csp = content_security_policy("https://js.example.net/datastar.js", ["console.log(1)"])
    assert "script-src 'self' https://js.example.net 'unsafe-eval'" in csp and "cdn.jsdelivr.net" not in csp
    assert "'sha256-" in csp
    assert "script-src 'self' 'unsafe-eval'" in content_security_policy("/static/datastar.js")
