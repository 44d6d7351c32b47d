"""Command fields the server sets (`FromServer`), over a real uvicorn, a real session cookie
(Starlette's SessionMiddleware) and a real SQLite file: the owner is whoever the session says,
a body that names another is refused and writes nothing, through `lith.command`, a hand-written
route and a form alike."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI

from fastapi_lith import Command, CommandError, FromServer, Lith, LithError, TabCommand, Tx, Writer
from tests.support import SUPPORT
from tests.support.inprocess import InProcessServer, wait_for_log
from tests.web.test_input import TabStream

SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
ERROR = '<div id="lith-error" role="alert" class="lith-error"><ul><li>'
SET_BY_SERVER = "The server sets this field: a request cannot send it"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[InProcessServer, Path]]:
    """A server of the test's own: see `served` in test_input.py for why not one per module."""
    db = tmp_path / "owners.db"
    with InProcessServer("ownersapp:app", env={"OWNERS_DB": str(db), "OWNERS_ACCOUNTS": str(db.parent / "a")}) as server:
        yield server, db


def tasks(db: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT title, owner, team, tags FROM task ORDER BY id").fetchall()


@contextmanager
def signed_in(server: InProcessServer, user: str | None) -> Iterator[httpx.Client]:
    """A client whose session cookie names `user` (none: nobody signed in)."""
    with httpx.Client(base_url=server.url, headers=SAME_ORIGIN) as client:
        if user is not None:
            assert client.post(f"/sign-in/{user}").status_code == 204
        yield client


def test_lith_command_stores_the_sessions_principal_and_refuses_a_body_naming_another(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    tab = stream.tab  # type: ignore[attr-defined]
    before = tasks(db)
    with signed_in(server, "alice") as alice:
        assert alice.post("/tasks", json={"tab": tab, "op": 1, "title": "Write"}).status_code == 204
        stream.wait_for("Added Write for alice.")
        for op, field in ((2, "owner"), (3, "team")):
            forged = alice.post("/tasks", json={"tab": tab, "op": op, "title": "Forged", field: "bob"})
            assert forged.status_code == 422
            assert forged.text == f"{ERROR}<strong>{field}</strong>: {SET_BY_SERVER}</li></ul></div>"
            stream.told(SET_BY_SERVER, op)  # pushed to the tab, its button stops pending
    with signed_in(server, "bob") as bob:
        assert bob.post("/tasks", json={"tab": "bobs", "op": 1, "title": "Read"}).status_code == 204
    assert tasks(db) == [*before, ("Write", "alice", "red", ""), ("Read", "bob", "blue", "")]
    assert "Traceback" not in server.output


def test_a_hand_written_route_takes_lith_body_and_the_identity_runs_once(served: tuple[InProcessServer, Path]) -> None:
    server, db = served
    before = tasks(db)
    with signed_in(server, "bob") as bob:
        done = bob.post("/tasks/by-hand", json={"tab": "t1", "op": 1, "title": "By hand", "tags": ["x"]})
        assert done.status_code == 200
        # Two server fields and the principal itself: the app's identity ran once.
        assert done.json() == {"owner": "bob", "team": "blue", "identity_runs": 1}
        forged = bob.post("/tasks/by-hand", json={"tab": "t1", "op": 2, "title": "Forged", "owner": "alice"})
        assert forged.status_code == 422 and f"<strong>owner</strong>: {SET_BY_SERVER}" in forged.text
        # The client's own fields are checked by the command, as `lith.command` checks them.
        bad = bob.post("/tasks/by-hand", json={"tab": "t1", "op": 3, "title": ""})
        assert bad.status_code == 422 and "<strong>title</strong>: String should have at least 1 character" in bad.text
    assert tasks(db) == [*before, ("By hand", "bob", "blue", "x")]


@pytest.mark.parametrize("path", ["/tasks", "/tasks/by-hand"])
def test_a_cross_site_request_is_refused_before_its_body_is_read(served: tuple[InProcessServer, Path], path: str) -> None:
    """A forged post from another site, with a signed-in user's cookie, learns nothing of the
    command (no 422 naming its fields): `lith.body` takes the writer's guard first."""
    server, db = served
    before = tasks(db)
    with signed_in(server, "bob") as bob:
        for body in ({"tab": "t1", "op": 1, "title": ""}, {"tab": "t1", "op": 2, "title": "Forged"}):
            forged = bob.post(path, json=body, headers={"Sec-Fetch-Site": "cross-site"})
            assert forged.status_code == 403 and "cross-site request refused" in forged.text, forged.text
    assert tasks(db) == before


def test_one_idempotency_key_sent_by_two_people_applies_for_each(served: tuple[InProcessServer, Path]) -> None:
    """A client picks its own keys: bob sending alice's neither gets her result nor is dropped."""
    server, db = served
    before = tasks(db)
    key = {"Idempotency-Key": "the-same-key"}
    for user in ("alice", "bob"):
        with signed_in(server, user) as client:
            for _ in range(2):  # the second is a retry: applied once
                sent = client.post("/tasks/by-hand", json={"tab": "t9", "title": f"Keyed {user}"}, headers=key)
                assert sent.status_code == 200 and sent.json()["owner"] == user, sent.text
    assert tasks(db) == [*before, ("Keyed alice", "alice", "red", ""), ("Keyed bob", "bob", "blue", "")]


def test_every_server_field_sent_is_named(served: tuple[InProcessServer, Path]) -> None:
    server, _ = served
    with signed_in(server, "bob") as bob:
        forged = bob.post("/tasks/by-hand", json={"tab": "t1", "op": 4, "title": "x", "team": "red", "owner": "a"})
    assert forged.status_code == 422
    assert forged.text.count(SET_BY_SERVER) == 2 and "<strong>team</strong>" in forged.text


def test_an_identity_that_refuses_answers_401_as_html_and_nobody_signed_in_is_401(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    tab = stream.tab  # type: ignore[attr-defined]
    before = tasks(db)
    with signed_in(server, "mallory") as mallory:
        locked = mallory.post("/tasks", json={"tab": tab, "op": 1, "title": "Sneak"})
        assert locked.status_code == 401 and locked.text == f"{ERROR}This account is locked.</li></ul></div>"
        stream.told("This account is locked.", 1)
        # The writer's guard comes first: a cross-site request is a 403 before the identity runs.
        cross = mallory.post("/tasks", json={"tab": tab, "op": 2, "title": "Sneak"}, headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403
    with signed_in(server, None) as nobody:
        anonymous = nobody.post("/tasks", json={"tab": tab, "op": 3, "title": "Sneak"})
        assert anonymous.status_code == 401 and "Sign in to do this: nobody is signed in." in anonymous.text
        stream.told("Sign in to do this", 3)
    assert tasks(db) == before


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_a_form_post_is_the_same_body(served: tuple[InProcessServer, Path], stream: TabStream, encoding: str) -> None:
    server, db = served
    tab = stream.tab  # type: ignore[attr-defined]
    before = tasks(db)

    def post(client: httpx.Client, op: int, path: str = "/tasks", **fields: str | list[str]) -> httpx.Response:
        data = {"tab": tab, "op": str(op), **fields}
        if encoding == "urlencoded":
            return client.post(path, data=data)
        # As a browser posts a form whose file input is left empty: a part with `filename=""`
        # (httpx leaves that out), which counts as not sent, as an empty text field does.
        parts = [(key, v) for key, value in data.items() for v in ([value] if isinstance(value, str) else value)]
        body = b"".join(
            b'--b\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (key.encode(), v.encode())
            for key, v in parts
        ) + b'--b\r\nContent-Disposition: form-data; name="tags"; filename=""\r\n'
        body += b"Content-Type: application/octet-stream\r\n\r\n\r\n--b--\r\n"
        return client.post(path, content=body, headers={"Content-Type": "multipart/form-data; boundary=b"})

    with signed_in(server, "alice") as alice:
        assert post(alice, 1, title="From a form", tags=["a", "b"]).status_code == 204
        stream.wait_for("Added From a form for alice.")
        forged = post(alice, 2, title="Forged", owner="bob")
        assert forged.status_code == 422 and f"<strong>owner</strong>: {SET_BY_SERVER}" in forged.text
        stream.told(SET_BY_SERVER, 2)
        empty = post(alice, 3, title="")  # an empty field is a missing one, as FastAPI reads Form()
        assert empty.status_code == 422 and "<strong>title</strong>: Field required" in empty.text
        stream.told("Field required", 3)
        # Fields under their aliases, a list field's alias not its validation alias: the same.
        assert post(alice, 4, "/tasks/aliased", name="Aliased", label=["c", "d"]).status_code == 204
        stream.wait_for("Added Aliased for alice.")
    assert tasks(db) == [*before, ("From a form", "alice", "red", "a,b"), ("Aliased", "alice", "red", "c,d")]


def test_a_server_field_goes_in_under_the_key_its_command_validates_by(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    tab = stream.tab  # type: ignore[attr-defined]
    before = tasks(db)
    with signed_in(server, "bob") as bob:
        aliased = bob.post("/tasks/aliased", json={"tab": tab, "op": 1, "name": "By alias", "labels": ["x"]})
        assert aliased.status_code == 204, aliased.text
        named = bob.post("/tasks/named", json={"tab": tab, "op": 2, "title": "By name", "tags": ["y"]})
        assert named.status_code == 204, named.text
        forged = bob.post("/tasks/aliased", json={"tab": tab, "op": 3, "name": "Forged", "by": "alice"})
        assert forged.status_code == 422 and f"<strong>owner</strong>: {SET_BY_SERVER}" in forged.text
    assert tasks(db) == [*before, ("By alias", "bob", "blue", "x"), ("By name", "bob", "blue", "y")]


def test_a_server_value_the_field_refuses_is_the_apps_bug(served: tuple[InProcessServer, Path]) -> None:
    server, db = served
    # uvicorn closes the connection after an app's error: a request on it meanwhile is reset.
    close = {"connection": "close"}
    with signed_in(server, "alice") as alice:
        assert alice.post("/stamps", json={"label": "far too long"}, headers=close).status_code == 500  # the label too
        wait_for_log(server, "CommandError: Stamp.at is FromServer(broken_clock), whose value 'soon' it refuses: "
                     "Input should be a valid integer, unable to parse string as an integer")  # fmt: skip
        assert alice.post("/stamps/unset", json={}, headers=close).status_code == 500  # None from the app's dependency
        wait_for_log(server, "CommandError: UnsetStamp.at is FromServer(no_clock), whose value None it refuses")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM stamp").fetchone() == (0,)


def test_a_rule_across_fields_is_a_422_told_to_the_tab(served: tuple[InProcessServer, Path], stream: TabStream) -> None:
    server, _ = served
    tab = stream.tab  # type: ignore[attr-defined]
    with signed_in(server, "alice") as alice:
        own = alice.post("/reviews", json={"tab": tab, "op": 1, "author": "alice"})
        assert own.status_code == 422
        assert own.text == f"{ERROR}Value error, You cannot review your own task.</li></ul></div>"
        stream.told("You cannot review your own task.", 1)
        assert alice.post("/reviews", json={"tab": tab, "op": 2, "author": "bob"}).status_code == 204
        stream.wait_for("alice reviewed bob&#39;s task.")


def test_openapi_shows_what_the_client_may_send(served: tuple[InProcessServer, Path]) -> None:
    server, _ = served
    schema = httpx.get(server.url + "/openapi.json").json()
    assert "/tasks" not in schema["paths"]  # lith.command's routes stay out, as before
    body = schema["paths"]["/tasks/by-hand"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/AddTaskBody"}
    client = schema["components"]["schemas"]["AddTaskBody"]
    assert sorted(client["properties"]) == ["op", "tab", "tags", "title"]
    assert client["required"] == ["tab", "title"]


def test_an_accounts_command_fills_its_owner_and_its_account(tmp_path: Path) -> None:
    folder = tmp_path / "accounts"
    env = {"OWNERS_DB": str(tmp_path / "o.db"), "OWNERS_ACCOUNTS": str(folder)}
    with InProcessServer("ownersapp:accounts_app", env=env) as server, signed_in(server, "alice") as alice:
        assert alice.post("/accounts/acme").status_code == 204
        assert alice.post("/a/acme/tasks", json={"tab": "t1", "op": 1, "title": "Plan"}).status_code == 204
        forged = alice.post("/a/acme/tasks", json={"tab": "t1", "op": 2, "title": "Move", "team": "globex"})
        assert forged.status_code == 422 and f"<strong>team</strong>: {SET_BY_SERVER}" in forged.text
    with sqlite3.connect(folder / "acme.db") as conn:
        assert conn.execute("SELECT title, owner, team FROM task").fetchall() == [("Plan", "alice", "acme")]


class Claim(Command):
    what: str
    owner: Annotated[str, FromServer()]

    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO task (title, owner, team, tags) VALUES (:what, :owner, '', '')",
                   {"what": self.what, "owner": self.owner})


async def test_a_route_reading_such_a_command_whole_from_its_body_is_refused_at_start(tmp_path: Path) -> None:
    """FastAPI's own body validation knows nothing of `FromServer`: the owner would be the
    client's to say, so the app does not start."""
    lith = Lith(tmp_path / "t.db", migrations=SUPPORT / "owners_migrations")
    app = FastAPI()
    app.include_router(lith.router)

    @app.api_route("/claims", methods=["POST", "PUT"], status_code=204)
    async def claim(cmd: Claim, writer: Writer = Depends(lith.writer)) -> None:
        await writer.do(cmd)

    with pytest.raises(LithError) as refused:
        async with lith.lifespan(app):
            pass
    assert str(refused.value) == (  # the whole of it: the fix is in the message
        "POST PUT /claims takes Claim as its body, so its FromServer fields would come from the client: "
        "take cmd: Annotated[Claim, Depends(lith.body(Claim))]"
    )


async def test_lith_body_is_one_dependency_per_command_so_an_override_reaches_its_route(tmp_path: Path) -> None:
    """`app.dependency_overrides[lith.body(Claim)]`, as an app's own test sets it: the route's
    dependency is that same object, so the route gets the override's command."""
    lith = Lith(tmp_path / "t.db", migrations=SUPPORT / "owners_migrations", same_origin_only=False)
    app = FastAPI()
    app.include_router(lith.router)

    claimed = lith.body(Claim)

    @app.post("/claims", status_code=204)
    async def claim(cmd: Claim = Depends(claimed), writer: Writer = Depends(lith.writer)) -> None:
        await writer.do(cmd)

    app.dependency_overrides[lith.body(Claim)] = lambda: Claim(what="Plan", owner="tester")
    transport = httpx.ASGITransport(app=app)
    async with lith.lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/claims", json={})).status_code == 204
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("SELECT title, owner FROM task").fetchall() == [("Plan", "tester")]


def test_a_misplaced_from_server_is_refused_where_the_command_is_written() -> None:
    with pytest.raises(CommandError, match="page's own field"):
        class Hijack(TabCommand):
            tab: Annotated[str, FromServer()]  # type: ignore[assignment]

    with pytest.raises(CommandError, match="FastAPI dependency"):
        FromServer("owner")  # type: ignore[arg-type]

    with pytest.raises(CommandError, match="validation alias must be a str"):
        from pydantic import AliasChoices, Field

        class Aliased(Command):
            owner: Annotated[str, FromServer(), Field(validation_alias=AliasChoices("a", "b"))]


@pytest.mark.parametrize("given", [42, "AddTask", None, FastAPI])
def test_lith_body_of_anything_but_a_command_class_is_refused_where_it_is_written(
    tmp_path: Path, given: object
) -> None:
    lith = Lith(tmp_path / "app.db")
    with pytest.raises(CommandError, match=re.escape(f"lith.body takes a Command class, not {given!r}")):
        lith.body(given)  # type: ignore[arg-type]
