"""`Lith` over HTTP: a real uvicorn serving the counter example, a real SQLite file."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import REPO, SUPPORT
from tests.support.browser import Server
from tests.support.inprocess import InProcessServer, Served

SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def counter(tmp_path: Path) -> Iterator[tuple[InProcessServer, Path]]:
    """A server of each test's own: see `served` in web/test_input.py for why not one per module."""
    db = tmp_path / "counter.db"
    with InProcessServer("examples.counter.app:app", env={"COUNTER_DB": str(db)}) as server:
        yield server, db


def count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (SAME_ORIGIN, 204),
        ({"Datastar-Request": "true", "Origin": "{url}"}, 204),
        ({"Sec-Fetch-Site": "same-origin"}, 403),  # not Datastar: a plain form or a script
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Datastar-Request": "true", "Sec-Fetch-Site": "same-site"}, 403),
        ({"Datastar-Request": "true", "Origin": "http://evil.example"}, 403),
        ({"Datastar-Request": "true"}, 403),  # neither header: refused, not guessed
    ],
)
def test_origin_check(counter: tuple[Any, Path], headers: dict[str, str], status: int) -> None:
    server, db = counter
    headers = {k: v.format(url=server.url) for k, v in headers.items()}
    before = count(db)
    response = httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 3}, headers=headers)
    assert response.status_code == status, response.text
    assert count(db) == before + (3 if status == 204 else 0)
    if status == 403:
        assert "refused" in response.text or "Datastar" in response.text


def test_validation_failure_is_html_and_writes_nothing(counter: tuple[Any, Path]) -> None:
    server, db = counter
    before = count(db)
    response = httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 500}, headers=SAME_ORIGIN)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("text/html")
    assert response.text.startswith('<div id="lith-error" role="alert" class="lith-error">')
    assert "<strong>n</strong>: Pick a number from 1 to 100." in response.text  # the app's wording
    assert "{" not in response.text  # not a JSON dump
    missing = httpx.post(f"{server.url}/add", content=b"not json", headers={**SAME_ORIGIN, "Content-Type": "application/json"})
    assert missing.status_code == 422 and missing.headers["content-type"].startswith("text/html")
    assert "<li>The page sent something unreadable: reload it and try again.</li>" in missing.text
    assert count(db) == before


def test_body_size_limit(counter: tuple[Any, Path]) -> None:
    server, db = counter
    before = count(db)
    big = {"tab": "t1", "n": 1, "padding": "x" * 100_000}
    response = httpx.post(f"{server.url}/add", json=big, headers=SAME_ORIGIN)
    assert response.status_code == 413
    assert count(db) == before


def post_part_of(server: Served, path: str, headers: dict[str, str], *, total: int, chunked: bool) -> tuple[int, str, int]:
    """POST a body of `total` bytes but send at most 2 MB of it, then wait for the answer.

    A server that waits for the whole body never answers (the deadline fails the test); one
    that bounds the body while reading answers 413 with most of the body never sent.
    """
    start = b'{"tab": "t1", "op": 0, "n": 1, "padding": "'
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    sent, piece = 0, 64 * 1024
    with sock:
        while sent < min(total, 2_000_000):
            readable, writable, _ = select.select([sock], [sock], [], 10)
            if readable:
                break  # answered before the body was sent: stop sending
            assert writable, "the server neither reads the body nor answers"
            data = start if sent == 0 else b"x" * piece
            sock.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data)
            sent += len(data)
        assert select.select([sock], [], [], 10)[0], "no answer before the body ended"
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(65536)
        header, _, rest = raw.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", header, re.I).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(header.split()[1]), rest.decode(), sent


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_a_large_body_is_refused_while_it_is_read(counter: tuple[InProcessServer, Path], chunked: bool) -> None:
    server, db = counter
    before = count(db)
    status, body, sent = post_part_of(server, "/add", SAME_ORIGIN, total=10_000_000, chunked=chunked)
    assert status == 413
    assert sent < 10_000_000  # answered long before the whole body came
    assert body.startswith('<div id="lith-error"') and "too large: at most 65536 bytes" in body
    assert count(db) == before


def test_the_counter_serves_no_api_docs(counter: tuple[Any, Path]) -> None:
    server, _ = counter
    for path in ("/openapi.json", "/docs", "/redoc"):  # (the stream route's absence: test_commands)
        assert httpx.get(f"{server.url}{path}").status_code == 404, path


def test_page_first_paint_comes_from_the_views(counter: tuple[Any, Path]) -> None:
    server, db = counter
    before = count(db)
    assert httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 7}, headers=SAME_ORIGIN).status_code == 204
    assert count(db) == before + 7
    page = httpx.get(f"{server.url}/").text
    assert f'<p id="counter" class="count">{count(db)}</p>' in page
    assert "/lith/stream?views=counter,outcome/" in page


async def test_lith_keeps_the_newest_timed_backups(tmp_path: Path) -> None:
    import asyncio

    from fastapi_lith import Lith
    from fastapi_lith.ops import verify

    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text("CREATE TABLE t (id INTEGER PRIMARY KEY);")
    lith = Lith(tmp_path / "app.db", migrations=tmp_path / "migrations",
                backup_folder=tmp_path / "backups", backup_every=1, backup_keep=2)
    seen: set[str] = set()
    async with lith.lifespan():
        assert lith.backups is not None
        deadline = asyncio.get_running_loop().time() + 60
        while lith.backups.taken < 3:  # copies at start-up, then every second
            assert asyncio.get_running_loop().time() < deadline, lith.backups.taken
            seen.update(p.name for p in (tmp_path / "backups").glob("*.db"))
            await asyncio.sleep(0.05)
    copies = sorted((tmp_path / "backups").glob("*.db"))
    seen.update(p.name for p in copies)
    assert len(copies) == 2
    assert lith.backups.last is not None and copies[-1] == lith.backups.last.path  # the newest kept
    assert [c.name for c in copies] == sorted(seen)[-2:]  # and the one before it
    assert all(verify(c).ok for c in copies)


def test_out_of_range_integers_are_a_422_with_the_fragment(counter: tuple[InProcessServer, Path]) -> None:
    server, db = counter
    before = count(db)
    for field in ("op", "n"):
        for value in (2**63, -(2**63) - 1, 10**30):
            response = httpx.post(f"{server.url}/add", json={"tab": "t1", field: value}, headers=SAME_ORIGIN)
            assert response.status_code == 422, (field, value, response.text)
            assert response.text.startswith('<div id="lith-error"') and f"<strong>{field}</strong>" in response.text
    assert count(db) == before


README_SCHEMA = "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"


def test_the_readmes_app_refuses_integers_sqlite_cannot_store(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)  # type: ignore[union-attr]
    app = tmp_path / "app"
    (app / "migrations").mkdir(parents=True)
    (app / "readme_app.py").write_text(code.replace('Lith("counter.db", ', 'Lith("counter.db", same_origin_only=False, '))
    (app / "migrations" / "0001_init.sql").write_text(README_SCHEMA)
    # Started from another folder, as a service is: the migrations are still found.
    server = Server("readme_app:app", cwd=tmp_path, args=["--app-dir", str(app)])
    server.start()
    try:
        for n in (2**63, -(2**63) - 1):
            response = httpx.post(f"{server.url}/add", json={"n": n})
            assert response.status_code == 422, response.text
            assert "<strong>n</strong>: Input should be an integer from -2**63 to 2**63 - 1" in response.text
        assert httpx.post(f"{server.url}/add", json={"n": 2**63 - 1}).status_code == 204
        assert "Traceback" not in server.output
    finally:
        server.close()
    assert count(tmp_path / "counter.db") == 2**63 - 1


class StreamReader:
    """A tab's identity-encoded stream, read on a thread, for the tests to wait on."""

    def __init__(self, server: Served, tab: str) -> None:
        self.data = b""
        self._client = httpx.Client(timeout=None)
        url = f"{server.url}/lith/stream?views=counter,outcome/{tab}&tab={tab}"
        self._cm = self._client.stream("GET", url, headers={"Accept-Encoding": "identity"})
        self._response = self._cm.__enter__()
        assert self._response.status_code == 200
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for chunk in self._response.iter_raw():
                self.data += chunk
        except httpx.HTTPError:
            pass

    def wait_for(self, pattern: str) -> None:
        deadline = time.monotonic() + 30
        while not re.search(pattern, self.data.decode()):
            assert time.monotonic() < deadline, f"{pattern!r} never came: {self.data[-2000:]!r}"
            time.sleep(0.01)

    def close(self) -> None:
        self._client.close()


@pytest.mark.parametrize(
    ("status", "headers", "body", "says"),
    [
        (400, {**SAME_ORIGIN, "Idempotency-Key": "no spaces allowed"}, None, "Idempotency-Key must be"),
        (403, {"Datastar-Request": "true", "Sec-Fetch-Site": "cross-site"}, None, "cross-site request refused"),
        (413, SAME_ORIGIN, "x" * 100_000, "The request is too large"),
    ],
)
def test_refused_commands_reach_the_acting_tab_as_html(
    counter: tuple[InProcessServer, Path], status: int, headers: dict[str, str], body: str | None, says: str
) -> None:
    server, db = counter
    before = count(db)
    tab = f"tab{status}"
    stream = StreamReader(server, tab)
    try:
        stream.wait_for("No clicks from this tab yet")
        signals = {"tab": tab, "op": 7, "n": 1}
        if body is not None:
            signals["padding"] = body
        response = httpx.post(f"{server.url}/add", content=json.dumps(signals), headers={**headers, "Content-Type": "application/json"})
        assert response.status_code == status
        assert response.headers["content-type"].startswith("text/html")
        assert response.text.startswith('<div id="lith-error" role="alert" class="lith-error"><ul><li>')
        assert says in response.text
        # Datastar ignores an error's body: the tab gets the fragment down its stream, and
        # `done` so the button stops pending.
        stream.wait_for(f'datastar-patch-elements\ndata: elements <div id="lith-error"[^\n]*{re.escape(says)}')
        stream.wait_for(r'datastar-patch-signals\ndata: signals \{"done": ?7\}')
    finally:
        stream.close()
    assert count(db) == before


def test_an_idempotency_key_applies_a_command_once(counter: tuple[InProcessServer, Path]) -> None:
    server, db = counter
    before = count(db)
    headers = {**SAME_ORIGIN, "Idempotency-Key": "order-1"}
    for _ in range(3):  # a client retrying after a lost answer
        assert httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 5}, headers=headers).status_code == 204
    assert count(db) == before + 5
    other = {**SAME_ORIGIN, "Idempotency-Key": "order-2"}
    assert httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 5}, headers=other).status_code == 204
    assert count(db) == before + 10


# -- the host app: what `lith.install(app)` leaves alone and what it guards -------------------


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[InProcessServer, Path]]:
    folder = tmp_path
    (folder / "migrations").mkdir()
    (folder / "migrations" / "0001_init.sql").write_text("CREATE TABLE note (id INTEGER PRIMARY KEY, text TEXT);")
    env = {"HOST_DB": str(folder / "host.db"), "HOST_MIGRATIONS": str(folder / "migrations")}
    with InProcessServer("hostapp:app", env=env) as server:
        yield server, folder / "host.db"


def test_install_leaves_the_host_app_alone(host: tuple[InProcessServer, Path]) -> None:
    server, _ = host
    for _ in range(3):
        assert httpx.post(f"{server.url}/echo", json={"text": "hi"}).json() == 2
    assert httpx.get(f"{server.url}/builds").json() == 1  # its middleware was built once
    refused = httpx.post(f"{server.url}/echo", json={"nope": 1})
    assert (refused.status_code, refused.text) == (422, "the app's own 422 at /echo: 1 error(s)")  # its own handler
    assert httpx.post(f"{server.url}/echo", json={"text": "x" * 5000}).json() == 5000  # no bound here


def test_install_guards_a_command_route_behind_a_nested_dependency(host: tuple[InProcessServer, Path]) -> None:
    server, db = host
    assert httpx.post(f"{server.url}/api/notes", json={"text": "kept"}).status_code == 204
    too_big = httpx.post(f"{server.url}/api/notes", json={"text": "x" * 2000})
    assert too_big.status_code == 413 and too_big.text.startswith('<div id="lith-error"')
    invalid = httpx.post(f"{server.url}/api/notes", json={"txt": "typo"})  # marked by the writer dependency
    assert invalid.status_code == 422 and "<strong>text</strong>: Field required" in invalid.text
    # The guard's handlers stand over the app's, not instead: its handler of its own HTTPException still answers.
    own = httpx.post(f"{server.url}/api/notes", json={"text": "maintenance"})
    assert (own.status_code, own.text) == (503, "down for maintenance")
    # A command's 4xx is the guard's HTML even where the app has a page for that status; other routes keep it.
    missing = httpx.post(f"{server.url}/api/notes", json={"text": "missing"})
    assert missing.status_code == 404
    assert missing.text == '<div id="lith-error" role="alert" class="lith-error"><ul><li>No such note.</li></ul></div>'
    bad_key = httpx.post(f"{server.url}/api/notes", json={"text": "x"}, headers={"Idempotency-Key": "no spaces"})
    assert bad_key.status_code == 400 and bad_key.text.startswith('<div id="lith-error"'), bad_key.text
    nowhere = httpx.get(f"{server.url}/nowhere")
    assert (nowhere.status_code, nowhere.text) == (404, "the app's own 404")
    # A refusal is a command route's to answer (409, HTML) whatever the app's own handler of one says.
    refused = httpx.post(f"{server.url}/api/notes", json={"text": "no"})
    assert refused.status_code == 409 and refused.text.startswith('<div id="lith-error"'), refused.text
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT text FROM note").fetchall() == [("kept",)]


def test_install_leaves_the_apps_own_handlers_to_what_is_no_command_request(
    host: tuple[InProcessServer, Path],
) -> None:
    """A route that applies a command with the app's writer outside any guard (a job's): its
    refusal and its model that does not validate go to the app's own handlers."""
    server, db = host
    assert httpx.post(f"{server.url}/nightly", params={"text": "job"}).status_code == 204
    refused = httpx.post(f"{server.url}/nightly", params={"text": "no"})
    assert (refused.status_code, refused.text) == (409, "the app's own refusal at /nightly: Notes cannot say no.")
    invalid = httpx.post(f"{server.url}/nightly", params={"text": ""})
    assert (invalid.status_code, invalid.text) == (400, "the app's own invalid model at /nightly: 1 error(s)")
    members = httpx.get(f"{server.url}/members")  # any other HTTP error: the app's handler of them all
    assert (members.status_code, members.text) == (403, "the app's own 403 at /members: Members only.")
    # As Datastar sends them: the library's HTML, for the page to show.
    datastar = {"Datastar-Request": "true"}
    refused = httpx.post(f"{server.url}/nightly", params={"text": "no"}, headers=datastar)
    assert refused.status_code == 409 and "<li>Notes cannot say no.</li>" in refused.text, refused.text
    invalid = httpx.post(f"{server.url}/nightly", params={"text": ""}, headers=datastar)
    assert invalid.status_code == 422 and invalid.text.startswith('<div id="lith-error"'), invalid.text
    members = httpx.get(f"{server.url}/members", headers=datastar)
    assert members.status_code == 403 and "<li>Members only.</li>" in members.text, members.text
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT text FROM note").fetchall() == [("job",)]


# -- the design card's app: `app.include_router(lith.router)` is enough ----------------------


@pytest.fixture(params=["router", "lifespan", "install"])
def card_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[InProcessServer, Path]]:
    """tests/support/routerapp.py served three ways: include_router alone, with the lifespan, install."""
    folder = tmp_path
    (folder / "migrations").mkdir()
    (folder / "migrations" / "0001_init.sql").write_text(
        "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"
    )
    env = {
        "ROUTER_APP_DB": str(folder / "card.db"), "ROUTER_APP_MIGRATIONS": str(folder / "migrations"),
        "ROUTER_APP_WAY": request.param,
    }
    with InProcessServer("routerapp:app", env=env) as server:
        yield server, folder / "card.db"


ROUTES = ["/add", "/early/add", "/late/add"]


def test_the_design_cards_app_starts_its_engine_once(card_app: tuple[InProcessServer, Path]) -> None:
    server, db = card_app
    before = count(db)
    for n, path in enumerate(ROUTES, 1):
        response = httpx.post(f"{server.url}{path}", json={"tab": "t1", "op": n, "n": n})
        assert response.status_code == 204, (path, response.text)
    assert count(db) == before + 6
    assert httpx.get(f"{server.url}/starts").json() == 1  # the app's lifespan and the router's: one start


def test_a_page_render_refuses_a_parameter_sqlite_cannot_hold_with_400(card_app: tuple[InProcessServer, Path]) -> None:
    server, _ = card_app
    assert httpx.get(f"{server.url}/boards/3").text == '<p id="board">3</p>'
    refused = httpx.get(f"{server.url}/boards/9223372036854775808")
    assert refused.status_code == 400, refused.text
    assert "SQLite" in refused.json()["detail"], refused.text
    assert "Traceback" not in server.output


@pytest.mark.parametrize("path", ROUTES)
def test_the_design_cards_command_routes_are_guarded(card_app: tuple[InProcessServer, Path], path: str) -> None:
    server, db = card_app
    before = count(db)
    tab = "guard" + path.replace("/", "-")
    stream = StreamReader(server, tab)
    try:
        stream.wait_for('id="outcome"')
        too_big = httpx.post(f"{server.url}{path}", json={"tab": tab, "op": 3, "padding": "x" * 2000}, headers=SAME_ORIGIN)
        assert too_big.status_code == 413 and too_big.text.startswith('<div id="lith-error"'), too_big.text
        stream.wait_for(r'data: elements <div id="lith-error"[^\n]*The request is too large')
        stream.wait_for(r'datastar-patch-signals\ndata: signals \{"done": ?3\}')
        invalid = httpx.post(f"{server.url}{path}", json={"tab": tab, "op": 4, "n": 500}, headers=SAME_ORIGIN)
        assert invalid.status_code == 422 and "<strong>n</strong>" in invalid.text, invalid.text
        stream.wait_for(r'datastar-patch-signals\ndata: signals \{"done": ?4\}')
        rejected = httpx.post(f"{server.url}{path}", json={"tab": tab, "op": 5, "n": 13}, headers=SAME_ORIGIN)
        assert rejected.status_code == 204, rejected.text  # a tab command: its outcome view says why
        stream.wait_for("13 is unlucky")
    finally:
        stream.close()
    assert count(db) == before
    conflict = httpx.post(f"{server.url}/plain", json={"n": 2})
    assert conflict.status_code == 409 and "no 2" in conflict.text


async def test_a_route_taking_the_writer_that_was_not_guarded_fails_loudly(tmp_path: Path) -> None:
    """A route added once the app runs has no guard: it is refused, never served unbounded."""
    from fastapi import Depends, FastAPI

    from fastapi_lith import Lith, LithError, Writer

    lith = Lith(tmp_path / "app.db", same_origin_only=False)
    app = FastAPI()
    app.include_router(lith.router)

    @app.post("/early", status_code=204)
    async def early(writer: Writer = Depends(lith.writer)) -> None:
        return None

    transport = httpx.ASGITransport(app=app)
    async with lith.lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        @app.post("/later", status_code=204)
        async def later(writer: Writer = Depends(lith.writer)) -> None:
            return None

        assert (await client.post("/early")).status_code == 204
        with pytest.raises(LithError) as refused:
            await client.post("/later")
    assert str(refused.value) == (  # the whole of it: the fix is in the message
        "POST /later takes Depends(lith.writer) but is not guarded (body limit, HTML errors): include lith.router "
        "(or accounts.router) in the app that serves it, app.include_router(lith.router), and add its routes "
        "before the app starts"
    )


async def test_a_router_whose_lith_is_gone_says_so_when_its_app_starts(tmp_path: Path) -> None:
    """The router holds its Lith weakly (so that a closed account's is freed at once): an app
    that kept only the router fails at its start, saying what to keep, not later and vaguely."""
    from fastapi import FastAPI

    from fastapi_lith import Lith, NotRunning

    app = FastAPI()
    app.include_router(Lith(tmp_path / "app.db").router)
    gc.collect()
    with pytest.raises(NotRunning, match=r"^this router's Lith is gone: keep a reference to it \(lith = Lith\(\.\.\.\)\)"):
        async with app.router.lifespan_context(app):
            pass


async def test_a_route_added_between_two_starts_is_guarded_at_the_second(tmp_path: Path) -> None:
    """Each start guards the routes that take the writer: those it wrapped stay as they are,
    and one added while the app was stopped is wrapped too, wherever it comes in the app."""
    from fastapi import Depends, FastAPI

    from fastapi_lith import Lith, Writer

    lith = Lith(tmp_path / "app.db", same_origin_only=False)
    app = FastAPI()
    app.include_router(lith.router)

    @app.post("/first", status_code=204)
    async def first(writer: Writer = Depends(lith.writer)) -> None:
        return None

    async with lith.lifespan(app):
        pass

    @app.post("/second", status_code=204)
    async def second(writer: Writer = Depends(lith.writer)) -> None:
        return None

    transport = httpx.ASGITransport(app=app)
    async with lith.lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/first")).status_code == 204
        assert (await client.post("/second")).status_code == 204


SECRET_REFUSED = (
    "secret must be a string of at least 16 characters, or a list of them (the oldest first, the newest signs), "
    "not a shorter or other value"
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"synchronous": "FULLL"}, "synchronous must be one of 'OFF', 'NORMAL', 'FULL', 'EXTRA', not 'FULLL'"),
        ({"readers": 0}, "readers must be an integer at least 1, not 0"),
        ({"max_body": "64k"}, "max_body must be an integer, not '64k'"),
        ({"tick": 0}, "tick must be a number at least 0.001, not 0"),
        ({"zstd_window_log": 24}, "zstd_window_log must be an integer from 10 to 23, not 24"),
        ({"brotli_quality": 12}, "brotli_quality must be an integer from 0 to 11, not 12"),
        ({"gzip_level": -1}, "gzip_level must be an integer from 0 to 9, not -1"),
        ({"prefix": "lith/"}, "prefix must be a path like '/lith'"),
        ({"error_id": "lith error"}, "error_id must be an HTML id (a letter, then letters, digits, '-' or '_'), not 'lith error'"),
        ({"max_body": 0}, "max_body must be an integer at least 1, not 0"),
        ({"hibernate_after": 0}, "hibernate_after must be a number at least 0.001, not 0"),
        ({"send_timeout": 0}, "send_timeout must be a number at least 0.001, not 0"),
        ({"stream_max_age": 0.5}, "stream_max_age must be a number at least 1, not 0.5"),
        ({"datastar_url": ""}, "datastar_url must be a URL or a path, not ''"),
        ({"identity": "current_user"}, "identity must be a FastAPI dependency (a function), not 'current_user'"),
        ({"secret": "x" * 15}, SECRET_REFUSED),
        ({"secret": []}, SECRET_REFUSED),
        ({"secret": ["x" * 16, 16]}, SECRET_REFUSED),
        ({"same_origin_only": "false"}, "same_origin_only must be True or False, not 'false'"),
        ({"messages": {"json_invalid": "x"}}, "messages must be a function"),
        ({"keepalive": -1}, "keepalive must be a number at least 0.001, not -1"),
        ({"backup_keep": 0}, "backup_keep must be an integer at least 1, not 0"),
        ({"migrations": 3}, "migrations must be a path or None, not 3"),
        ({"tikc": 0.05}, "Lith() has no setting 'tikc': did you mean 'tick'?"),
        ({"max_bdy": 10}, "Lith() has no setting 'max_bdy': did you mean 'max_body'?"),
        ({"colour": "red"}, "Lith() has no setting 'colour': its settings are backup_every, "),
    ],
)
def test_lith_settings_are_checked_when_built(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    from fastapi_lith import Lith, LithError

    with pytest.raises(ValueError, match=re.escape(message)) as info:
        Lith(tmp_path / "app.db", **kwargs)
    assert isinstance(info.value, LithError)


def test_each_web_setting_takes_the_lowest_value_it_allows(tmp_path: Path) -> None:
    from fastapi_lith import Lith

    lowest = {"max_body": 1, "keepalive": 0.001, "hibernate_after": 0.001, "send_timeout": 0.001,
              "reconnect_within": 1.0, "stream_max_age": 1, "secret": "x" * 16}  # fmt: skip
    lith = Lith(tmp_path / "app.db", **lowest)
    assert {name: getattr(lith.web.settings, name) for name in lowest} == lowest


def test_a_misspelt_setting_of_any_part_names_the_one_meant(tmp_path: Path) -> None:
    import inspect

    from fastapi_lith import Accounts, Lith, SettingError, Writer
    from fastapi_lith.backends.postgres.writer import PgWriter

    with pytest.raises(SettingError, match=re.escape("Writer() has no setting 'batchsize': did you mean 'batch_size'?")):
        Writer(tmp_path / "a.db", batchsize=5)  # type: ignore[call-arg]
    with pytest.raises(SettingError, match=re.escape("Accounts() has no setting 'max_opn': did you mean 'max_open'?")):
        Accounts(tmp_path, max_opn=5)
    with pytest.raises(SettingError, match=re.escape("Accounts() has no setting 'tikc': did you mean 'tick'?")):
        Accounts(tmp_path, tikc=0.05)
    with pytest.raises(SettingError, match=re.escape("PgWriter() has no setting 'retrys': did you mean 'retries'?")):
        PgWriter("postgresql+psycopg://lith@127.0.0.1/lith", retrys=3)  # refused before it connects
    # The signatures stay explicit, for IDEs and type checkers.
    assert "tick" in inspect.signature(Lith).parameters and "batch_size" in inspect.signature(Writer).parameters
    assert Lith(tmp_path / "b.db", tick=0.5).tick == 0.5 and Accounts(tmp_path, tick=0.5).max_open == 100


def test_every_library_error_is_a_lith_error() -> None:
    import fastapi_lith
    from fastapi_lith import LithError

    errors = [v for v in vars(fastapi_lith).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert {e.__name__ for e in errors} >= {"WriterClosed", "MigrationError", "ViewError", "SettingError", "NotRunning", "NotOneRow"}
    assert all(issubclass(e, LithError) for e in errors)
    assert issubclass(fastapi_lith.WriterClosed, RuntimeError) and issubclass(fastapi_lith.ViewError, ValueError)


# -- parts an app may pass instead of their settings ----------------------------------------------


async def test_an_apps_own_writer_readers_and_hub_are_used(tmp_path: Path) -> None:
    from fastapi_lith import Lith, SettingError, Writer
    from fastapi_lith.backends.sqlite.db import SqliteReaders
    from fastapi_lith.engine.hub import Hub

    path = tmp_path / "parts.db"
    writer = Writer(path, cached_statements=7)
    readers = SqliteReaders(path, size=1)
    built: list[Hub] = []

    def hub(*args: object, **kwargs: object) -> Hub:
        built.append(Hub(*args, **kwargs))  # type: ignore[arg-type]
        return built[-1]

    lith = Lith(path, writer=writer, readers=readers, hub=hub, tick=0.2)
    assert lith.writer.writer is writer and lith.feed is writer.feed
    async with lith.lifespan():
        assert built == [lith.hub] and lith.hub.readers is readers and lith.hub.interval == 0.2
        assert await lith.hub.readers.run(lambda db: db.scalar("SELECT 1")) == 1
    assert await readers.run(lambda db: db.scalar("SELECT 2")) == 2  # the app's: still open
    readers.close()
    with pytest.raises(SettingError, match="batch_size: set on the Writer"):
        Lith(path, writer=writer, batch_size=10)
    with pytest.raises(SettingError, match="writer must be a Writer of"):
        Lith(tmp_path / "other.db", writer=writer)


def test_cached_statements_reach_the_writer(tmp_path: Path) -> None:
    from fastapi_lith import Lith

    assert Lith(tmp_path / "a.db", cached_statements=3).writer.statements.size == 3


async def test_the_compression_settings_reach_each_streams_encoder(tmp_path: Path) -> None:
    from fastapi_lith import Lith

    lith = Lith(tmp_path / "a.db", zstd_window_log=12, brotli_quality=3, gzip_level=2)
    zstd, br, gzip = [await lith.web.encoder(name) for name in ("zstd", "br", "gzip")]
    assert (zstd.name, zstd.window_log) == ("zstd", 12)
    assert (br.name, br.quality) == ("br", 3)
    assert (gzip.name, gzip.level) == ("gzip", 2)


async def test_a_datastar_request_to_any_route_gets_its_error_as_html(tmp_path: Path) -> None:
    """With `lith.install(app)`, the header alone makes a request the page's: a route without
    the writer, refusing it, answers with the error fragment Datastar morphs in; another client
    keeps FastAPI's JSON."""
    from fastapi import FastAPI, HTTPException

    from fastapi_lith import Lith

    lith = Lith(tmp_path / "app.db")
    app = FastAPI()
    lith.install(app)

    @app.get("/cards/{card}")
    async def card(card: int) -> None:
        raise HTTPException(404, f"no card {card}")

    @app.get("/private")
    async def private() -> None:
        raise HTTPException(401, "sign in first", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/broken")
    async def broken() -> None:
        raise HTTPException(500, "broken")

    transport = httpx.ASGITransport(app=app)
    async with lith.lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        refusals = [("/cards/7", 404, "no card 7"), ("/cards/seven", 422, "card"), ("/private", 401, "sign in")]
        for path, status, text in refusals:
            page = await client.get(path, headers={"Datastar-Request": "true"})
            assert (page.status_code, page.headers["content-type"]) == (status, "text/html; charset=utf-8")
            assert page.text.startswith('<div id="lith-error"') and text in page.text, page.text
            api = await client.get(path)
            assert (api.status_code, api.headers["content-type"]) == (status, "application/json")
        # The error's own headers come along; a server error is no refusal for the page to show.
        private = await client.get("/private", headers={"Datastar-Request": "true"})
        assert private.headers["www-authenticate"] == "Bearer"
        broken = await client.get("/broken", headers={"Datastar-Request": "true"})
        assert (broken.status_code, broken.json()) == (500, {"detail": "broken"})


@pytest.mark.parametrize(
    "origin",
    [
        "null",  # a sandboxed frame or a file:// page
        "http://{host}.evil.example",  # the host as a prefix of another host
        "http://{host}0",
        "http://evil.example/{host}",
        "https://{host}",  # the same host under another scheme is another origin
        "ftp://{host}",
        "{host}",
    ],
)
def test_adversarial_origins_are_refused(counter: tuple[Any, Path], origin: str) -> None:
    server, db = counter
    host = server.url.split("://", 1)[1]
    before = count(db)
    headers = {"Datastar-Request": "true", "Origin": origin.format(host=host)}
    response = httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 3}, headers=headers)
    assert response.status_code == 403, response.text
    assert "refused" in response.text
    assert count(db) == before


def test_a_rejected_command_reaches_its_tab_with_the_done_signal(counter: tuple[Any, Path]) -> None:
    server, db = counter
    before = count(db)
    url = f"{server.url}/lith/stream?views=counter&tab=done1"
    with httpx.stream("GET", url, headers={"Accept-Encoding": "identity"}, timeout=10) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(lines).startswith("retry: ")  # when to come back, in the first event
        assert next(lines) == "event: datastar-patch-elements"  # the first frame is there
        response = httpx.post(f"{server.url}/add", json={"tab": "done1", "n": 500, "op": 41}, headers=SAME_ORIGIN)
        assert response.status_code == 422
        seen = []
        for line in lines:
            seen.append(line)
            if line.startswith("data: signals"):
                break
        assert 'id="lith-error"' in "\n".join(seen)
        assert seen[-1].replace(" ", "") == 'data:signals{"done":41}', seen
    assert count(db) == before


def test_a_command_route_answers_bad_input_with_html_without_the_datastar_header(tmp_path: Path) -> None:
    # A route that takes the writer is a command route, whoever calls it: a non-browser
    # client (same_origin_only=False) gets the same HTML error as the page.
    with InProcessServer("streamapp:app", env={"STREAM_DB": str(tmp_path / "b.db")}) as server:
        response = httpx.post(f"{server.url}/rename", json={"card": "seven", "title": "x"})
        assert response.status_code == 422
        assert response.headers["content-type"].startswith("text/html")
        assert '<div id="lith-error"' in response.text and "<strong>card</strong>" in response.text


# -- one start at a time ----------------------------------------------------------------------------


async def test_a_second_start_is_refused_and_the_first_runs_on(tmp_path: Path) -> None:
    from markupsafe import Markup

    from fastapi_lith import AlreadyRunning, Command, Db, Lith, Tx
    from fastapi_lith.testing import Tabs

    class Note(Command):
        def apply(self, tx: Tx) -> None:
            tx.execute("INSERT INTO note (text) VALUES ('x')")
            tx.touch("notes")

    lith = Lith(tmp_path / "a.db", migrations=SUPPORT / "commands_migrations")

    @lith.view("notes", topics={"notes"})
    def notes(db: Db) -> Markup:
        return Markup('<p id="notes">{}</p>').format(db.scalar("SELECT count(*) FROM note"))

    async with Tabs(lith) as tabs:
        tab = await tabs.open("notes")
        with pytest.raises(AlreadyRunning, match="already running"):
            async with Tabs(lith):
                pass
        with pytest.raises(AlreadyRunning):
            async with lith.lifespan():
                pass
        await tabs.do(Note())
        await tabs.tick()
        assert tab.html("notes") == '<p id="notes">1</p>'
    async with Tabs(lith) as tabs:  # stopped, it starts again
        assert (await tabs.open("notes")).html("notes") == '<p id="notes">1</p>'


async def test_two_starts_at_once_are_one_start(tmp_path: Path) -> None:
    from fastapi_lith import AlreadyRunning, Lith

    lith = Lith(tmp_path / "a.db")
    first, second = lith.lifespan(), lith.lifespan()
    results = await asyncio.gather(first.__aenter__(), second.__aenter__(), return_exceptions=True)
    assert results[0] is None and isinstance(results[1], AlreadyRunning)
    assert await lith.hub.readers.run(lambda db: db.scalar("SELECT 1")) == 1
    await first.__aexit__(None, None, None)


def test_each_default_is_the_parts_own() -> None:
    """Lith's settings default to what the part that uses them would choose by itself."""
    import inspect

    from fastapi_lith import Lith, Writer
    from fastapi_lith.ops import Backups, Replica
    from fastapi_lith.web.layer import WebSettings

    lith = inspect.signature(Lith).parameters
    for part, names in (
        (Writer, {n: n for n in ("synchronous", "batch_size", "cached_statements", "statement_cache", "repeat_window")}),
        (Backups, {"backup_every": "every", "backup_keep": "keep"}),
        (Replica, {"replica_sync_interval": "sync_interval", "replica_check_every": "check_every"}),
    ):
        own = inspect.signature(part).parameters
        for setting, name in names.items():
            assert lith[setting].default == own[name].default, (setting, part)
    for name in ("same_origin_only", "max_body", "error_id", "keepalive", "hibernate_after", "send_timeout",
                 "reconnect_within"):
        assert lith[name].default == getattr(WebSettings, name), name


@pytest.mark.parametrize("value", [0.5, "5", True])
def test_a_reconnect_window_below_datastars_own_second_or_not_a_number_is_refused(tmp_path: Path, value: object) -> None:
    from fastapi_lith import Lith, SettingError

    with pytest.raises(SettingError, match="reconnect_within"):
        Lith(tmp_path / "a.db", reconnect_within=value)  # type: ignore[arg-type]
    assert Lith(tmp_path / "b.db", reconnect_within=1.0).reconnect_within == 1.0
