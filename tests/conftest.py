"""Shared pytest fixtures.

Browser harness (helpers in tests/support/browser.py; see tests/support/test_browser.py for use):

* ``datastar_js`` (session) -- Path of Datastar v1.0.1's ``datastar-core.js``,
  fetched once per machine into ``.cache/datastar/``.
* ``browser`` -- Playwright (sync API) Chromium, Debian's binary, launched once per
  session (the fixture itself is function-scoped, see _pw_resume).
* ``new_page(**context_kwargs)`` (function) -- a Page in a fresh BrowserContext
  whose Datastar CDN URL is served from ``datastar_js`` and whose other
  non-loopback requests are aborted. ``page`` is ``new_page()``.
* ``server_factory(app, *, cwd, env=None, **kwargs)`` (function) -- a started
  ``browser.Server`` (uvicorn subprocess on a free port), stopped at teardown.
* ``app_server(app, *, env=None, **kwargs)`` (function) -- a started ``inprocess.InProcessServer``
  (uvicorn on a thread of the test's process, where mutmut sees the requests), stopped at
  teardown.
* ``small_disk`` (function) -- a 2 MiB tmpfs (``tests.support.fill_disk`` fills it), unmounted
  at the end; skipped where it cannot be mounted (it needs root, as CI has).
* ``granian`` (session) -- granian is installed: skipped without it, failed on CI.
* ``artifacts_dir`` (session) -- ``test-artifacts/`` at the repo root (ignored).

Tests that use ``browser``/``page``/``new_page``/``chromium_path`` are marked
``browser`` automatically (``-m "not browser"`` skips them). Browser tests are plain
``def`` tests: Playwright's sync API refuses to run inside a running asyncio loop.
Without Chromium they are skipped with a loud banner, or fail when ``CI=true``.
``LITH_CHROMIUM=/nonexistent`` simulates a machine without Chromium.
"""

from __future__ import annotations

import os
import re
import subprocess
from asyncio import events as asyncio_events
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import CHILD_HANG_LIMIT
from tests.support import browser as _bh
from tests.support.inprocess import InProcessServer, Served

# --------------------------------------------------------------------------- browser harness

_BROWSER_FIXTURES = {"browser", "page", "new_page", "chromium_path", "_playwright", "_browser_session"}
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()
_MISSING = pytest.StashKey[int]()  # browser tests collected while Chromium is missing


def pytest_configure(config: pytest.Config) -> None:
    # pyproject declares it too; registering it here keeps --strict-markers happy
    # if the suite is run with another config.
    config.addinivalue_line("markers", "browser: needs Debian's Chromium driven by Playwright")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chromium = _bh.find_chromium()
    for item in items:
        if _BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)
        if "server_factory" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("timeout"):
            # a uvicorn child imports the package (CHILD_HANG_LIMIT says why that matters)
            item.add_marker(pytest.mark.timeout(CHILD_HANG_LIMIT))
        if chromium is None and not _bh.is_ci() and item.get_closest_marker("browser"):
            # on CI the chromium_path fixture fails the test instead
            item.add_marker(pytest.mark.skip(reason=_bh.CHROMIUM_INSTALL_HINT))


def pytest_collection_finish(session: pytest.Session) -> None:
    if _bh.find_chromium() is None:
        session.config.stash[_MISSING] = sum(
            1 for item in session.items if item.get_closest_marker("browser")
        )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    missing = config.stash.get(_MISSING, 0)
    if not missing:
        return
    tr = terminalreporter
    what = "FAILED" if _bh.is_ci() else "SKIPPED"
    tr.write_sep("!", f"{missing} BROWSER TEST(S) {what}: CHROMIUM NOT FOUND", red=True, bold=True)
    tr.write_line(f"  {_bh.CHROMIUM_INSTALL_HINT}", red=True, bold=True)
    tr.write_line("  (looked for `chromium` on PATH, or the LITH_CHROMIUM override)", red=True)
    tr.write_sep("!", red=True, bold=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = request.node.stash.get(_REPORTS, {})
    return any(r.failed for r in reports.values())


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    _bh.ARTIFACTS_DIR.mkdir(exist_ok=True)
    return _bh.ARTIFACTS_DIR


@pytest.fixture(scope="session")
def datastar_js() -> Path:
    """Datastar v1.0.1's datastar-core.js (an ES module), cached in .cache/datastar/."""
    return _bh.ensure_datastar_js()


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _bh.find_chromium()
    if path is None:
        if _bh.is_ci():
            pytest.fail(f"{_bh.CHROMIUM_INSTALL_HINT} (CI=true: browser tests must run)", pytrace=False)
        pytest.skip(_bh.CHROMIUM_INSTALL_HINT)
    return path


# Playwright's sync API leaves its (paused) event loop marked as the running loop of
# the main thread between calls, and pytest-asyncio then refuses to run any later
# async test ("Runner.run() cannot be called from a running event loop"). So the
# browser fixtures mark it running only while a browser test runs, and clear it after.


def _pw_resume(pw: Any) -> None:
    current = asyncio_events._get_running_loop()
    if current is None:
        asyncio_events._set_running_loop(pw._loop)
    elif current is not pw._loop:
        raise RuntimeError("browser fixtures need a plain `def` test: Playwright's sync API "
                           "cannot run inside an asyncio event loop")  # fmt: skip


def _pw_suspend(pw: Any) -> None:
    if asyncio_events._get_running_loop() is pw._loop:
        asyncio_events._set_running_loop(None)


@pytest.fixture(scope="session")
def _playwright(chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    _pw_suspend(pw)
    try:
        yield pw
    finally:
        _pw_resume(pw)
        pw.stop()
        _pw_suspend(pw)


@pytest.fixture(scope="session")
def _browser_session(_playwright: Any, chromium_path: str) -> Iterator[Any]:
    _pw_resume(_playwright)
    try:
        b = _playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=list(_bh.CHROMIUM_ARGS)
        )
    finally:
        _pw_suspend(_playwright)
    try:
        yield b
    finally:
        _pw_resume(_playwright)
        try:
            b.close()
        finally:
            _pw_suspend(_playwright)


@pytest.fixture
def browser(_browser_session: Any, _playwright: Any) -> Iterator[Any]:
    """The session's headless Chromium (Playwright sync API, launched once).

    Function-scoped on purpose: it marks Playwright's loop as running for the test
    only, so async tests elsewhere in the suite still run (see _pw_resume).
    """
    _pw_resume(_playwright)
    try:
        yield _browser_session
    finally:
        _pw_suspend(_playwright)


@pytest.fixture
def new_page(
    browser: Any,
    datastar_js: Path,
    artifacts_dir: Path,
    server_factory: Callable[..., _bh.Server],  # so that pages close before servers stop
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Any]]:
    """``new_page(**context_kwargs) -> Page``: each page in a fresh context.

    The context serves the Datastar CDN URL from ``datastar_js`` and aborts other
    non-loopback requests. Each page gets ``page.console_log`` (a list of
    "type: text" strings, page errors included). If the test fails, every page is
    screenshot into test-artifacts/ and its console log is printed.
    """
    contexts: list[Any] = []
    pages: list[Any] = []

    def make(**context_kwargs: Any) -> Any:
        context = browser.new_context(**context_kwargs)
        context.set_default_timeout(10_000)
        _bh.route_datastar(context, datastar_js)
        contexts.append(context)
        page = context.new_page()
        log: list[str] = []
        page.on("console", lambda msg: log.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: log.append(f"pageerror: {err}"))
        page.console_log = log
        pages.append(page)
        return page

    yield make

    failed = _failed(request)
    for i, page in enumerate(pages):
        if failed and not page.is_closed():
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-150:]
            shot = artifacts_dir / f"FAILED-{name}-{i}.png"
            try:
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot of page {i} ({page.url}): {shot}")
            except Exception as exc:  # noqa: BLE001 - best effort
                print(f"no screenshot of page {i}: {exc}")
        if failed:
            print(f"console of page {i}:\n  " + "\n  ".join(page.console_log or ["(empty)"]))
    for context in contexts:
        try:
            context.close()
        except Exception:  # noqa: BLE001 - the browser may be gone already
            pass


@pytest.fixture
def page(new_page: Callable[..., Any]) -> Any:
    return new_page()


@pytest.fixture
def server_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., _bh.Server]]:
    """``server_factory(app, *, cwd, env=None, **kwargs) -> Server``, already started.

    ``app`` is "module:attr" importable from ``cwd``; kwargs go to ``browser.Server``
    (``port``, ``args``, ``startup_timeout``, ``stop_timeout``...). Output is logged
    under tmp_path and printed if the test fails. Every server is stopped at teardown
    (SIGTERM, then SIGKILL).
    """
    servers: list[_bh.Server] = []

    def make(app: str, *, cwd: Path | str, env: dict[str, str | None] | None = None, **kwargs: Any) -> _bh.Server:
        kwargs.setdefault("log_path", tmp_path / f"server-{len(servers)}.log")
        server = _bh.Server(app, cwd=cwd, env=env, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield make
    _close_all(servers, failed=_failed(request))


@pytest.fixture
def app_server(request: pytest.FixtureRequest) -> Iterator[Callable[..., InProcessServer]]:
    """``app_server(app, env=None) -> InProcessServer``, already started: the app on a real
    uvicorn on a thread of this process (tests/support/inprocess.py says why), stopped at
    teardown, its log printed if the test fails."""
    servers: list[InProcessServer] = []

    def make(app: str, *, env: dict[str, str | None] | None = None, **kwargs: Any) -> InProcessServer:
        server = InProcessServer(app, env=env, **kwargs)
        servers.append(server)
        return server.start()

    yield make
    _close_all(servers, failed=_failed(request))


def _close_all(servers: Sequence[Served], *, failed: bool) -> None:
    """Stop each server; print what it wrote when the test failed."""
    for server in servers:
        server.close()
        if failed:
            print(f"--- output of {server.app} at {server.url} ---\n{server.output}")


@pytest.fixture(scope="session")
def granian() -> None:
    """granian can serve here (`Server(..., server="granian")`): skipped without it, failed on
    CI, where it is installed as a dev dependency."""
    import importlib.util

    if importlib.util.find_spec("granian") is None:
        hint = "granian is not installed: pip install -e '.[dev]'"
        if _bh.is_ci():
            pytest.fail(f"{hint} (CI=true: the granian tests must run)", pytrace=False)
        pytest.skip(hint)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def pg_server() -> Any:
    """The session's PostgreSQL (tests/support/pgcluster.py): skipped without it, failed on CI."""
    from tests.support import pgcluster
    try:
        return pgcluster.server()
    except (pgcluster.Unavailable, ImportError) as exc:
        if _bh.is_ci():
            pytest.fail(f"PostgreSQL is required on CI: {exc}")
        pytest.skip(f"no PostgreSQL: {exc}")


@pytest.fixture
def pg_url(pg_server: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database on the session's server, as a `postgresql+psycopg://` URL,
    dropped after the test; what the server logged meanwhile is printed if the test fails."""
    from tests.support import pgcluster

    logged = pg_server.log_size()
    url = pg_server.create_database()
    yield url
    pgcluster.drop_database(pg_server, url)
    if _failed(request):
        print(f"--- the PostgreSQL server's log meanwhile ---\n{pg_server.log_since(logged)}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
