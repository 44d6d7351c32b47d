"""What a client can send a command route, over a real uvicorn and a real SQLite file: any
nesting of JSON, a `Rejected` a hand-written route lets through, forms and uploads, and a route
with its own body limit. Each refusal is HTML, reaches the acting tab, and writes nothing."""

from __future__ import annotations

import json
import re
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fastapi_lith import SettingError, form_fields
from fastapi_lith.web.guard import STORAGE_MESSAGE
from tests.support import REPO, SUPPORT, fill_disk
from tests.support.browser import Server
from tests.support.inprocess import InProcessServer

SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
JSON = {**SAME_ORIGIN, "Content-Type": "application/json"}
ERROR = '<div id="lith-error" role="alert" class="lith-error"><ul><li>'


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[InProcessServer, Path]]:
    """A server of the test's own. mutmut ties a mutant of a function the app runs as it is
    built (a route's body made by `lith.command`, the error handlers `install` makes) to the
    tests that build it: a server shared by a module's tests is built in its first test only,
    and the others would run no such mutant."""
    db = tmp_path / "input.db"
    with InProcessServer("inputapp:app", env={"INPUT_DB": str(db)}) as server:
        yield server, db


def rows(db: Path) -> tuple[int, int]:
    """How many notes and uploads the database holds."""
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT (SELECT count(*) FROM note), (SELECT count(*) FROM upload)").fetchone()


class TabStream:
    """A tab's identity-encoded stream, read on a thread, for the tests to wait on."""

    def __init__(self, server: Server | InProcessServer, tab: str, views: str = "outcome/{tab}") -> None:
        self.data = b""
        self._client = httpx.Client(timeout=None)
        url = f"{server.url}/lith/stream?views={views.format(tab=tab)}&tab={tab}"
        self._cm = self._client.stream("GET", url, headers={"Accept-Encoding": "identity"})
        response = self._cm.__enter__()
        assert response.status_code == 200
        self._thread = threading.Thread(target=self._read, args=(response,), daemon=True)
        self._thread.start()

    def _read(self, response: httpx.Response) -> None:
        try:
            for chunk in response.iter_raw():
                self.data += chunk
        except httpx.HTTPError:
            pass

    def wait_for(self, pattern: str) -> None:
        deadline = time.monotonic() + 10
        while not re.search(pattern, self.data.decode()):
            assert time.monotonic() < deadline, f"{pattern!r} never came: {self.data[-2000:]!r}"
            time.sleep(0.01)

    def told(self, says: str, op: int) -> None:
        """The tab got the error fragment saying `says`, and `done` set to `op`."""
        self.wait_for(f'datastar-patch-elements\ndata: elements <div id="lith-error"[^\n]*{re.escape(says)}')
        self.wait_for(rf'datastar-patch-signals\ndata: signals \{{"done": ?{op}\}}')

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self._client.close()


DEEP = 1000  # past Python's recursion limit: `json.loads` raises RecursionError


@pytest.mark.parametrize(
    "body",
    [
        b"[" * DEEP + b"]" * DEEP,
        b'{"":[' * (DEEP // 2) + b"]}" * (DEEP // 2),
        b'{"tab": "TAB", "op": 5, "text": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    ],
    ids=["list", "object", "a-field"],
)
def test_json_nested_past_the_recursion_limit_is_a_4xx_and_the_connection_stays(
    served: tuple[InProcessServer, Path], stream: TabStream, body: bytes
) -> None:
    server, db = served
    before = rows(db)
    with httpx.Client() as client:  # one keep-alive connection for both requests
        response = client.post(f"{server.url}/notes", content=body.replace(b"TAB", stream.tab.encode()), headers=JSON)  # type: ignore[attr-defined]
        assert response.status_code == 400, response.text
        assert response.text.startswith(ERROR) and "error parsing the body" in response.text
        again = client.post(f"{server.url}/notes", json={"tab": "t", "text": "after"}, headers=SAME_ORIGIN)
        assert again.status_code == 204
    if b"TAB" in body:  # the tab named at the top level is told, though the body nests too deep
        stream.told("error parsing the body", 5)
    assert rows(db) == (before[0] + 1, before[1])
    assert "Traceback" not in server.output


def test_a_refusal_names_each_field_as_the_page_does_and_tells_the_tab(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    before = rows(db)
    tab = stream.tab  # type: ignore[attr-defined]
    # A path and a query parameter by their names, an item of a list by its index.
    board = httpx.post(f"{server.url}/boards/first/notes?copies=9", json={"tab": tab, "op": 1, "text": "hi"},
                       headers=SAME_ORIGIN)  # fmt: skip
    assert board.status_code == 422
    assert board.text == (
        f"{ERROR}<strong>board</strong>: Input should be a valid integer, unable to parse string as an integer</li>"
        "<li><strong>copies</strong>: Input should be less than or equal to 3</li></ul></div>"
    )
    stream.told("copies", 1)
    tags = httpx.post(f"{server.url}/tags", json={"tab": tab, "op": 2, "tags": ["a", 7]}, headers=SAME_ORIGIN)
    assert tags.status_code == 422
    assert tags.text == f"{ERROR}<strong>tags.1</strong>: Input should be a valid string</li></ul></div>"
    stream.told("tags.1", 2)
    # JSON that is no object, and a body of another type: no fields to read.
    for content, kind in ((b'["a list"]', "application/json"), (b"text=hi", "text/plain")):
        refused = httpx.post(f"{server.url}/notes", content=content, headers={**SAME_ORIGIN, "Content-Type": kind})
        assert (refused.status_code, refused.text) == (
            422, f"{ERROR}Input should be a valid dictionary or object to extract fields from</li></ul></div>"
        ), kind
    # Not JSON at all: the tab named before the break is told.
    broken = httpx.post(f"{server.url}/notes", content=f'{{"tab": "{tab}", "op": 3, "text": '.encode(), headers=JSON)
    assert broken.status_code == 422 and broken.text.startswith(ERROR) and "JSON decode error" in broken.text
    stream.told("JSON decode error", 3)
    assert rows(db) == before
    assert "Traceback" not in server.output


def test_a_hand_written_route_answers_rejected_as_lith_command_does(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    before = rows(db)
    tab = stream.tab  # type: ignore[attr-defined]
    kept = httpx.post(f"{server.url}/notes/by-hand", json={"tab": tab, "op": 1, "text": "hi"}, headers=SAME_ORIGIN)
    assert (kept.status_code, kept.json()) == (200, 2)  # the route's own answer, with the result
    # A tab command: 204, the tab's outcome view says why (as `lith.command` answers it).
    refused = httpx.post(f"{server.url}/notes/by-hand", json={"tab": tab, "op": 2, "text": "no"}, headers=SAME_ORIGIN)
    assert refused.status_code == 204, refused.text
    stream.wait_for(r"Notes cannot say no\.")
    # Any other command: 409 with the message, as HTML, as `lith.command` answers it.
    purge = httpx.post(f"{server.url}/purge/by-hand", json={"confirm": False}, headers=SAME_ORIGIN)
    assert purge.status_code == 409
    assert purge.text == f"{ERROR}Say confirm to purge.</li></ul></div>"
    assert rows(db) == (before[0] + 1, before[1])
    assert "Traceback" not in server.output


def test_a_route_has_its_own_body_limit_and_the_others_keep_the_apps(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    before = rows(db)
    tab = stream.tab  # type: ignore[attr-defined]
    note = {"tab": tab, "op": 3, "text": "x" * 10_000}  # over the app's 4 KiB, under the route's 64 KiB
    small = httpx.post(f"{server.url}/notes", json=note, headers=SAME_ORIGIN)
    assert small.status_code == 413 and "at most 4096 bytes" in small.text
    stream.told("at most 4096 bytes", 3)
    assert httpx.post(f"{server.url}/big-notes", json={**note, "op": 4}, headers=SAME_ORIGIN).status_code == 204
    huge = httpx.post(f"{server.url}/big-notes", json={**note, "op": 5, "text": "x" * 100_000}, headers=SAME_ORIGIN)
    assert huge.status_code == 413 and "at most 65536 bytes" in huge.text
    stream.told("at most 65536 bytes", 5)
    assert rows(db) == (before[0] + 1, before[1])


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_is_taken_and_one_byte_more_is_refused(
    served: tuple[InProcessServer, Path], declared: bool
) -> None:
    server, db = served
    before = rows(db)

    def body(size: int) -> bytes:
        start = b'{"tab": "t", "op": 1, "text": "'
        return start + b"x" * (size - len(start) - 2) + b'"}'

    def post(content: bytes) -> httpx.Response:
        # A generator has no length: httpx sends it chunked, so only the count while reading bounds it.
        sent = content if declared else iter([content[:1000], content[1000:]])
        return httpx.post(f"{server.url}/notes", content=sent, headers=JSON)

    assert len(body(4096)) == 4096  # the app's max_body
    assert post(body(4096)).status_code == 204
    over = post(body(4097))
    assert over.status_code == 413
    assert over.text == f"{ERROR}The request is too large: at most 4096 bytes.</li></ul></div>"
    assert rows(db) == (before[0] + 1, before[1])


def test_a_full_disk_is_a_503_told_to_the_tab_and_freeing_it_takes_commands_again(
    app_server: Callable[..., InProcessServer], small_disk: Path
) -> None:
    """No command is at fault: each is answered 503 with the library's HTML and a retry delay,
    and the tab gets the fragment with `done`, as for a refused command (engine/test_storage.py
    has the same full disk under a child uvicorn; here mutmut sees the handler)."""
    db = small_disk / "input.db"
    server = app_server("inputapp:app", env={"INPUT_DB": str(db)})
    stream = TabStream(server, "full")
    try:
        stream.wait_for('data-signals:done="0"')

        def post(op: int) -> httpx.Response:
            note = {"tab": "full", "op": op, "text": f"note {op}"}
            return httpx.post(f"{server.url}/notes", json=note, headers=SAME_ORIGIN)

        assert post(1).status_code == 204
        filler = fill_disk(small_disk)
        # The WAL may still have room for a commit or two in its last page; then every one fails.
        codes = [post(op).status_code for op in range(2, 11)]
        assert 503 in codes and set(codes) <= {204, 503}, codes
        refused = post(11)
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "5")
        assert refused.text == f"{ERROR}{STORAGE_MESSAGE}</li></ul></div>"
        stream.told("cannot save changes right now", 11)
        filler.unlink()
        assert post(12).status_code == 204
    finally:
        stream.close()
    assert "Exception in ASGI application" not in server.output  # each answered; the writer logs the cause
    assert rows(db) == (2 + codes.count(204), 0)  # what answered 204 is there, what answered 503 is not


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_a_forms_refusals_reach_its_tab(served: tuple[InProcessServer, Path], stream: TabStream, encoding: str) -> None:
    server, db = served
    before = rows(db)
    tab = stream.tab  # type: ignore[attr-defined]

    def post(op: int, text: str) -> httpx.Response:
        fields = {"tab": tab, "op": str(op), "text": text}
        if encoding == "multipart":  # httpx sends fields as multipart once a file is there
            return httpx.post(f"{server.url}/notes/form", data=fields, files={"none": ("", b"")}, headers=SAME_ORIGIN)
        return httpx.post(f"{server.url}/notes/form", data=fields, headers=SAME_ORIGIN)

    assert post(1, "from a form").status_code == 204
    invalid = post(2, "")  # FastAPI reads an empty field as a missing one
    assert invalid.status_code == 422 and invalid.text.startswith(ERROR)
    assert "<strong>text</strong>: Field required" in invalid.text
    stream.told("Field required", 2)
    too_large = post(3, "x" * 10_000)
    assert too_large.status_code == 413
    stream.told("at most 4096 bytes", 3)
    assert rows(db) == (before[0] + 1, before[1])
    assert "Traceback" not in server.output


def upload(server: InProcessServer, tab: str, op: int, title: str, size: int) -> httpx.Response:
    fields = {"tab": tab, "op": str(op), "title": title}  # httpx sends the fields before the file
    files = {"file": ("photo.jpg", b"\xff" * size, "image/jpeg")}
    return httpx.post(f"{server.url}/upload", data=fields, files=files, headers=SAME_ORIGIN)


def test_an_upload_over_its_own_limit_or_with_a_bad_field_tells_its_tab(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    server, db = served
    before = rows(db)
    tab = stream.tab  # type: ignore[attr-defined]
    assert upload(server, tab, 1, "cat", 20_000).status_code == 204  # five times the app's limit
    stream.wait_for(r"Saved cat \(20000 bytes\)\.")
    bad = upload(server, tab, 2, "a title far too long for it", 10)
    assert bad.status_code == 422 and "<strong>title</strong>: String should have at most 20 characters" in bad.text
    stream.told("String should have at most 20 characters", 2)
    big = upload(server, tab, 3, "dog", 200_000)
    assert big.status_code == 413 and "at most 65536 bytes" in big.text
    stream.told("at most 65536 bytes", 3)
    assert rows(db) == (before[0], before[1] + 1)
    assert "Traceback" not in server.output


def test_a_datastar_request_to_a_route_without_the_writer_tells_its_tab_what_was_wrong(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    """Not a command route, but Datastar sent it: the refusal names the field and reaches the
    tab, with `done`, as a command route's does."""
    server, _ = served
    tab = stream.tab  # type: ignore[attr-defined]
    ok = httpx.post(f"{server.url}/notes/preview", json={"tab": tab, "op": 1, "text": "hi"}, headers=SAME_ORIGIN)
    assert ok.text == '<p id="preview">2 characters</p>'
    long = httpx.post(f"{server.url}/notes/preview", json={"tab": tab, "op": 2, "text": "x" * 30}, headers=SAME_ORIGIN)
    assert long.status_code == 422 and "<strong>text</strong>: String should have at most 20 characters" in long.text
    stream.told("String should have at most 20 characters", 2)


def test_a_refusal_without_an_op_tells_the_tab_and_leaves_its_done_signal_alone(
    served: tuple[InProcessServer, Path], stream: TabStream
) -> None:
    """No op, no click to end: `done` keeps the last click's number, so no button that waits on
    `$op != $done` turns pending."""
    server, _ = served
    tab = stream.tab  # type: ignore[attr-defined]
    unnumbered = httpx.post(f"{server.url}/notes", json={"tab": tab, "text": ""}, headers=SAME_ORIGIN)
    assert unnumbered.status_code == 422
    stream.wait_for('data: elements <div id="lith-error"[^\n]*String should have at least 1 character')
    numbered = httpx.post(f"{server.url}/notes", json={"tab": tab, "op": 7}, headers=SAME_ORIGIN)
    assert numbered.status_code == 422
    stream.told("Field required", 7)  # the stream's frames come in order: the first's were all sent
    assert stream.data.count(b"datastar-patch-signals") == 1, stream.data


def test_a_route_with_its_own_limit_and_no_writer_is_bounded_too(served: tuple[InProcessServer, Path]) -> None:
    """`MaxBody` alone guards a route: an upload the app keeps out of the database."""
    server, _ = served

    def avatar(size: int) -> httpx.Response:
        return httpx.post(f"{server.url}/avatar", files={"file": ("me.png", b"\x89" * size, "image/png")})

    assert avatar(500).json() == {"size": 500}
    big = avatar(2000)
    assert big.status_code == 413 and "at most 1024 bytes" in big.text


def test_a_declared_length_over_the_limit_is_refused_before_the_body(served: tuple[InProcessServer, Path]) -> None:
    """Without Datastar there is no tab to tell: 413 before a byte of the body is read."""
    server, _ = served
    headers = {"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json", "Content-Length": "100000"}
    with httpx.Client() as client:
        response = client.post(f"{server.url}/big-notes", content=json.dumps({"tab": "t"}).ljust(100_000).encode(), headers=headers)
    assert response.status_code == 413 and "at most 65536 bytes" in response.text
    # The same head with no body sent at all: a server that read before refusing would wait for it.
    head = ["POST /big-notes HTTP/1.1", f"Host: 127.0.0.1:{server.port}", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        assert select.select([sock], [], [], 10)[0], "no answer without the body"
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")


def test_an_upload_form_sends_its_tab_and_op_first_and_numbers_each_click(served: tuple[InProcessServer, Path]) -> None:
    server, _ = served
    page = httpx.get(server.url + "/").text
    tab = re.search(r'name="tab" value="([^"]+)"', page)
    assert tab is not None
    assert (
        '<form data-on:submit="$op = $op + 1; (el.form || el).elements.namedItem(&#39;op&#39;).value = $op; '
        "@post(&#34;/upload&#34;, {&#34;contentType&#34;: &#34;form&#34;, &#34;requestCancellation&#34;: &#34;disabled&#34;})"
        f'" enctype="multipart/form-data"><input type="hidden" name="tab" value="{tab[1]}">'
        '<input type="hidden" name="op" value="0"><input name="title"'
    ) in page
    with pytest.raises(SettingError, match=re.escape("bad tab id 'a tab': 1 to 64 letters, digits, '-' or '_'")):
        form_fields("a tab")


def test_an_upload_form_in_a_page_shows_each_refusal_and_stops_pending(
    new_page: Any, server_factory: Any, tmp_path: Path
) -> None:
    """Datastar posts the form as multipart (`contentType: 'form'`, the form's enctype); the tab
    and op travel as hidden fields, so a refusal reaches this page, not just the response."""
    from playwright.sync_api import expect

    from tests.support.browser import wait_for_datastar

    server = server_factory("inputapp:app", cwd=REPO, env={"INPUT_DB": str(tmp_path / "input.db"), "PYTHONPATH": str(SUPPORT)})
    page = new_page()
    page.goto(server.url + "/")
    wait_for_datastar(page)
    button = page.get_by_role("button", name="Upload")
    error = page.locator("#lith-error")

    def send(title: str, size: int) -> None:
        page.get_by_label("title").fill(title)
        page.get_by_label("file").set_input_files({"name": "photo.jpg", "mimeType": "image/jpeg", "buffer": b"\xff" * size})
        button.click()

    send("cat", 20_000)
    expect(page.locator("#uploads")).to_have_text("cat: 20000")
    expect(page.locator("#outcome .message")).to_have_text("Saved cat (20000 bytes).")
    expect(button).not_to_have_class(re.compile("pending"))
    send("a title far too long for it", 10)
    expect(error).to_contain_text("title: String should have at most 20 characters")
    expect(button).not_to_have_class(re.compile("pending"))
    send("dog", 200_000)
    expect(error).to_contain_text("The request is too large: at most 65536 bytes.")
    expect(button).not_to_have_class(re.compile("pending"))
    assert rows(tmp_path / "input.db") == (0, 1)


def test_a_routes_own_limit_is_checked_where_it_is_written() -> None:
    from fastapi_lith import MaxBody, SettingError

    assert MaxBody(1).limit == 1
    for bad in (0, -1, 1.5, "64k", True):
        with pytest.raises(SettingError, match="max_body must be an integer"):
            MaxBody(bad)  # type: ignore[arg-type]
