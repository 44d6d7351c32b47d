"""`Accounts`: one SQLite file per account, each with its own writer and hub, in one process."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import subprocess
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import (
    Accounts,
    AccountUnavailable,
    AlreadyRunning,
    Command,
    Db,
    Lith,
    LithError,
    SettingError,
    Stream,
    Tx,
    UnknownAccount,
    ViewError,
    Writer,
)
from tests.support import CHILD_HANG_LIMIT, REPO, crash_after

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}


def write_migrations(folder: Path, *scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, sql in enumerate(scripts, 1):
        (folder / f"{i:04d}_step{i}.sql").write_text(sql)
    return folder


INIT = "CREATE TABLE counter (id INTEGER PRIMARY KEY, count INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);"


class Add(Command):
    n: int = 1

    def apply(self, tx: Tx) -> int:
        tx.execute("UPDATE counter SET count = count + :n WHERE id = 1", {"n": self.n})
        tx.touch("counter")
        return tx.scalar("SELECT count FROM counter")


class Gate(Command):
    """Holds its account's writer thread until the test opens the gate."""

    def apply(self, tx: Tx) -> None:
        assert GATE.wait(30), "the gate was never opened"
        tx.execute("UPDATE counter SET count = count + 100 WHERE id = 1")


GATE = threading.Event()


def make_app(folder: Path, migrations: Path, **kwargs: object) -> tuple[Accounts, FastAPI]:
    accounts = Accounts(folder, migrations=migrations, same_origin_only=False, **kwargs)

    @accounts.view("counter", topics={"counter"})
    def counter(db: Db) -> Markup:
        return Markup('<p id="counter">{}</p>').format(db.scalar("SELECT count FROM counter"))

    app = FastAPI(lifespan=accounts.lifespan)
    accounts.install(app)

    @accounts.router.post("/add")
    async def add(cmd: Add, writer: Writer = Depends(accounts.writer)) -> int:
        return await writer.do(cmd)

    @accounts.router.get("/count")
    async def count(conn: AsyncConnection = Depends(accounts.db)) -> int:
        return (await conn.execute(text("SELECT count FROM counter"))).scalar_one()

    @accounts.router.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return str(await accounts.render("counter")) + accounts.connect("counter", tab="t1")

    @accounts.router.get("/connect", response_class=HTMLResponse)
    async def connect(key: str) -> str:
        return accounts.connect(key, tab="t1")

    return accounts, app


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Accounts, httpx.AsyncClient]]:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "migrations", INIT))
    async with accounts.lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield accounts, client


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def eventually(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Wait for `condition`: an account closes in a task of its own, after it has left
    `open_names()`, so the test waits for what it means (`closed`) rather than the list."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_an_unknown_account_is_a_404_and_makes_no_file(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("acme")
    before = files(accounts.folder)
    for response in (
        await client.get("/a/ghost/"),
        await client.get("/a/ghost/lith/stream?views=counter&tab=t1"),
        await client.post("/a/ghost/add", json={"n": 1}),
        await client.get("/a/..%2Facme/"),
        await client.get("/a/ACME/"),
    ):
        assert response.status_code == 404, response.text
    assert (await client.get("/a/ghost/")).json() == {"detail": "no such account"}  # names nothing
    assert files(accounts.folder) == before
    with pytest.raises(UnknownAccount):
        await accounts.get("ghost")
    assert (await client.get("/a/acme/")).status_code == 200


async def test_connect_refuses_a_key_no_view_matches(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("acme")
    assert "/a/acme/lith/stream?views=counter&tab=t1" in (await client.get("/a/acme/connect?key=counter")).text
    with pytest.raises(ViewError, match="no view matches 'itemz'"):  # the page fails, not its stream
        await client.get("/a/acme/connect?key=itemz")


async def test_two_accounts_with_the_same_view_key_never_see_each_other(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("acme")
    await accounts.create("globex")
    page = await client.get("/a/acme/")
    assert '<p id="counter">0</p>' in page.text and "/a/acme/lith/stream?views=counter&tab=t1" in page.text
    a, b = [await accounts.get(name) for name in ("acme", "globex")]
    streams = {name: Stream("t1") for name in ("acme", "globex")}
    await a.lith.hub.open(streams["acme"], ["counter"])
    await b.lith.hub.open(streams["globex"], ["counter"])
    for stream in streams.values():
        assert [f.html for f in stream.take()] == ['<p id="counter">0</p>']
    assert (await client.post("/a/acme/add", json={"n": 5})).json() == 5
    assert [f.html for f in await streams["acme"].next(timeout=10)] == ['<p id="counter">5</p>']
    await b.lith.hub.tick()
    assert streams["globex"].take() == []
    assert '<p id="counter">0</p>' in (await client.get("/a/globex/")).text
    assert '<p id="counter">5</p>' in (await client.get("/a/acme/")).text
    assert [(await client.get(f"/a/{name}/count")).json() for name in ("acme", "globex")] == [5, 0]
    for name, stream in streams.items():
        (await accounts.get(name)).lith.hub.close(stream)


async def test_one_accounts_batch_never_holds_another_accounts_command(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("slow")
    await accounts.create("quick")
    GATE.clear()
    async with accounts.use("slow") as slow:
        held = asyncio.ensure_future(slow.writer.do(Gate()))
        await asyncio.sleep(0)  # the gated command is in slow's batch, its writer thread waiting
        # Were the writers shared, these would wait behind the gate and the deadline would pass.
        for n in range(1, 4):
            response = await asyncio.wait_for(client.post("/a/quick/add", json={"n": 1}), 20)
            assert response.json() == n
        assert not held.done()
        GATE.set()
        await asyncio.wait_for(held, 20)


async def test_an_account_idle_for_idle_after_closes_and_opens_again_on_use(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), idle_after=0.2)
    async with accounts.lifespan(app):
        await accounts.create("acme")
        account = await accounts.get("acme")
        stream = Stream("t1")
        await account.lith.hub.open(stream, ["counter"])
        await asyncio.sleep(0.6)
        assert accounts.open_names() == ["acme"]  # a stream is open: the account stays open
        account.lith.hub.close(stream)
        await eventually(lambda: accounts.closed, "the idle account to close")
        assert accounts.open_names() == [] and accounts.closed == 1
        async with accounts.use("acme") as lith:  # opens again, its data intact
            assert await lith.writer.do(Add(n=2)) == 2


async def test_a_failed_migration_refuses_that_account_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    migrations = write_migrations(tmp_path / "m", INIT)
    folder = tmp_path / "accounts"
    accounts, app = make_app(folder, migrations)
    async with accounts.lifespan(app):
        for name in ("good", "bad"):
            await accounts.create(name)
    with sqlite3.connect(folder / "bad.db") as conn:  # bad already has what step 2 creates
        conn.execute("CREATE TABLE tag (id INTEGER PRIMARY KEY)")
    write_migrations(migrations, INIT, "CREATE TABLE tag (id INTEGER PRIMARY KEY, name TEXT);")
    accounts, app = make_app(folder, migrations)
    async with accounts.lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(2):  # refused each time, with the reason
                refused = await client.get("/a/bad/")
                assert refused.status_code == 503
                assert "account 'bad' cannot open: migration 0002_step2.sql failed" in refused.json()["detail"]
                assert "table tag already exists" in refused.json()["detail"]
                assert (await client.post("/a/good/add", json={"n": 1})).status_code == 200
            with pytest.raises(AccountUnavailable):
                await accounts.get("bad")
            assert accounts.open_names() == ["good"]
    assert caplog.messages[-1].startswith("account bad cannot open: migration 0002_step2.sql failed")
    with sqlite3.connect(folder / "bad.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1  # left as it was
    with sqlite3.connect(folder / "good.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_a_thousand_accounts_in_turn_with_max_open_50_hold_resources_for_50(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), max_open=50, idle_after=0.5, readers=1)
    async with accounts.lifespan(app):
        fds, threads, rss = open_fds(), threading.active_count(), rss_kib()
        peak_fds = peak_threads = 0
        samples = []
        engines: weakref.WeakSet[Lith] = weakref.WeakSet()
        for i in range(1000):
            name = f"acct{i:04d}"
            await accounts.create(name)
            async with accounts.use(name) as lith:
                assert await lith.writer.do(Add(n=i)) == i
                assert await lith.render("counter") == f'<p id="counter">{i}</p>'
                engines.add(lith)
            del lith
            assert len(accounts.open_names()) <= 50
            peak_fds, peak_threads = max(peak_fds, open_fds()), max(peak_threads, threading.active_count())
            if i % 100 == 99:
                gc.collect()
                samples.append(rss_kib())
        assert accounts.opened >= 1000 and len(accounts.names()) == 1000
        # 50 open accounts: a writer, a reader or two and their threads each, whatever the total.
        assert peak_fds - fds < 50 * 8, (fds, peak_fds)
        assert peak_threads - threads < 50 * 4 + 8, (threads, peak_threads)
        # Memory reaches a plateau once 50 are open: the last 500 accounts add (almost) nothing.
        assert samples[-1] - samples[4] < 5 * 1024, samples
        assert samples[-1] - rss < 200 * 1024, (rss, samples)
        await eventually(lambda: accounts.closed >= accounts.opened, "the idle accounts to close")
        assert accounts.open_names() == [] and accounts.closed == accounts.opened
        gc.collect()  # every closed account's engine is gone
        assert len(engines) == 0
        assert open_fds() - fds < 8, (fds, open_fds())  # every close has let go of its files
    with sqlite3.connect(tmp_path / "accounts" / "acct0999.db") as conn:
        assert conn.execute("SELECT count FROM counter").fetchone()[0] == 999


async def test_a_closed_accounts_lith_is_freed_at_once_not_at_the_next_full_collection(tmp_path: Path) -> None:
    """No reference cycle holds an account's `Lith` (its engine, hub and writer with it): closed,
    it is freed by reference counting, so accounts opened and closed in turn do not pile up
    until CPython's next full collection, which may be far off in a process full of streams."""
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT))
    async with accounts.lifespan(app):
        await accounts.create("acct")
        gc.collect()
        gc.disable()
        try:
            for n in range(1, 4):  # opened again after each close: a fresh Lith each time
                async with accounts.use("acct") as lith:
                    assert await lith.writer.do(Add()) == n
                    assert await lith.render("counter") == f'<p id="counter">{n}</p>'
                    closed = weakref.ref(lith), weakref.ref(lith.engine), weakref.ref(lith.engine.hub)
                del lith
                await accounts.close("acct")
                assert [ref() for ref in closed] == [None, None, None]
        finally:
            gc.enable()


def test_accounts_settings_are_checked_when_built(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="readers must be an integer at least 1, not 0"):
        Accounts(tmp_path, readers=0)
    with pytest.raises(SettingError, match="max_open must be an integer at least 1"):
        Accounts(tmp_path, max_open=0)
    with pytest.raises(SettingError, match="prefix must hold '{account}'"):
        Accounts(tmp_path, prefix="/teams")
    with pytest.raises(SettingError, match="feed is set per account"):
        Accounts(tmp_path, feed=None)
    with pytest.raises(SettingError, match="^path is set per account by Accounts, not a setting$"):
        Accounts(tmp_path, path=tmp_path / "one.db")
    with pytest.raises(SettingError, match="^views is set per account by Accounts, not a setting$"):
        Accounts(tmp_path, views=None)
    with pytest.raises(SettingError, match="^idle_after must be a number at least 0.01, not 0$"):
        Accounts(tmp_path, idle_after=0)
    with pytest.raises(SettingError, match="did you mean 'synchronous'"):
        Accounts(tmp_path, synchronus="FULL")


# -- the command line: every account, or the ones named ----------------------------------------


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
async def test_the_command_line_backs_up_verifies_and_restores_every_account(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastapi_lith.cli import main

    folder, copies = tmp_path / "accounts", tmp_path / "copies"
    accounts, app = make_app(folder, write_migrations(tmp_path / "m", INIT))
    async with accounts.lifespan(app):
        for n, name in enumerate(("acme", "globex", "initech"), 1):
            await accounts.create(name)
            async with accounts.use(name) as lith:
                await lith.writer.do(Add(n=n))
        # Copies are taken while the app runs, each account in its own folder.
        assert main(["accounts", "backup", str(folder), str(copies)]) == 0
        assert "3 of 3 accounts done" in capsys.readouterr().out
        assert sorted(p.name for p in copies.iterdir()) == ["acme", "globex", "initech"]
        assert main(["accounts", "verify", str(copies)]) == 0
        assert "3 of 3 copies ok" in capsys.readouterr().out
        for name in ("acme", "globex", "initech"):
            async with accounts.use(name) as lith:
                await lith.writer.do(Add(n=100))
        # acme is open in the app: its restore is refused, the others (closed) go back.
        await accounts.close("globex")
        await accounts.close("initech")
        async with accounts.use("acme"):
            restored = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "fastapi_lith", "accounts", "restore", str(copies), str(folder)],
                capture_output=True, text=True, timeout=60,
            )
        assert restored.returncode == 1, restored
        assert "acme: FAILED" in restored.stderr and "is open in another process" in restored.stderr
        assert "2 of 3 accounts done, 1 failed" in restored.stdout
        assert main(["accounts", "list", str(folder), "--account", "globex"]) == 0
        assert capsys.readouterr().out.startswith("globex  version 1")
        assert main(["accounts", "verify", str(copies), "--account", "nobody"]) == 1
        assert "no account nobody" in capsys.readouterr().err
    counts = {}
    for name in ("acme", "globex", "initech"):
        with sqlite3.connect(folder / f"{name}.db") as conn:
            counts[name] = conn.execute("SELECT count FROM counter").fetchone()[0]
    assert counts == {"acme": 101, "globex": 2, "initech": 3}
    # Corrupt one copy: verify names it, and the others still pass.
    broken = sorted((copies / "globex").glob("globex-*.db"))[-1]
    broken.write_bytes(broken.read_bytes()[:100] + b"x" * 100 + broken.read_bytes()[200:])
    assert main(["accounts", "verify", str(copies)]) == 1
    assert "2 of 3 copies ok; failed: globex" in capsys.readouterr().out


def test_the_command_line_migrates_every_account(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi_lith.cli import main

    folder = tmp_path / "accounts"
    folder.mkdir()
    for name in ("a", "b"):
        sqlite3.connect(folder / f"{name}.db").close()
    migrations = write_migrations(tmp_path / "m", INIT)
    assert main(["accounts", "migrate", str(folder), "--migrations", str(migrations)]) == 0
    assert "a: migrated from version 0 to 1" in capsys.readouterr().out
    assert main(["accounts", "migrate", str(folder), "--migrations", str(migrations), "--account", "b"]) == 0
    assert "b: already at version 1" in capsys.readouterr().out


async def test_the_account_can_come_from_the_host_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.chdir(tmp_path)
    source = REPO / "docs" / "src" / "accounts" / "by_host.py"
    spec = importlib.util.spec_from_file_location("docs_accounts_by_host", source)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    accounts, app = module.accounts, module.app
    async with accounts.lifespan(app):
        await accounts.create("acme")
        async with accounts.use("acme") as lith:
            await lith.writer.do(Add(n=7))
        await accounts.create("globex")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport) as client:
            acme = await client.get("http://acme.example.com/")
            assert acme.text == '<h1>acme</h1><p id="counter">7</p>'
            globex = await client.get("http://globex.example.com:8000/")
            assert globex.text == '<h1>globex</h1><p id="counter">0</p>'
            assert (await client.get("http://initech.example.com/")).status_code == 404
            assert (await client.get("http://localhost/")).status_code == 404
            stream = await client.get("http://acme.example.com/lith/stream?views=nope&tab=t1")
            assert stream.status_code == 400  # the stream route is there, in acme
    assert sorted(p.name for p in (tmp_path / "accounts").glob("*.db")) == ["acme.db", "globex.db"]


async def test_each_account_replicates_to_its_own_replica(tmp_path: Path) -> None:
    from fastapi_lith.cli import main

    replicas = tmp_path / "replicas"
    accounts, app = make_app(
        tmp_path / "accounts", write_migrations(tmp_path / "m", INIT),
        replica=f"file://{replicas}/{{account}}", replica_check_every=None,
    )  # fmt: skip
    async with accounts.lifespan(app):
        for n, name in enumerate(("acme", "globex"), 1):
            await accounts.create(name)
            async with accounts.use(name) as lith:
                assert lith.replica is not None and lith.replica.url == f"file://{replicas}/{name}"
                await lith.writer.do(Add(n=n))
        await accounts.close("acme")  # closing an account uploads its last commit
        await accounts.close("globex")
    assert sorted(p.name for p in replicas.iterdir()) == ["acme", "globex"]
    for n, name in enumerate(("acme", "globex"), 1):
        restored = tmp_path / "restored" / f"{name}.db"
        restored.parent.mkdir(exist_ok=True)
        assert main(["replica", "restore", str(restored), f"file://{replicas}/{name}"]) == 0
        with sqlite3.connect(restored) as conn:
            assert conn.execute("SELECT count FROM counter").fetchone()[0] == n


async def test_each_account_backs_up_into_its_own_folder_of_the_backup_folder(tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    # As a deployment gives it, from the environment: a string.
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), backup_folder=str(copies))

    async def first_copy(name: str) -> None:
        await accounts.create(name)
        backups = (await accounts.get(name)).lith.backups
        assert backups is not None
        await eventually(lambda: backups.taken >= 1, f"{name}'s first copy")  # taken as the account opens

    async with accounts.lifespan(app):
        await first_copy("acme")
        await first_copy("globex")
    assert files(copies) == ["acme", "globex"]
    for name in ("acme", "globex"):
        (copy,) = (copies / name).glob("*.db")
        assert copy.name.startswith(f"{name}-")
        with sqlite3.connect(copy) as conn:
            assert conn.execute("SELECT count FROM counter").fetchone()[0] == 0


async def test_concurrent_requests_across_more_accounts_than_max_open_lose_nothing(tmp_path: Path) -> None:
    """Accounts open, get evicted and close idle under the requests: every command lands once."""
    accounts, app = make_app(
        tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), max_open=3, idle_after=0.05, readers=1
    )
    names = [f"t{i}" for i in range(10)]
    async with accounts.lifespan(app):
        for name in names:
            await accounts.create(name)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

            async def send(i: int) -> int:
                if i % 7 == 0:
                    await asyncio.sleep(0.06)  # now and then long enough for idle accounts to close
                return (await client.post(f"/a/{names[i % 10]}/add", json={"n": 1})).status_code

            statuses = await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(400))), 120)
        assert set(statuses) == {200}
        assert accounts.opened > 10  # accounts were closed and opened again meanwhile
        await eventually(lambda: accounts.closed >= accounts.opened, "the idle accounts to close")
        assert accounts.open_names() == [] and accounts.closed == accounts.opened
    for name in names:
        with sqlite3.connect(tmp_path / "accounts" / f"{name}.db") as conn:
            assert conn.execute("SELECT count FROM counter").fetchone()[0] == 40


async def test_max_open_never_closes_an_account_with_a_request_in_flight(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), max_open=1, idle_after=60)
    entered, go = asyncio.Event(), asyncio.Event()

    @accounts.router.post("/slow")
    async def slow(writer: Writer = Depends(accounts.writer)) -> int:
        entered.set()
        await go.wait()  # the request holds acme while another account opens
        return await writer.do(Add())

    async with accounts.lifespan(app):
        for name in ("acme", "globex", "initech"):
            await accounts.create(name)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            request = asyncio.create_task(client.post("/a/acme/slow"))
            try:
                await entered.wait()
                await accounts.get("globex")  # over the limit, but acme is in use: it stays
                assert accounts.open_names() == ["acme", "globex"]
                assert "2 accounts open, over max_open=1: the others are in use" in caplog.messages
            finally:
                go.set()
            response = await request
        assert (response.status_code, response.json()) == (200, 1)
        await accounts.get("initech")  # both idle now: both go
        assert accounts.open_names() == ["initech"]


async def test_a_refused_command_is_shown_to_its_tab_in_its_own_account(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("acme")
    await accounts.create("globex")
    streams = {name: Stream("t9") for name in ("acme", "globex")}  # the same tab id in both
    for name, stream in streams.items():
        await (await accounts.get(name)).lith.hub.open(stream, ["counter"])
        stream.take()
    refused = await client.post("/a/acme/add", json={"n": "many", "tab": "t9", "op": 3}, headers=SAME_ORIGIN)
    assert refused.status_code == 422 and refused.text.startswith('<div id="lith-error"')
    frames = streams["acme"].take()
    assert len(frames) == 1 and "<strong>n</strong>" in frames[0].html and frames[0].signals == {"done": 3}
    assert streams["globex"].take() == []
    too_big = await client.post("/a/acme/add", content=b'{"n": 1, "pad": "' + b"x" * 70_000 + b'"}', headers=SAME_ORIGIN)
    assert too_big.status_code == 413  # the body limit covers Depends(accounts.writer)
    for name, stream in streams.items():
        (await accounts.get(name)).lith.hub.close(stream)
    with sqlite3.connect(accounts.path("acme")) as conn:
        assert conn.execute("SELECT count FROM counter").fetchone()[0] == 0


async def test_max_open_never_closes_an_account_a_page_is_watching(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT), max_open=1, idle_after=60)
    async with accounts.lifespan(app):
        for name in ("acme", "globex", "initech"):
            await accounts.create(name)
        acme = await accounts.get("acme")
        stream = Stream("t1")
        await acme.lith.hub.open(stream, ["counter"])
        await accounts.get("globex")  # over the limit: acme has a stream, so it stays
        assert accounts.open_names() == ["acme", "globex"] and not stream.ended
        await accounts.get("initech")  # globex was idle: it goes, acme stays
        assert accounts.open_names() == ["acme", "initech"] and not stream.ended
        acme.lith.hub.close(stream)
        await accounts.get("globex")  # now acme is the least recently used idle one
        assert accounts.open_names() == ["globex"]


async def test_deleting_an_account_closes_it_and_removes_its_files_a_crashs_wal_with_them(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT))
    assert accounts.names() == []  # its folder is made when the accounts are served
    async with accounts.lifespan(app):
        for name in ("acme", "globex", "initech"):
            await accounts.create(name)
        (accounts.folder / "Notes.db").touch()  # no account's name
        (accounts.folder / "readme.txt").write_text("not an account")
        assert accounts.names() == ["acme", "globex", "initech"]
        assert accounts.exists("globex") and not accounts.exists("ghost")
        await accounts.get("acme")  # open
        await accounts.close("globex")
        crash_after(accounts.path("globex"), "UPDATE counter SET count = 9")  # a -wal and -shm left behind
        await accounts.close("initech")  # so that its own -wal is gone too
        await accounts.delete("acme")  # closed first
        await accounts.delete("globex")
        assert accounts.open_names() == [] and accounts.names() == ["initech"] and not accounts.exists("globex")
        assert files(accounts.folder) == ["Notes.db", "initech.db", "readme.txt"]
        # A new account of the same name starts from nothing: no old -wal is read into it.
        await accounts.create("globex")
        async with accounts.use("globex") as lith:
            assert await lith.writer.do(Add(n=1)) == 1


async def test_an_account_closed_while_it_is_still_opening_closes_once_it_has_opened(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT))
    async with accounts.lifespan(app):
        await accounts.create("acme")
        await accounts.close("acme")
        opening = asyncio.ensure_future(accounts.get("acme"))
        await asyncio.sleep(0)  # the get has begun the opening: migrate, start the writer and hub
        assert accounts.open_names() == ["acme"]
        await accounts.close("acme")  # say, a restore from the shell
        account = await opening
        # Closed after its opening, not under it: nothing of it is left running.
        assert not account.engine.running and accounts.open_names() == [] and accounts.closed == 2


async def test_one_account_over_max_open_closes_the_idle_one_and_warns_only_when_it_cannot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accounts, app = make_app(tmp_path / "nested" / "accounts", write_migrations(tmp_path / "m", INIT), max_open=1)
    with pytest.raises(LithError) as early:  # before the accounts are served, into a folder not made yet
        await accounts.create("acme")
    assert str(early.value) == "the app is not running: use accounts.lifespan"
    async with accounts.lifespan(app):
        for name in ("acme", "globex"):
            await accounts.create(name)
        with pytest.raises(UnknownAccount) as bad:
            await accounts.create("../escape")  # a name is never a path
        assert str(bad.value).startswith("'../escape' is not an account name: 1 to 63 of a-z, 0-9")
        with pytest.raises(UnknownAccount, match="^no account 'ghost'$"):
            await accounts.get("ghost")
        await accounts.get("acme")
        await accounts.get("globex")  # one over the limit: acme, idle, closes
        assert accounts.open_names() == ["globex"]
        closing = asyncio.ensure_future(accounts.close("globex"))
        await asyncio.sleep(0)
        reopening = asyncio.ensure_future(accounts.get("globex"))
        await asyncio.sleep(0)  # the get has begun: it waits for the close, never two writers on one file
        assert accounts.open_names() == [] and not closing.done()
        await reopening
        assert closing.done() and accounts.closed == 4 and accounts.open_names() == ["globex"]
    assert "over max_open" not in caplog.text
    assert files(tmp_path) == ["m", "nested"]


def needs_key(x_key: str | None = Header(None)) -> None:
    if x_key != "k1":
        raise HTTPException(403, "no key")


async def test_a_command_route_on_accounts_runs_its_dependencies_and_keeps_its_own_body_limit(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT))
    accounts.command("/keyed-add", Add, dependencies=[Depends(needs_key)], max_body=200)

    add_from_body = accounts.body(Add)

    @accounts.router.post("/add-body")
    async def add_body(cmd: Add = Depends(add_from_body), writer: Writer = Depends(accounts.writer)) -> int:
        return await writer.do(cmd)

    async with accounts.lifespan(app):
        await accounts.create("acme")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post("/a/acme/keyed-add", json={"n": 2})).status_code == 403
            keyed = await client.post("/a/acme/keyed-add", json={"n": 2}, headers={"X-Key": "k1"})
            assert keyed.status_code == 204, keyed.text
            padded = b'{"n": 1, "pad": "' + b"x" * 300 + b'"}'  # past this route's 200, well within the app's
            too_big = await client.post("/a/acme/keyed-add", content=padded, headers={"X-Key": "k1"})
            assert too_big.status_code == 413
            assert (await client.post("/a/acme/add-body", json={"n": 3})).json() == 5
            assert (await client.get("/a/acme/count")).json() == 5


async def test_a_pages_helpers_render_a_views_parameters_and_outside_a_request_say_where_they_work(tmp_path: Path) -> None:
    accounts, app = make_app(tmp_path / "accounts", write_migrations(tmp_path / "m", INIT))

    @accounts.view("times/{k}", topics={"counter"})
    def times(db: Db, k: int) -> Markup:
        return Markup('<p id="times-{}">{}</p>').format(k, k * db.scalar("SELECT count FROM counter"))

    @accounts.router.get("/times/{k}", response_class=HTMLResponse)
    async def page(k: int) -> str:
        return str(await accounts.render("times/{k}", k=k)) + accounts.url() + " " + accounts.url("/add")

    async with accounts.lifespan(app):
        await accounts.create("acme")
        with pytest.raises(LithError) as refused:  # say, a page's code called from a background job
            accounts.url("/add")
        assert str(refused.value) == (
            "no account in this context: the route must be on accounts.router (or take Depends(accounts.current))"
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await client.post("/a/acme/add", json={"n": 2})
            assert (await client.get("/a/acme/times/3")).text == '<p id="times-3">6</p>/a/acme /a/acme/add'


async def test_an_outcome_hint_shows_in_every_accounts_outcome_view_and_none_without_one(tmp_path: Path) -> None:
    migrations = write_migrations(tmp_path / "m", INIT)
    hinted, app = make_app(tmp_path / "hinted", migrations, outcome_hint="Nothing sent from this tab yet.")
    plain, plain_app = make_app(tmp_path / "plain", migrations)
    async with hinted.lifespan(app), plain.lifespan(plain_app):
        for name in ("acme", "globex"):
            await hinted.create(name)
            async with hinted.use(name) as lith:
                html = await lith.render("outcome/{tab}", tab="t1")
            assert '<p class="message hint" data-show="$done == 0">Nothing sent from this tab yet.</p>' in html
        await plain.create("acme")
        async with plain.use("acme") as lith:
            html = await lith.render("outcome/{tab}", tab="t1")
        assert 'id="lith-error"' in html and "hint" not in html


async def test_accounts_served_twice_is_refused_and_the_first_serves_on(served: tuple[Accounts, httpx.AsyncClient]) -> None:
    accounts, client = served
    await accounts.create("acme")
    with pytest.raises(AlreadyRunning, match="already being served"):
        async with accounts.lifespan():
            pass
    assert (await client.post("/a/acme/add", json={"n": 2})).json() == 2
