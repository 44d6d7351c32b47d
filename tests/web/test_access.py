"""Who may watch what, over a real uvicorn: signed stream tokens, `{principal}` views, access
rules, refusals in both forms, and `lith.revoke` ending live streams in one process and in two.

The app (tests/support/accessapp.py) keeps sessions as rows, named by `X-Session`; `/connect`
gives the stream URL a page rendered for the request's session would open.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import htpy as h
import httpx
import pytest
from itsdangerous import TimestampSigner

from fastapi_lith import AccessDenied, Lith, LithError, ViewError
from fastapi_lith.web.access import CLOCK_SKEW, StreamTokens
from tests.support import REPO, SUPPORT
from tests.support.browser import Server
from tests.support.inprocess import InProcessServer, Served, wait_for_log

APP = "accessapp:app"
OLD, NEW = "the key of the last deploy", "the key of this deploy!!"
DATASTAR = {"Datastar-Request": "true"}


def settings(db: Path, secret: str | None = f"{OLD},{NEW}") -> dict[str, str | None]:
    return {"ACCESS_DB": str(db), "ACCESS_SECRET": secret}


def sign_in(server: Served, user: str) -> str:
    session = f"s-{user}"
    response = httpx.post(f"{server.url}/signin", json={"session": session, "user": user})
    assert response.status_code == 204, response.text
    return session


def page_url(server: Served, session: str | None, keys: str, tab: str = "t1") -> str:
    """The stream URL the page rendered for `session` opens, as Datastar would request it."""
    headers = {"X-Session": session} if session else {}
    response = httpx.get(f"{server.url}/connect", params={"keys": keys, "tab": tab}, headers=headers)
    assert response.status_code == 200, response.text
    return server.url + response.text


def edited(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return parts._replace(query=urlencode(query, safe="/,")).geturl()


@contextmanager
def stream(url: str, session: str | None, *, datastar: bool = False) -> Iterator[httpx.Response]:
    headers = {"Accept-Encoding": "identity", **({"X-Session": session} if session else {})}
    if datastar:
        headers.update(DATASTAR)
    with httpx.stream("GET", url, headers=headers, timeout=10) as response:
        yield response


def status(url: str, session: str | None) -> int:
    with stream(url, session) as response:
        return response.status_code


class Events:
    """A stream's body read event by event, then to its end."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.iter_text()
        self._text = ""

    def next(self) -> str:
        while "\n\n" not in self._text:
            self._text += next(self._chunks)
        event, self._text = self._text.split("\n\n", 1)
        return event

    def until_end(self) -> None:
        for _ in self._chunks:
            pass


def first_event(response: httpx.Response) -> str:
    return Events(response).next()


# What a refused Datastar stream appends to the page: reload, unless a reload in the last ten
# seconds was refused too, which only says so.
REFUSED_NOTICE = (
    '<p id="lith-refused" role="alert" data-init="Date.now() - Number(sessionStorage.getItem(&#39;lith-refused&#39;)'
    " || 0) &gt; 10000 &amp;&amp; (sessionStorage.setItem(&#39;lith-refused&#39;, Date.now()), location.reload())\">"
    'This page is out of date: <a href="">reload</a></p>'
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessServer]:
    """A server of the test's own: see `served` in test_input.py for why not one per module."""
    db = tmp_path / "access.db"
    with InProcessServer(APP, env=settings(db)) as server:
        yield server


def test_a_signed_stream_opens_and_every_edit_of_it_is_refused(server: Served) -> None:
    alice, bob = sign_in(server, "alice"), sign_in(server, "bob")
    url = page_url(server, alice, "board,tasks/{principal},outcome/{tab}")
    assert "views=board,tasks/alice,outcome/t1&tab=t1&token=" in url
    assert len(parse_qs(urlsplit(url).query)["token"][0]) < 64  # small enough for every reconnect
    with stream(url, alice) as response:
        assert response.status_code == 200
        assert 'id="board"' in first_event(response)
    token = parse_qs(urlsplit(url).query)["token"][0]
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for what, other in [
        ("no token", edited(url, token=None)),
        ("a forged token", edited(url, token=forged)),
        ("a token from another secret", edited(url, token=StreamTokens("not this app's key!!", 60).sign(
            "/lith/stream", "t1", ["board", "tasks/alice", "outcome/t1"], "alice"))),
        ("another tab", edited(url, tab="t2", views="board,tasks/alice,outcome/t2")),
        ("a key left out", edited(url, views="board,tasks/alice")),
        ("a key added", edited(url, views="board,tasks/alice,outcome/t1,team/1")),
    ]:
        with stream(other, alice) as response:
            assert response.status_code == 403, what
            assert response.headers["content-type"].startswith("text/plain")
    assert status(url, bob) == 403  # another principal replaying alice's URL
    assert status(url, None) == 403  # alice signed out: the identity no longer admits her


def test_an_expired_token_is_refused_and_a_young_one_opens(server: Served) -> None:
    alice = sign_in(server, "alice")
    day = 24 * 3600
    keys = ["board", "outcome/t1"]
    for age, expected in [(day + 60, 403), (day - 60, 200)]:
        signed_then = StreamTokens(NEW, day, clock=lambda age=age: time.time() - age)
        url = f"{server.url}/lith/stream?views=board,outcome/t1&tab=t1&token={signed_then.sign('/lith/stream', 't1', keys, 'alice')}"
        assert status(url, alice) == expected, age


def test_a_rotated_key_keeps_old_tokens_until_it_is_dropped(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    db = tmp_path / "access.db"
    rotating = app_server(APP, env=settings(db, secret=f"{OLD},{NEW}"))
    alice = sign_in(rotating, "alice")
    signed = {key: StreamTokens(key, 3600).sign("/lith/stream", "t1", ["board"], "alice") for key in (OLD, NEW)}
    url = f"{rotating.url}/lith/stream?views=board&tab=t1&token="
    assert status(url + signed[OLD], alice) == 200  # a page from before the new key
    assert status(url + signed[NEW], alice) == 200
    rotating.close()
    rotated = app_server(APP, env=settings(db, secret=NEW))
    url = f"{rotated.url}/lith/stream?views=board&tab=t1&token="
    assert status(url + signed[OLD], alice) == 403  # the old key dropped from the list
    assert status(url + signed[NEW], alice) == 200


def test_a_token_binds_the_stream_path_tab_keys_and_principal_and_no_more() -> None:
    tokens = StreamTokens([OLD, NEW], 60)
    token = tokens.sign("/a/acme/lith/stream", "t1", ["board", "outcome/t1"], 42)
    tokens.check(token, "/a/acme/lith/stream", "t1", ["outcome/t1", "board", "board"], 42)  # a set of keys
    for path, tab, keys, principal in [
        ("/a/other/lith/stream", "t1", ["board", "outcome/t1"], 42),  # another account's stream
        ("/a/acme/lith/stream", "t2", ["board", "outcome/t1"], 42),
        ("/a/acme/lith/stream", "t1", ["board"], 42),
        ("/a/acme/lith/stream", "t1", ["board", "outcome/t1"], "42"),  # the id 42 is not the name "42"
        ("/a/acme/lith/stream", "t1", ["board", "outcome/t1"], None),
    ]:
        with pytest.raises(AccessDenied):
            tokens.check(token, path, tab, keys, principal)
    in_a_minute = StreamTokens(NEW, 60, clock=lambda: time.time() + 60).sign("/s", "t1", ["board"], None)
    with pytest.raises(AccessDenied, match="expired"):  # from a clock far ahead: refused too
        tokens.check(in_a_minute, "/s", "t1", ["board"], None)


def test_a_mounted_apps_stream_opens_with_the_token_its_page_signed(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    mounted = app_server("mountedapp:app", env=settings(tmp_path / "access.db"))
    assert httpx.post(f"{mounted.url}/app/signin", json={"session": "s-alice", "user": "alice"}).status_code == 204
    path = httpx.get(f"{mounted.url}/app/connect", params={"keys": "tasks/{principal}", "tab": "t1"},
                     headers={"X-Session": "s-alice"}).text  # fmt: skip
    assert path.startswith("/lith/stream?views=tasks/alice&tab=t1&token=")  # the mount's own path
    with stream(f"{mounted.url}/app{path}", "s-alice") as response:
        assert response.status_code == 200
        assert '<ul id="tasks"></ul>' in first_event(response)
    assert status(f"{mounted.url}/app{edited(path, tab='t2')}", "s-alice") == 403


def test_a_token_is_good_from_the_clock_skew_ahead_to_max_age_and_not_a_second_past() -> None:
    signed = StreamTokens(NEW, 60, clock=lambda: 1_000_000).sign("/s", "t1", ["board"], None)
    for now, good in [(1_000_060, True), (1_000_061, False), (1_000_000 - CLOCK_SKEW, True), (999_994, False)]:
        checker = StreamTokens(NEW, 60, clock=lambda now=now: now)
        if good:
            checker.check(signed, "/s", "t1", ["board"], None)
        else:
            with pytest.raises(AccessDenied, match="^the stream token has expired: reload the page$"):
                checker.check(signed, "/s", "t1", ["board"], None)


def test_a_token_is_the_last_releases_token_and_no_other_signers() -> None:
    """A deploy's old and new processes serve side by side: the format is kept. Another signer
    on the same secret (Starlette's session cookie: itsdangerous' defaults) signs no token."""
    message = b'["/s","t1",["board","outcome/t1"],"alice"]'  # path, tab, sorted keys, principal
    tokens = StreamTokens(NEW, 60)
    for signer, good in [
        (TimestampSigner(NEW, salt="fastapi-lith stream token", digest_method=hashlib.sha256), True),
        (TimestampSigner(NEW), False),
        (TimestampSigner(NEW, digest_method=hashlib.sha256), False),
        (TimestampSigner(NEW, salt="fastapi-lith stream token"), False),
    ]:
        token = signer.sign(message)[len(message) + 1 :].decode()
        if good:
            tokens.check(token, "/s", "t1", ["outcome/t1", "board"], "alice")
        else:
            with pytest.raises(AccessDenied, match="^the stream token does not match this stream$"):
                tokens.check(token, "/s", "t1", ["outcome/t1", "board"], "alice")


def test_a_principal_that_cannot_key_a_view_is_the_pages_bug(server: Served) -> None:
    for user in ("a,b", "a/b"):  # ',' parts a stream's keys, '/' a key's parameters
        session = sign_in(server, user)
        response = httpx.get(f"{server.url}/connect", params={"keys": "tasks/{principal}", "tab": "t1"},
                             headers={"X-Session": session})  # fmt: skip
        assert response.status_code == 500
        wait_for_log(server, f"LithError: principal {user!r} cannot key a view: its id holds ',' or '/'")
    nobody = httpx.get(f"{server.url}/connect", params={"keys": "tasks/{principal}", "tab": "t1"})
    assert nobody.status_code == 500
    wait_for_log(server, "AccessDenied: view 'tasks/{principal}' needs a signed-in principal, and nobody is signed in")


def test_connect_asks_the_identity_only_for_a_token_or_a_principals_view(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db", identity=lambda: "alice")
    lith.view("board", topics={"board"})(lambda db: h.ul(id="board"))
    lith.view("tasks/{principal}", topics={"tasks:{principal}"})(lambda db, principal: h.ul(id="tasks"))
    expression = lith.connect("board", tab="t1")  # outside any request: nobody is asked
    assert expression == (
        "@get('/lith/stream?views=board&tab=t1', {retry: 'always', retryMaxCount: Infinity, filterSignals: {include: /^$/}})"
    )
    with pytest.raises(LithError, match=re.escape(
        "lith.connect needs the page's principal: the page route must take Depends(lith.principal)"
    )):
        lith.connect("tasks/{principal}", tab="t1")
    with pytest.raises(ViewError, match=re.escape("bad tab id 't 1': 1 to 64 letters, digits, '-' or '_'")):
        lith.connect("board", tab="t 1")


async def test_a_page_that_renders_a_principals_view_must_know_who_is_signed_in(tmp_path: Path) -> None:
    def tasks(db: object, principal: str) -> h.Element:
        return h.ul(id="tasks")

    asks = Lith(tmp_path / "a.db", identity=lambda: "alice")
    asks.view("tasks/{principal}", topics={"tasks:{principal}"})(tasks)
    with pytest.raises(LithError, match=re.escape(
        "rendering 'tasks/{principal}' needs the page's principal: the page route must take Depends(lith.principal)"
    )):
        await asks.render("tasks/{principal}")
    nobody = Lith(tmp_path / "b.db")  # no identity: nobody is ever signed in
    nobody.view("tasks/{principal}", topics={"tasks:{principal}"})(tasks)
    with pytest.raises(AccessDenied, match=re.escape(
        "view 'tasks/{principal}' needs a signed-in principal, and nobody is signed in"
    )):
        await nobody.render("tasks/{principal}")


def test_another_principals_view_is_refused_with_or_without_a_secret(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = app_server(APP, env=settings(tmp_path / "access.db", secret=None))
    alice = sign_in(server, "alice")
    base = f"{server.url}/lith/stream?tab=t1&views="
    assert status(base + "board", None) == 200  # no secret, no rule: public as its page is
    assert status(base + "tasks/alice", alice) == 200
    assert status(base + "tasks/bob", alice) == 403
    assert status(base + "board,tasks/bob", alice) == 403
    assert status(base + "tasks/alice", None) == 403  # nobody signed in
    # A page that names another principal's view fails where it is rendered.
    response = httpx.get(f"{server.url}/connect", params={"keys": "tasks/bob", "tab": "t1"}, headers={"X-Session": alice})
    assert response.status_code == 500


def test_a_views_access_rule_is_asked_on_every_open(server: Served) -> None:
    alice = sign_in(server, "alice")
    url = page_url(server, alice, "board,team/1")  # the page may render it: the stream asks the rule
    assert status(url, alice) == 403
    assert httpx.post(f"{server.url}/members", json={"team": 1, "user": "alice", "member": True}).status_code == 204
    with stream(url, alice) as response:
        assert response.status_code == 200
        events = Events(response)
        assert "<li>alice</li>" in events.next() + events.next()
    assert httpx.post(f"{server.url}/members", json={"team": 1, "user": "alice", "member": False}).status_code == 204
    assert status(url, alice) == 403


def test_refusals_stop_datastar_and_tell_other_clients_the_status(server: Served) -> None:
    alice = sign_in(server, "alice")
    url = page_url(server, alice, "board")
    for session in (None, "expired"):  # the stream's own refusal, and the identity's 401
        with stream(url, session, datastar=True) as response:
            assert response.status_code == 200  # Datastar retries every other status forever
            assert response.headers["content-type"].startswith("text/html")
            assert response.headers["datastar-selector"] == "body"
            assert response.headers["datastar-mode"] == "append"
            assert response.headers["cache-control"] == "no-store"  # a reload must ask again
            assert response.read().decode() == REFUSED_NOTICE
    with stream(url, None) as response:
        assert response.status_code == 403
        assert response.read().decode() == "the stream token does not match this stream"
    with stream(edited(url, token=None), alice) as response:
        assert response.status_code == 403
        assert response.read().decode() == "this stream needs the token its page signed: open it with lith.connect"
    with stream(url, "expired") as response:
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Session"
        assert response.read().decode() == "the session expired: sign in again"


def test_revoke_ends_the_principals_live_streams_at_once_and_their_reconnect_is_refused(server: Served) -> None:
    alice, bob = sign_in(server, "alice"), sign_in(server, "bob")
    alice_url = page_url(server, alice, "board,tasks/{principal}")
    bob_url = page_url(server, bob, "board,tasks/{principal}", tab="t2")
    with stream(alice_url, alice) as theirs, stream(bob_url, bob) as others:
        hers, his = Events(theirs), Events(others)
        hers.next()
        his.next()
        his.next()  # the board and bob's tasks
        assert httpx.post(f"{server.url}/signout", json={"session": alice}).status_code == 204
        hers.until_end()  # the body ends: alice's stream was cut off
        assert httpx.post(f"{server.url}/notes", json={"text": "still here"}).status_code == 204
        assert "still here" in his.next()  # bob's stream goes on
    assert status(alice_url, alice) == 403


def test_revoke_in_one_process_ends_the_stream_another_process_serves(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    db = tmp_path / "access.db"
    env = {**settings(db), "PYTHONPATH": str(REPO)}
    a, b = server_factory(APP, cwd=SUPPORT, env=env), server_factory(APP, cwd=SUPPORT, env=env)
    alice = sign_in(a, "alice")
    url = page_url(b, alice, "board,tasks/{principal}")
    with stream(url, alice) as response:
        events = Events(response)
        events.next()
        assert httpx.post(f"{a.url}/signout", json={"session": alice}).status_code == 204
        events.until_end()  # process b heard it through the feed
    assert status(url, alice) == 403
    assert sign_in(a, "alice") == alice  # signed in again in process a: b admits her again
    assert status(url, alice) == 200


def two_accounts(app_server: Callable[..., InProcessServer], tmp_path: Path) -> InProcessServer:
    """The accounts app, serving the accounts acme and other."""
    server = app_server("accessaccountsapp:app", env={"ACCESS_ACCOUNTS": str(tmp_path / "accounts")})
    for name in ("acme", "other"):
        assert httpx.post(f"{server.url}/accounts/{name}").status_code == 204
    return server


def test_under_accounts_a_token_opens_its_own_accounts_stream_only_and_revoke_reaches_every_account(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = two_accounts(app_server, tmp_path)
    alice = {"X-User": "alice", "Accept-Encoding": "identity"}
    urls = [httpx.get(f"{server.url}/a/{name}/connect", params={"tab": "t1"}, headers=alice).text for name in ("acme", "other")]
    assert urls[0].startswith("/a/acme/lith/stream?views=tasks/alice&tab=t1&token=")
    elsewhere = urls[0].replace("/a/acme/", "/a/other/")
    assert httpx.get(server.url + elsewhere, headers=alice).status_code == 403  # acme's page, other's stream
    with httpx.stream("GET", server.url + urls[0], headers=alice, timeout=10) as acme, httpx.stream(
        "GET", server.url + urls[1], headers=alice, timeout=10
    ) as other:
        assert acme.status_code == other.status_code == 200
        first, second = Events(acme), Events(other)
        first.next()
        second.next()
        assert httpx.post(f"{server.url}/revoke/alice").json() == {"ended": 2}
        first.until_end()
        second.until_end()


def test_under_accounts_a_views_access_rule_is_asked_in_the_requests_own_account(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = two_accounts(app_server, tmp_path)
    alice = {"X-User": "alice", "Accept-Encoding": "identity"}

    def board(name: str) -> str:
        response = httpx.get(f"{server.url}/a/{name}/connect", params={"tab": "t1", "keys": "board"}, headers=alice)
        assert response.status_code == 200, response.text
        return server.url + response.text

    def status(url: str) -> int:
        with httpx.stream("GET", url, headers=alice, timeout=10) as response:
            return response.status_code

    assert status(board("acme")) == 403  # a member of neither account yet
    joined = httpx.post(f"{server.url}/a/acme/members", json={"user": "alice"}, headers={**alice, **DATASTAR})
    assert joined.status_code == 204, joined.text
    with httpx.stream("GET", board("acme"), headers=alice, timeout=10) as response:
        assert response.status_code == 200
        assert "<li>alice</li>" in Events(response).next()
    assert status(board("other")) == 403  # the rule read other's members, where she is not one
