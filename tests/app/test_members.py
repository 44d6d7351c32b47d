"""Accounts with members, on a real uvicorn: a user of one account cannot use another, nor tell
whether it exists, and a refused request opens nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fastapi_lith import Accounts, LithError, SettingError
from tests.support import REPO
from tests.support.inprocess import InProcessServer

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}
PLAIN = {"Accept-Encoding": "identity"}


def answer(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    """The whole response but its Date, which says when, not what."""
    return response.status_code, {k: v for k, v in response.headers.items() if k != "date"}, response.content


def asks(account: str, body: dict[str, Any]) -> list[tuple[str, str, dict[str, str], dict[str, Any] | None]]:
    """A page, a command and the stream of `account`, each as a browser and as curl sends them."""
    stream = f"/a/{account}/lith/stream?views=notes&tab=t1"
    return [
        ("GET", f"/a/{account}/", PLAIN, None),
        ("GET", f"/a/{account}/", {**PLAIN, **SAME_ORIGIN}, None),
        ("POST", f"/a/{account}/note", SAME_ORIGIN, body),
        ("POST", f"/a/{account}/note", {}, body),
        ("POST", f"/a/{account}/note", SAME_ORIGIN, {"text": ["not", "text"]}),  # refused before its body
        ("GET", stream, {**PLAIN, **SAME_ORIGIN}, None),
        ("GET", stream, PLAIN, None),
    ]


def send(client: httpx.Client, method: str, url: str, headers: dict[str, str], body: dict[str, Any] | None) -> httpx.Response:
    return client.request(method, url, headers=headers, json=body)


def read_stream_until(client: httpx.Client, url: str, text: str, headers: dict[str, str]) -> None:
    with client.stream("GET", url, headers={**PLAIN, **headers}) as stream:
        assert stream.status_code == 200, stream.read()
        seen = ""
        for chunk in stream.iter_text():
            seen += chunk
            if text in seen:
                return
    raise AssertionError(f"the stream ended before {text!r}: {seen!r}")


@pytest.fixture(params=["sync", "async"])
def members(request: pytest.FixtureRequest, app_server: Callable[..., InProcessServer], tmp_path: Path) -> Iterator[tuple[InProcessServer, Path, str]]:
    folder = tmp_path / "accounts"
    folder.mkdir()
    for name in ("acme", "globex"):
        (folder / f"{name}.db").touch()  # an empty file is an account not yet migrated: opening it writes it
    server = app_server("membersapp:app", env={"MEMBERS_DIR": str(folder), "ADMITS": request.param})
    yield server, folder, request.param


def test_a_user_of_one_account_gets_for_another_exactly_what_an_account_that_does_not_exist_answers(
    members: tuple[InProcessServer, Path, str],
) -> None:
    server, folder, kind = members
    with httpx.Client(base_url=server.url, timeout=30, headers={"X-User": "alice"}) as alice:
        # alice's own account works as before: her page, her command, her stream.
        page = alice.get("/a/acme/")
        assert page.status_code == 200 and page.text.startswith("<h1>alice in acme</h1>")
        assert alice.post("/a/acme/note", json={"text": "hello"}, headers=SAME_ORIGIN).status_code == 204
        read_stream_until(alice, "/a/acme/lith/stream?views=notes&tab=t1", "<li>hello</li>", SAME_ORIGIN)
        before = alice.get("/pool").json()
        assert before["open"] == ["acme"] and before["opened"] == 1
        for method, url, headers, body in asks("globex", {"text": "from alice"}):
            refused = send(alice, method, url, headers, body)
            missing = send(alice, method, url.replace("/a/globex/", "/a/nowhere/"), headers, body)
            assert answer(refused) == answer(missing), (method, url, headers)
            assert refused.status_code == 404 and b"globex" not in refused.content
        after = alice.get("/pool").json()
    # globex was never opened for her: no writer started, its file as it was (empty, no WAL).
    assert after["open"] == ["acme"] and after["opened"] == 1
    assert (folder / "globex.db").stat().st_size == 0 and not (folder / "globex.db-wal").exists()
    assert sorted(p.name for p in folder.glob("nowhere*")) == []
    # A sync admits runs in the thread pool, off the event loop; an async one on it.
    assert set(after["admits_on_loop"]) == {kind == "async"}
    with httpx.Client(base_url=server.url, timeout=30, headers={"X-User": "bob"}) as bob:
        assert bob.get("/a/globex/").text.startswith("<h1>bob in globex</h1>")
        assert bob.get("/pool").json()["open"] == ["acme", "globex"]


def test_nobody_signed_in_is_the_identitys_own_401_before_any_account_is_looked_at(
    members: tuple[InProcessServer, Path, str],
) -> None:
    server, folder, _ = members
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        for account in ("acme", "globex", "nowhere"):
            for method, url, headers, body in asks(account, {"text": "anonymous"}):
                response = send(anonymous, method, url, headers, body)
                if "/lith/stream" in url and headers.get("Datastar-Request") == "true":
                    # A page's stream: the notice Datastar stops retrying on, whose reload asks
                    # the page's route again (docs/access.md).
                    assert response.status_code == 200 and 'id="lith-refused"' in response.text, url
                else:
                    assert response.status_code == 401 and "Sign in first." in response.text, url
        pool = anonymous.get("/pool").json()
    assert pool["open"] == [] and pool["opened"] == 0 and pool["admits_on_loop"] == []
    assert [p.stat().st_size for p in folder.iterdir()] == [0, 0]


def test_the_identity_runs_once_per_request_however_many_parts_ask_for_the_principal(
    members: tuple[InProcessServer, Path, str],
) -> None:
    server, _, _ = members
    with httpx.Client(base_url=server.url, timeout=30, headers={"X-User": "alice"}) as alice:
        start = alice.get("/pool").json()["identity"]
        assert alice.get("/a/acme/").status_code == 200  # admits and the page both take the principal
        assert alice.get("/pool").json()["identity"] == start + 1


# -- the recipe in docs/accounts.md ---------------------------------------------------------------

SECRET = "a test secret, long enough to sign with"


def session_cookie(user: str, secret: str = SECRET) -> str:
    """The cookie the app's sign-in would set: Starlette's own session middleware signs it."""

    async def sign_in(request: Request) -> Response:
        request.session["user"] = user
        return Response()

    signer = Starlette(routes=[Route("/", sign_in)], middleware=[Middleware(SessionMiddleware, secret_key=secret)])

    async def get() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=signer), base_url="http://app") as client:
            return (await client.get("/")).cookies["session"]

    return asyncio.run(get())


def test_the_members_recipe_keeps_each_team_to_its_members_and_a_member_adds_another(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = app_server("members:app", app_dir=REPO / "docs" / "src" / "accounts", env={"SESSION_SECRET": SECRET})

    def user(name: str, secret: str = SECRET) -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=30, cookies={"session": session_cookie(name, secret)})

    with user("alice") as alice, user("bob") as bob, httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.post("/accounts", headers=SAME_ORIGIN).status_code == 401
        made = {}
        for name, client in (("alice", alice), ("bob", bob)):
            response = client.post("/accounts", headers=SAME_ORIGIN)
            assert response.status_code == 303, response.text
            made[name] = response.headers["location"]  # /a/NAME/, a name the server chose
        ours, theirs = made["alice"], made["bob"]
        assert alice.get(ours).status_code == 200 and "alice in" in alice.get(ours).text
        add = {"tab": "t1", "op": 1, "n": 1}
        assert alice.post(ours + "add", json=add, headers=SAME_ORIGIN).status_code == 204
        read_stream_until(alice, ours + "lith/stream?views=counter&tab=t1", '<p id="counter">1</p>', SAME_ORIGIN)
        for method, path, headers, body in (
            ("GET", "", PLAIN, None),
            ("POST", "add", SAME_ORIGIN, add),
            ("POST", "members", SAME_ORIGIN, {"user": "alice"}),  # she cannot let herself in
            ("GET", "lith/stream?views=counter&tab=t1", {**PLAIN, **SAME_ORIGIN}, None),
        ):
            refused = send(alice, method, theirs + path, headers, body)
            missing = send(alice, method, "/a/0123456789abcdef/" + path, headers, body)
            assert refused.status_code == 404 and answer(refused) == answer(missing), path
        for client in (anonymous, user("alice", secret="another secret, which signs nothing")):
            assert client.get(ours).status_code == 401  # no cookie, or a forged one
        # A member adds another: then alice is in.
        assert bob.post(theirs + "members", json={"user": "alice"}, headers=SAME_ORIGIN).status_code == 204
        assert alice.get(theirs).status_code == 200 and "alice in" in alice.get(theirs).text
        assert alice.post(theirs + "add", json=add, headers=SAME_ORIGIN).status_code == 204
        # Each open stream asked admits once; none holds on to the directory's connection for it.
        with ExitStack() as open_streams:
            reading = []  # each stream's reader, kept: one let go closes its stream
            for tab in range(20):  # more than the directory's connection pool holds
                stream = open_streams.enter_context(
                    alice.stream("GET", f"{ours}lith/stream?views=counter&tab=s{tab}", headers={**PLAIN, **SAME_ORIGIN})
                )
                assert stream.status_code == 200, (tab, stream.read())
                reading.append(stream.iter_text())
                assert "counter" in next(reading[-1])
            assert alice.get(theirs).status_code == 200


# -- what admits must be --------------------------------------------------------------------------


def identity(x_user: str | None = Header(None)) -> str | None:
    return x_user


def test_admits_needs_an_identity_and_takes_the_principal_and_the_account_first(tmp_path: Path) -> None:
    def member(user: str, account: str) -> bool:
        return True

    class Membership:
        def __repr__(self) -> str:
            return "Membership()"

        def __call__(self, user: str) -> bool:
            return True

    def clashing(user: str, account: str, lith_account: str = Header("")) -> bool:
        return True

    def refused(admits: Any) -> str:
        with pytest.raises(SettingError) as refusal:
            Accounts(tmp_path, identity=identity, admits=admits)
        return str(refusal.value)

    with pytest.raises(SettingError, match="admits needs identity="):
        Accounts(tmp_path, admits=member)
    first_two = "must take the principal and the account's name as its first two parameters; FastAPI resolves any others"
    assert refused(lambda user: True) == f"admits '<lambda>' {first_two}"
    assert refused(Membership()) == f"admits Membership() {first_two}"  # named as it shows itself
    assert refused(lambda user, account, *rest: True) == "admits '<lambda>': FastAPI cannot fill its parameter 'rest'"
    assert refused(clashing) == "admits 'clashing': the parameter names ['lith_account'] are taken"
    assert refused("members").startswith("admits must be a function")
    Accounts(tmp_path, identity=identity, admits=member)


def role_of(x_role: str = Header("guest")) -> str:
    return x_role


def member_by_role(user: str, account: str, role: Annotated[str, Depends(role_of)]) -> bool:
    """A plain function: run in the thread pool, its `role` filled by FastAPI (this module's
    annotations are strings, read in this module)."""
    return user == "alice" and account == "acme" and role == "member"


class MemberByRole:
    """An object whose `__call__` is a coroutine: awaited on the loop."""

    async def __call__(self, user: str, account: str, role: Annotated[str, Depends(role_of)]) -> bool:
        await asyncio.sleep(0)  # a real await, as a read of the app's own database would be
        return member_by_role(user, account, role)


def accounts_naming_their_page(tmp_path: Path, admits: Any) -> tuple[Accounts, FastAPI]:
    """Accounts with `admits` and a page at each account's root that answers the account's name."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "0001_init.sql").write_text("CREATE TABLE t (x INTEGER);")
    accounts = Accounts(tmp_path / "accounts", migrations=tmp_path / "m", identity=identity, admits=admits)
    app = FastAPI()
    app.include_router(accounts.router)

    @accounts.router.get("/")
    async def page() -> str:
        return accounts.account().name

    return accounts, app


@pytest.mark.parametrize("admits", [member_by_role, MemberByRole()], ids=["function", "async object"])
async def test_admits_may_be_a_function_or_an_async_callable_object_and_reads_its_own_dependencies(
    admits: Any, tmp_path: Path
) -> None:
    accounts, app = accounts_naming_their_page(tmp_path, admits)
    async with accounts.lifespan(app):
        await accounts.create("acme")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            member = await client.get("/a/acme/", headers={"X-User": "alice", "X-Role": "member"})
            assert (member.status_code, member.json()) == (200, "acme")
            guest = await client.get("/a/acme/", headers={"X-User": "alice"})
            assert (guest.status_code, guest.json()) == (404, {"detail": "no such account"})


async def test_an_admits_that_answers_neither_true_nor_false_is_a_bug_not_a_refusal(tmp_path: Path) -> None:
    def member(user: str, account: str) -> Any:
        return {"user": user}  # a row found, say, instead of whether one was

    accounts, app = accounts_naming_their_page(tmp_path, member)
    async with accounts.lifespan(app):
        await accounts.create("acme")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            with pytest.raises(LithError, match="admits 'member' returned dict: it must return True or False"):
                await client.get("/a/acme/", headers={"X-User": "alice"})
