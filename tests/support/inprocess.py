"""A helper app served by a real uvicorn on 127.0.0.1, on a thread of the test's own process.

`browser.Server` runs uvicorn as a child process, which is what a deploy runs, but mutmut learns
which tests call a function only in the test's process and runs a mutant only against those
tests (tests/MUTATION.md): a request path that only a child serves has no tests for it. Served
here, the same requests reach the same code over the same socket, and mutmut sees them.

The app's module is loaded afresh under a name of its own for each server, with `env` set while
it loads and starts (the helper apps read their settings from the environment as they are
imported), so two servers of one app in one test are two apps, as two processes would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest
import uvicorn

from fastapi_lith.engine.shutdown import end_all
from tests.support import SUPPORT
from tests.support.browser import Server, ServerError, free_port

_loaded = itertools.count()
# Seconds an idle connection stays open: longer than any test runs (see `start`).
KEEP_ALIVE = 600

_LOGGERS = ("", "uvicorn")


class InProcessServer:
    """``InProcessServer("inputapp:app", env={"INPUT_DB": ...})``: as `browser.Server`, a
    started server's `url`, `output` (what it logged, tracebacks included) and `close()`.
    `app_dir` is where a bare module name is found (tests/support by default)."""

    def __init__(
        self,
        app: str,
        *,
        env: Mapping[str, str | None] | None = None,
        app_dir: Path = SUPPORT,
        startup_timeout: float = 60.0,
        # Streams still open at `close()` are cut after this, as the deploy's unit does.
        graceful: int = 5,
    ) -> None:
        self.app = app
        self.env = dict(env or {})
        self.app_dir = app_dir
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.startup_timeout = startup_timeout
        self.graceful = graceful
        self.module: ModuleType | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log = _Collected()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def output(self) -> str:
        return self._log.text()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> InProcessServer:
        if self._server is not None:
            raise ServerError(f"{self.app} was started already")
        name, _, attr = self.app.partition(":")
        for logger in _LOGGERS:
            logging.getLogger(logger).addHandler(self._log)
        with _environment(self.env):
            self.module = load_module(name, self.app_dir)
            asgi = getattr(self.module, attr or "app")
            # A connection a test's client pooled is never closed idle under it: httpx sends on
            # a connection the server closed a moment before and fails the request ("Server
            # disconnected without sending a response"), which uvicorn's 5 s made happen once a
            # busy suite held a client's connections idle that long.
            config = uvicorn.Config(
                asgi, host=self.host, port=self.port, log_config=None, access_log=False,
                timeout_graceful_shutdown=self.graceful, timeout_keep_alive=KEEP_ALIVE,
            )  # fmt: skip
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._run, name=f"uvicorn {self.app}", daemon=True)
            self._thread.start()
            deadline = time.monotonic() + self.startup_timeout
            while not self._server.started:
                if not self._thread.is_alive():
                    self._unhook()
                    raise ServerError(f"{self.app} stopped before it served; it logged:\n{self.output}")
                if time.monotonic() > deadline:
                    self.close()
                    raise ServerError(f"{self.app} did not serve within {self.startup_timeout} s:\n{self.output}")
                time.sleep(0.01)
        return self

    def _run(self) -> None:
        assert self._server is not None
        try:
            with asyncio.Runner(loop_factory=self._server.config.get_loop_factory()) as runner:
                runner.run(self._serve(self._server))
        except BaseException:
            logging.getLogger("tests.inprocess").exception("%s stopped", self.app)

    async def _serve(self, server: uvicorn.Server) -> None:
        self._loop = asyncio.get_running_loop()
        await server.serve()

    def close(self) -> None:
        """Stop as SIGTERM would: the app's streams end, open responses drain, then the app's
        lifespan ends."""
        if self._server is not None and self._thread is not None:
            if self._loop is not None:
                end_all(self._loop)  # the signal relay's part (engine/shutdown.py): off the main thread, no signal
            self._server.should_exit = True
            self._thread.join(self.graceful + 30)
            assert not self._thread.is_alive(), f"{self.app} did not stop; it logged:\n{self.output}"
        self._unhook()

    def _unhook(self) -> None:
        for logger in _LOGGERS:
            logging.getLogger(logger).removeHandler(self._log)

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<InProcessServer {self.app} {self.url} {'running' if self.running else 'stopped'}>"


class _Collected(logging.Handler):
    """Every record any logger passes up to the root while the server runs, formatted, and
    uvicorn's own: a `uvicorn.Config` built with uvicorn's logging settings (as a test may build
    one) stops them at the `uvicorn` logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        seen = f"_collected_by_{id(self)}"  # a record can reach this handler on two loggers
        if not getattr(record, seen, False):
            setattr(record, seen, True)
            self._lines.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self._lines)


def load_module(name: str, app_dir: Path = SUPPORT) -> ModuleType:
    """A fresh copy of module `name`: a file of `app_dir` by its bare name (``inputapp``, with
    `app_dir` first on the path while it loads, as uvicorn's ``--app-dir`` puts it), anything
    else by its dotted one (``examples.counter.app``)."""
    path = app_dir / f"{name}.py"
    in_app_dir = path.exists()
    if in_app_dir:
        sys.path.insert(0, str(app_dir))
    else:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"no module {name}"
        path = Path(spec.origin)
    unique = f"_lith_served_{next(_loaded)}_{name.replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(unique, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module  # dataclasses and Pydantic look a module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        if in_app_dir:
            sys.path.remove(str(app_dir))
    return module


@contextlib.contextmanager
def _environment(env: Mapping[str, str | None]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            if value is None:
                patch.delenv(key, raising=False)
            else:
                patch.setenv(key, value)
        yield


Served = InProcessServer | Server
"""Either kind of server, for helpers that read only what both have (`url`, `output`)."""


def wait_for_log(server: Served, line: str, timeout: float = 10.0) -> None:
    """Wait until `server` has logged `line`: uvicorn logs a 500's traceback once it is sent."""
    deadline = time.monotonic() + timeout
    while line not in server.output:
        assert time.monotonic() < deadline, f"{line!r} was not logged:\n{server.output[-2000:]}"
        time.sleep(0.01)
