"""`Lith` over HTTP: a real uvicorn serving the counter example, a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from browser import Server

REPO = Path(__file__).resolve().parent.parent
SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    db = tmp_path_factory.mktemp("counter") / "counter.db"
    server = Server("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(db)})
    server.start()
    yield server, db
    server.close()


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
    assert "<strong>n</strong>: Input should be less than or equal to 100" in response.text
    assert "{" not in response.text  # not a JSON dump
    missing = httpx.post(f"{server.url}/add", content=b"not json", headers={**SAME_ORIGIN, "Content-Type": "application/json"})
    assert missing.status_code == 422 and missing.headers["content-type"].startswith("text/html")
    assert count(db) == before


def test_body_size_limit(counter: tuple[Any, Path]) -> None:
    server, db = counter
    before = count(db)
    big = {"tab": "t1", "n": 1, "padding": "x" * 100_000}
    response = httpx.post(f"{server.url}/add", json=big, headers=SAME_ORIGIN)
    assert response.status_code == 413
    assert count(db) == before


def test_html_routes_stay_out_of_openapi(counter: tuple[Any, Path]) -> None:
    server, _ = counter
    assert httpx.get(f"{server.url}/openapi.json").json()["paths"] == {}


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
    from fastapi_lith.backup import verify

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
    from browser import Server

    server = Server("streamapp:app", cwd=REPO / "tests", env={"STREAM_DB": str(tmp_path / "b.db")})
    server.start()
    try:
        response = httpx.post(f"{server.url}/rename", json={"card": "seven", "title": "x"})
        assert response.status_code == 422
        assert response.headers["content-type"].startswith("text/html")
        assert '<div id="lith-error"' in response.text and "<strong>card</strong>" in response.text
    finally:
        server.close()
