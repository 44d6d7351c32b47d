"""Security headers (fastapi_lith.web.headers): the policy, every header on a page, its stream
and a route with a header of its own (served in process), and the examples' pages working in
Chromium under the Content-Security-Policy: Datastar binds, a click lands, the stream morphs it
in, and the browser reports no violation."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from fastapi_lith import Lith, SettingError, content_security_policy
from tests.support import REPO
from tests.support.browser import Server, wait_for_datastar
from tests.support.inprocess import InProcessServer

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


NOTICE_HASH = "'sha256-dAWZmEqHzt46qWhje4KYlG7mG+RLqhHL8hXGRBvKsfQ='"  # of Lith.datastar()'s onerror
POLICY = (
    "default-src 'self'; script-src 'self' {origin}'unsafe-eval' 'unsafe-hashes' {hashes}; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)


def test_the_policy_has_every_directive_a_live_page_needs() -> None:
    assert content_security_policy() == POLICY.format(origin="https://cdn.jsdelivr.net ", hashes=NOTICE_HASH)
    assert content_security_policy("/static/datastar.js") == POLICY.format(origin="", hashes=NOTICE_HASH)
    scheme_relative = content_security_policy("//js.example.net/datastar.js")
    assert scheme_relative == POLICY.format(origin="js.example.net ", hashes=NOTICE_HASH)


def test_a_page_and_its_stream_get_every_header_and_a_routes_own_header_is_kept(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = app_server("headersapp:app", env={"HEADERS_DB": str(tmp_path / "app.db")})
    policy = POLICY.format(
        origin="https://js.example.net ", hashes=f"{NOTICE_HASH} 'sha256-CihokcEcBW4atb/CW/XWsvWwbTjqwQlE9nj9ii5ww5M='"
    )
    page = httpx.get(server.url + "/")
    assert page.headers["content-security-policy"] == policy
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["referrer-policy"] == "same-origin"
    assert page.headers["x-frame-options"] == "DENY"
    assert page.text == (
        '<body><p id="no-datastar" role="alert" hidden>Datastar did not load: reload to try again.</p>'
        '<script type="module" src="https://js.example.net/datastar.js" '
        """onerror="document.getElementById(&#39;no-datastar&#39;).hidden = false"></script>"""
        "<script>console.log(1)</script></body>"
    )
    with httpx.stream("GET", server.url + "/lith/stream?views=outcome/t1&tab=t1") as stream:
        assert stream.status_code == 200 and stream.headers["content-security-policy"] == policy
        assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"  # the stream's own, kept
    refused = httpx.get(server.url + "/lith/stream?views=outcome/t1&tab=t1", headers={"Accept-Encoding": "identity;q=0"})
    assert (refused.status_code, refused.json()) == (406, {"detail": "no acceptable Content-Encoding (zstd, br, gzip, identity)"})
    assert refused.headers["content-security-policy"] == policy  # an error's answer too
    own = httpx.get(server.url + "/embeddable")  # each header its own, none added beside it
    expected = server.module.OWN_HEADERS
    assert {name: own.headers.get_list(name) for name in expected} == {k: [v] for k, v in expected.items()}


def test_datastar_with_an_integrity_hash_asks_for_a_checked_cross_origin_load(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", datastar_url="https://js.example.net/d.js", datastar_integrity="sha384-abc=")
    assert str(lith.datastar()).endswith(
        '<script type="module" src="https://js.example.net/d.js" '
        """onerror="document.getElementById(&#39;no-datastar&#39;).hidden = false" """
        'integrity="sha384-abc=" crossorigin="anonymous"></script>'
    )


SRI_APP = """
import os
from pathlib import Path

import htpy as h
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from fastapi_lith import Lith

lith = Lith(Path(__file__).parent / "app.db", datastar_url="/static/datastar.js",
            datastar_integrity=os.environ["DATASTAR_INTEGRITY"])
app = FastAPI(lifespan=lith.lifespan)
lith.install(app)
app.mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    return str(h.html[h.body(data_signals="{clicks: 0}")[
        lith.datastar(),
        h.button({"data-on:click": "$clicks++"})["Click"],
        h.output({"data-text": "$clicks"})["0"],
    ]])
"""


@pytest.mark.parametrize("hash_matches", [True, False])
def test_datastar_runs_only_if_its_bytes_have_the_integrity_hash(
    hash_matches: bool, datastar_js: Path, new_page: Callable[..., Any], server_factory: Callable[..., Server],
    tmp_path: Path,
) -> None:
    (tmp_path / "static").mkdir()
    served = datastar_js.read_bytes()
    (tmp_path / "static" / "datastar.js").write_bytes(served)
    digest = hashlib.sha384(served if hash_matches else served + b"\n").digest()
    integrity = "sha384-" + base64.b64encode(digest).decode()
    (tmp_path / "sri_app.py").write_text(SRI_APP)
    server = server_factory("sri_app:app", cwd=tmp_path, env={"DATASTAR_INTEGRITY": integrity})
    assert f'integrity="{integrity}"' in httpx.get(server.url + "/").text
    page = new_page()
    page.goto(server.url + "/")
    if hash_matches:
        page.get_by_role("button", name="Click").click()
        expect(page.locator("output")).to_have_text("1")
        expect(page.get_by_role("alert")).to_be_hidden()
    else:  # the browser refuses the script, and the page says Datastar did not load
        expect(page.get_by_role("alert")).to_have_text("Datastar did not load: reload to try again.")


def test_an_integrity_that_is_not_a_hash_is_a_setting_error(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="datastar_integrity"):
        Lith(tmp_path / "a.db", datastar_integrity="md5-abc")
    assert "integrity" not in str(Lith(tmp_path / "b.db").datastar())  # none unless given
