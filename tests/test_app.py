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
    httpx.post(f"{server.url}/add", json={"tab": "t1", "n": 7}, headers=SAME_ORIGIN)
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
    async with lith.lifespan():
        await asyncio.sleep(3.5)  # copies at start-up, then every second
    copies = sorted((tmp_path / "backups").glob("*.db"))
    assert len(copies) == 2
    assert all(verify(c).ok for c in copies)
