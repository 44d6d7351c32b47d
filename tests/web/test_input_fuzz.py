"""Any request at all, to a command route and to the stream route of a real uvicorn: arbitrary
bodies, headers, content types and query strings, over raw sockets (httpx refuses to send some).

Each request must be answered (a complete response, never a reset), never with a 5xx; a command
writes exactly when it is valid (its own model and the origin rule say so, read back from the
SQLite file); and the connection, unless the server closed it, serves the next request.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import os
import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from fastapi_lith.web.body import FORMS
from fastapi_lith.web.guard import media_type
from tests.support.inprocess import InProcessServer

MAX_BODY = 64 * 1024  # the counter's `max_body`, Lith's default
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, Path]]:
    db = tmp_path_factory.mktemp("fuzz") / "counter.db"
    with InProcessServer("examples.counter.app:app", env={"COUNTER_DB": str(db)}) as server:
        yield server, db


@pytest.fixture(scope="module")
def add_command() -> Any:
    """The counter's `Add`, for the oracle: validity is what its own model says."""
    with pytest.MonkeyPatch.context() as env:  # the module builds a Lith at import; nothing opens it
        env.setenv("COUNTER_DB", os.devnull)
        from examples.counter.app import Add
    return Add


def count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count FROM counter").fetchone()[0]


# -- raw HTTP/1.1 ---------------------------------------------------------------------------------


class Answer:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def closes(self) -> bool:
        return self.headers.get(b"connection", b"").lower() == b"close"


def read_answer(sock: socket.socket, *, head_only: bool = False) -> Answer:
    """One response: a reset or a silence fails the test (a timeout is no answer at all)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if head_only:
        return Answer(status, headers, b"")
    if headers.get(b"transfer-encoding") == b"chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "connection closed in a chunked body"
            rest += chunk
        return Answer(status, headers, rest)
    length = int(headers.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        rest += chunk
    return Answer(status, headers, rest[:length])


def request(port: int, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes, *, chunked: bool) -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1:%d" % port]
    lines += [name + b": " + value for name, value in headers]
    if method == "POST":
        lines.append(b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body))
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    if method == "POST":
        raw += (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n") if chunked else body
    return raw


def exchange(port: int, raw: bytes, *, head_only: bool = False) -> Answer:
    """Send `raw`, read its answer, then (unless the server closed) ask again on the same
    connection: a keep-alive connection a bad request broke fails here."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(raw)
        answer = read_answer(sock, head_only=head_only)
        assert answer.status < 500, (answer.status, answer.body[:500], raw[:500])
        if not answer.closes and not head_only:
            sock.sendall(b"GET /no-such-page HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_answer(sock).status == 404  # a whole answer: the connection still works
    return answer


# -- what to send ---------------------------------------------------------------------------------

TAB_CHARS = "abcXYZ019_-"
tabs = st.one_of(st.text(TAB_CHARS, min_size=1, max_size=64), st.text(max_size=70))
ints = st.one_of(st.integers(-3, 200), st.integers(), st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**30]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
valid_signals = st.fixed_dictionaries(
    {"tab": st.text(TAB_CHARS, min_size=1, max_size=64)},
    optional={"op": st.integers(0, 10**6), "n": st.integers(1, 100)},
).map(lambda s: json.dumps(s).encode())
signals = st.fixed_dictionaries(
    {"tab": tabs},
    optional={"op": st.one_of(ints, scalars), "n": st.one_of(ints, scalars, st.text("0123456789 ", max_size=4)), "x": json_values},
)


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(1, 3000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'{"tab":', b"}")]))
    inner = draw(st.sampled_from([b"", b"1", b'"t"']))
    return opener * depth + inner + closer * draw(st.integers(0, depth))


def form(values: dict[str, Any]) -> bytes:
    return "&".join(f"{quote(str(k))}={quote(str(v))}" for k, v in values.items()).encode()


def multipart(values: dict[str, Any], boundary: str) -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in values.items()]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(errors="surrogatepass")


bodies = st.one_of(
    signals.map(lambda s: json.dumps(s).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    deep(),
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode(errors="surrogatepass")),
    signals.map(form),
    st.tuples(signals, st.text("abcdef-'", min_size=1, max_size=20)).map(lambda a: multipart(a[0], a[1])),
    st.builds(lambda s, pad: json.dumps({**s, "pad": "x" * pad}).encode(), signals, st.integers(MAX_BODY - 100, MAX_BODY + 100)),
)
content_types = st.one_of(st.just(b"application/json"), st.one_of(
    st.none(),
    st.sampled_from([b"application/json", b"application/json; charset=utf-8", b"application/merge-patch+json",
                     b"application/x-www-form-urlencoded", b"multipart/form-data", b"multipart/form-data; boundary=abc",
                     b"multipart/form-data; boundary=", b"text/plain", b"application/", b"/", b";", b"application/json;;;="]),
    st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b),
))
token = st.text("abcdefghijklmnopqrstuvwxyz-ABC0123456789", min_size=1, max_size=20)
header_values = st.binary(max_size=60).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F))
extra_headers = st.one_of(st.just([]), st.lists(st.tuples(token.map(str.encode), header_values), max_size=4))
SAME_ORIGIN = [(b"Datastar-Request", b"true"), (b"Sec-Fetch-Site", b"same-origin")]
same_origin = st.sampled_from([
    [(b"Datastar-Request", b"true"), (b"Sec-Fetch-Site", b"same-origin")],
    [(b"Datastar-Request", b"true"), (b"Origin", b"http://127.0.0.1:{port}")],
    [(b"Datastar-Request", b"true"), (b"Origin", b"http://evil.example")],
    [(b"Datastar-Request", b"true"), (b"Sec-Fetch-Site", b"cross-site")],
    [(b"Datastar-Request", b"TRUE"), (b"Sec-Fetch-Site", b"same-origin")],
    [(b"Sec-Fetch-Site", b"same-origin")],
    [],
])
keys = st.one_of(st.none(), st.none(), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=8),
                 header_values)
queries = st.one_of(st.just(""), st.text(max_size=40).map(lambda t: "?" + quote(t, safe="=&,/{}")),
                    st.binary(max_size=30).map(lambda b: "?" + "".join(chr(c) for c in b if 0x21 <= c < 0x7F and c != 0x23)))


def read_form(content_type: bytes, body: bytes) -> dict[str, Any] | None:
    """A form's fields as a command route reads them: Starlette's `request.form()`, an empty
    field left out and a repeated one's last value kept; None for a form it refuses."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def read() -> dict[str, Any]:
        scope = {"type": "http", "method": "POST", "headers": [(b"content-type", content_type)]}
        async with Request(scope, receive).form() as form:
            return {k: [v for v in form.getlist(k) if v != ""][-1] for k in form if any(v != "" for v in form.getlist(k))}

    try:
        return asyncio.run(read())
    except MultiPartException:
        return None


def expected_valid(add: type, headers: list[tuple[bytes, bytes]], body: bytes, port: int) -> Any:
    """The command FastAPI would hand the writer, or None: the oracle, in the same steps."""
    first: dict[bytes, bytes] = {}
    for name, value in headers:
        first.setdefault(name.lower(), value)
    if len(body) > MAX_BODY or first.get(b"datastar-request") != b"true":
        return None
    site, origin = first.get(b"sec-fetch-site"), first.get(b"origin")
    if (site is not None and site != b"same-origin") or (site is None and origin != b"http://127.0.0.1:%d" % port):
        return None
    key = first.get(b"idempotency-key")
    if key is not None and not re.fullmatch(rb"[\x21-\x7e]{1,200}", key):
        return None
    content_type = first.get(b"content-type")
    if not body or content_type is None:
        return None
    if media_type(content_type.decode("latin-1")) in FORMS:
        fields = read_form(content_type, body)
        try:
            return None if fields is None else add.model_validate(fields)
        except ValidationError:
            return None
    message = email.message.Message()
    message["content-type"] = content_type.decode("latin-1")
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return None
    try:
        return add.model_validate(json.loads(body))
    except (ValueError, RecursionError, ValidationError):
        return None


@FUZZ
@given(body=bodies, content_type=content_types, origin=same_origin, key=keys, extra=extra_headers,
       query=queries, chunked=st.booleans(), sent_by_a_page=st.booleans(), signals=valid_signals,
       page_key=st.one_of(st.none(), token))
# A form a person could send: the route reads it (web/body.py), so the oracle must too.
@example(body=b"tab=0", content_type=b"application/x-www-form-urlencoded", origin=SAME_ORIGIN, key=None, extra=[],
         query="", chunked=False, sent_by_a_page=False, signals=b"{}", page_key=None)
def test_any_request_to_a_command_route(
    counter: tuple[InProcessServer, Path], add_command: type, body: bytes, content_type: bytes | None,
    origin: list[tuple[bytes, bytes]], key: Any, extra: list[tuple[bytes, bytes]], query: str, chunked: bool,
    sent_by_a_page: bool, signals: bytes, page_key: str | None,
) -> None:
    server, db = counter
    port = server.port
    if sent_by_a_page:  # half the requests as a page sends them: the oracle sees commands apply
        body, content_type, origin, key, extra = signals, b"application/json", SAME_ORIGIN, page_key, []
    headers = [(name, value.replace(b"{port}", str(port).encode())) for name, value in origin]
    if content_type is not None:
        headers.append((b"Content-Type", content_type))
    if key is not None:
        headers.append((b"Idempotency-Key", key.encode() if isinstance(key, str) else key))
    headers += [(name, value) for name, value in extra if name.lower() not in (b"content-length", b"transfer-encoding", b"host")]
    cmd = expected_valid(add_command, headers, body, port)
    idem = dict((n.lower(), v) for n, v in reversed(headers)).get(b"idempotency-key")
    repeat_key = (f"header:{idem.decode()}:1" if idem is not None else cmd.idempotency_key()) if cmd is not None else None
    before = count(db)
    answer = exchange(port, request(port, "POST", b"/add" + query.encode(), headers, body, chunked=chunked))
    event(f"command: {answer.status}")
    seen: set[str] = APPLIED
    if cmd is None:
        assert answer.status != 204 and 400 <= answer.status < 500, answer.status
        assert count(db) == before
        if answer.status in (403, 413, 422):  # the app's refusals (uvicorn's own 400 is plain text)
            assert answer.headers.get(b"content-type", b"").startswith(b"text/html"), answer.body[:300]
    else:
        assert answer.status == 204, (answer.status, answer.body[:300])
        repeated = repeat_key is not None and repeat_key in seen
        assert count(db) == before + (0 if repeated else cmd.n)
        if repeat_key is not None:
            seen.add(repeat_key)


APPLIED: set[str] = set()  # the idempotency keys already applied, across examples

views = st.one_of(
    st.sampled_from(["counter", "outcome/{tab}", "counter,outcome/{tab}", "", ",", "nope", "outcome/", "outcome/{tab}/x"]),
    st.text(max_size=40),
    st.lists(st.sampled_from(["counter", "outcome/", "outcome/a", "x/{y}", "%00", "9223372036854775808"]), max_size=5).map(",".join),
)


@FUZZ
@given(views=views, tab=tabs, accept=st.one_of(st.none(), header_values), extra=extra_headers,
       more=st.text(max_size=30), raw=st.booleans(), opened_by_a_page=st.booleans())
def test_any_request_to_the_stream_route(
    counter: tuple[InProcessServer, Path], views: str, tab: str, accept: bytes | None, extra: list[tuple[bytes, bytes]],
    more: str, raw: bool, opened_by_a_page: bool,
) -> None:
    server, _ = counter
    if opened_by_a_page:  # its views and tab as a page names them; the rest still arbitrary
        views, tab = "counter,outcome/{tab}", re.sub(r"[^A-Za-z0-9_-]", "", tab)[:64] or "t"
    query = f"views={views.format(tab=tab) if '{tab}' in views else views}&tab={tab}&{more}"
    target = ("/lith/stream?" + (query if raw and query.isascii() and query.isprintable() and " " not in query and "#" not in query
                                 else quote(query, safe="=&,/"))).encode()
    headers = [(b"Accept-Encoding", accept)] if accept is not None else []
    headers += [(name, value) for name, value in extra if name.lower() not in (b"content-length", b"transfer-encoding", b"host")]
    answer = exchange(server.port, request(server.port, "GET", target, headers, b"", chunked=False), head_only=True)
    event(f"stream: {answer.status}")
    assert answer.status in (200, 400, 404, 406, 422), answer.status


@pytest.fixture(scope="module")
def forms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, Path]]:
    db = tmp_path_factory.mktemp("fuzz-forms") / "input.db"
    with InProcessServer("inputapp:app", env={"INPUT_DB": str(db)}) as server:
        yield server, db


def written(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT (SELECT count(*) FROM note) + (SELECT count(*) FROM upload)").fetchone()[0]


form_fields = st.dictionaries(st.sampled_from(["tab", "op", "text", "title", "file", "x"]),
                              st.one_of(st.text(TAB_CHARS, min_size=1, max_size=10), st.text(max_size=30)), max_size=5)


@st.composite
def form_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A form's body and content type: urlencoded, multipart (with files, cut or malformed)."""
    page = st.fixed_dictionaries({name: st.text(TAB_CHARS, min_size=1, max_size=20) for name in ("tab", "text", "title")})
    fields = draw(st.one_of(form_fields, page.map(lambda f: {**f, "op": str(len(f["text"]))})))
    boundary = draw(st.text("abcXYZ0-'", min_size=1, max_size=30))
    kind = draw(st.sampled_from(["urlencoded", "multipart", "file", "garbage"]))
    if kind == "urlencoded":
        return form(fields), b"application/x-www-form-urlencoded"
    body = multipart(fields, boundary)
    if kind == "file":
        size = draw(st.sampled_from([0, 10, 5000, 70_000]))
        part = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.bin"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + b"\xff" * size + b"\r\n"
        body = body.replace(f"--{boundary}--".encode(), part + f"--{boundary}--".encode())
    if kind == "garbage":
        body = body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=50))
    declared = draw(st.sampled_from([boundary, "", "other", boundary + "x"])).encode(errors="surrogatepass")
    return body, b"multipart/form-data; boundary=" + declared


@FUZZ
@given(path=st.sampled_from([b"/notes/form", b"/upload", b"/notes"]), sent=form_bodies(), chunked=st.booleans())
def test_any_form_or_upload(forms: tuple[InProcessServer, Path], path: bytes, sent: tuple[bytes, bytes], chunked: bool) -> None:
    """Forms have no oracle as exact as the counter's: a write is answered 204, a refusal writes nothing."""
    server, db = forms
    body, content_type = sent
    before = written(db)
    answer = exchange(server.port, request(server.port, "POST", path, [*SAME_ORIGIN, (b"Content-Type", content_type)], body, chunked=chunked))
    event(f"form: {answer.status}")
    assert 200 <= answer.status < 500
    if answer.status != 204:
        assert written(db) == before, answer.status
        assert answer.headers.get(b"content-type", b"").startswith(b"text/html"), answer.body[:300]


def test_the_server_still_serves_after_the_fuzz(counter: tuple[InProcessServer, Path]) -> None:
    """Last in the module: a valid command still applies, and nothing was logged as a crash."""
    server, db = counter
    before = count(db)
    answer = exchange(server.port, request(server.port, "POST", b"/add", [
        (b"Datastar-Request", b"true"), (b"Sec-Fetch-Site", b"same-origin"), (b"Content-Type", b"application/json"),
    ], b'{"tab": "last", "n": 2}', chunked=False))
    assert answer.status == 204 and count(db) == before + 2
    assert "Traceback" not in server.output and "Exception in ASGI" not in server.output, server.output[-3000:]


def test_the_form_server_still_serves_after_the_fuzz(forms: tuple[InProcessServer, Path]) -> None:
    server, _ = forms
    assert "Traceback" not in server.output and "Exception in ASGI" not in server.output, server.output[-3000:]


@FUZZ
@given(body=st.one_of(bodies, st.text(max_size=200), st.dictionaries(st.text(max_size=5), json_values, max_size=4)),
       content_type=st.one_of(st.none(), content_types.map(lambda b: b.decode("latin-1") if b else None)))
def test_the_acting_tab_of_any_body(body: Any, content_type: str | None) -> None:
    """What the error handlers read a refusal's tab and op from: any bytes, any content type."""
    from fastapi_lith.web.guard import acting_tab

    tab, op = acting_tab(body, content_type)
    assert tab is None or re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tab)
    assert op is None or (type(op) is int and 0 <= op < 2**63)
