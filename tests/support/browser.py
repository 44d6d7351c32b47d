"""Helpers for browser tests: the Datastar client, Chromium, and real uvicorn servers.

The pytest fixtures that wrap these live in ``tests/conftest.py``; this module has
no pytest fixtures so that scripts (benchmarks, manual checks) can use it too.

* :func:`ensure_datastar_js` -- Datastar v1.0.1's self-contained ES module,
  extracted from the PyPI wheel ``starhtml==0.7.0`` into ``.cache/datastar/``
  (ignored by git, downloaded once per machine, never committed).
* :data:`DATASTAR_CDN_URL` -- the official CDN URL Datastar 1.0 pages load by
  default; :func:`route_datastar` makes a Playwright context answer it (and any
  other ``datastar*.js`` on that CDN) from the local file, and blocks every other
  non-loopback request so a page never waits on the network.
* :func:`find_chromium` / :data:`CHROMIUM_ARGS` -- Debian's Chromium.
* :class:`Server` -- ``python -m uvicorn module:app`` as a subprocess on a free
  port: start, wait until the port answers, stop (SIGTERM, then SIGKILL),
  restart on the same port, captured output; ``server="granian"`` serves it with
  granian instead, as the deploy unit's ``SERVER=granian`` does.
* :func:`alive` -- whether a process still runs (a zombie or a reaped one does not).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.lib.proc import listens
from fastapi_lith.web.layer import WebSettings
from tests.support import REPO, child_env

ARTIFACTS_DIR = REPO / "test-artifacts"

# --------------------------------------------------------------------------- Datastar

DATASTAR_VERSION = "1.0.1"
#: The URL Datastar 1.0 pages load by default (a ``<script type="module">``).
#: The official README writes the tag as ``@v1.0.x``; the official SDKs (Clojure,
#: the Zig/TS examples) write ``@1.0.1``: jsDelivr serves both, and the route below
#: answers both.
DATASTAR_CDN_URL = (
    f"https://cdn.jsdelivr.net/gh/starfederation/datastar@{DATASTAR_VERSION}/bundles/datastar.js"
)
#: Every Datastar bundle on the CDN, any version or form (``@1.0.1``, ``@v1.0.1``,
#: ``datastar.js``, ``datastar-core.js``, ``datastar-pro.js``), query string allowed.
DATASTAR_CDN_RE = re.compile(r"^https?://cdn\.jsdelivr\.net/.*/datastar[^/]*\.js(\?.*)?$")
#: Any http(s) request that does not go to a loopback address.
NON_LOOPBACK_RE = re.compile(
    r"^(?!https?://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?(/|$))https?://"
)

STARHTML_REQUIREMENT = "starhtml==0.7.0"
STARHTML_WHEEL_MEMBER = "starhtml/static/js/datastar-core.js"
DATASTAR_CACHE_DIR = REPO / ".cache" / "datastar"


def ensure_datastar_js(cache_dir: Path = DATASTAR_CACHE_DIR) -> Path:
    """Return the path of Datastar v1.0.1's ``datastar-core.js``, fetching it once.

    Downloads the ``starhtml==0.7.0`` wheel from PyPI with ``pip download`` (only
    if it is not cached yet), extracts ``starhtml/static/js/datastar-core.js`` with
    zipfile, and checks that it is Datastar v1.0.1. Safe to call from several
    processes at once (a file lock guards the cache).
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"datastar-{DATASTAR_VERSION}.js"
    if _is_datastar(target):
        return target
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_datastar(target):
            return target
        wheels = sorted(cache_dir.glob("starhtml-0.7.0-*.whl"))
        if not wheels:
            cmd = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.12", "--disable-pip-version-check", "--quiet",
                STARHTML_REQUIREMENT, "-d", str(cache_dir),
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            wheels = sorted(cache_dir.glob("starhtml-0.7.0-*.whl"))
            if proc.returncode != 0 or not wheels:
                raise RuntimeError(
                    f"could not download {STARHTML_REQUIREMENT} for the Datastar client:\n"
                    f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
                )
        with zipfile.ZipFile(wheels[-1]) as wheel:
            data = wheel.read(STARHTML_WHEEL_MEMBER)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        if not _is_datastar(tmp):
            head = data[:120].decode("utf-8", "replace")
            tmp.unlink()
            raise RuntimeError(f"{wheels[-1].name}:{STARHTML_WHEEL_MEMBER} is not Datastar "
                               f"v{DATASTAR_VERSION}; it starts with {head!r}")  # fmt: skip
        os.replace(tmp, target)
        return target


def _is_datastar(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(200)
    except OSError:
        return False
    return head.startswith(f"// Datastar v{DATASTAR_VERSION}".encode()) and path.stat().st_size > 10_000


#: Init script: Datastar dispatches ``datastar-ready`` on document once it has
#: scanned the page (in a timer after the module ran, so possibly after "load").
DATASTAR_READY_SCRIPT = (
    "document.addEventListener('datastar-ready', () => { window.__datastarReady = true }, {once: true})"
)


#: How long (ms) a page whose stream ended may take to reconnect, be refused and reload: its
#: stream's `retry:` is drawn from 1 s to `reconnect_within`, then the reload itself.
RECONNECT_AND_RELOAD_MS = 1000 * WebSettings.reconnect_within + 10_000


def wait_for_datastar(page: Any, timeout: float = 10_000) -> None:
    """Wait (sync API) until Datastar has scanned the page and bound its attributes.

    Needs the init script that :func:`route_datastar` installs. Do this before
    clicking an element whose ``data-on:click`` must already be bound.
    """
    page.wait_for_function("window.__datastarReady === true", timeout=timeout)


def route_datastar(context: Any, js_path: Path, *, block_external: bool = True) -> None:
    """Make a Playwright ``BrowserContext`` (sync API) serve Datastar locally.

    Requests to the Datastar CDN URL (any ``datastar*.js`` on cdn.jsdelivr.net) are
    answered with ``js_path``. With ``block_external`` every other request to a
    non-loopback host is aborted at once, so no page hangs on the (absent) network.
    The patterns are regexes that Playwright matches in the browser driver: loopback
    requests, such as SSE streams, never make a round trip through Python. Also adds
    :data:`DATASTAR_READY_SCRIPT`, for :func:`wait_for_datastar`.
    """
    body = Path(js_path).read_bytes()
    headers = {
        "content-type": "text/javascript; charset=utf-8",
        # module scripts from another origin are fetched in CORS mode
        "access-control-allow-origin": "*",
        "cache-control": "public, max-age=31536000, immutable",
    }

    def serve(route: Any) -> Any:
        return route.fulfill(status=200, headers=headers, body=body)

    def abort(route: Any) -> Any:
        return route.abort("internetdisconnected")

    # Playwright tries the most recently registered route first.
    if block_external:
        context.route(NON_LOOPBACK_RE, abort)
    context.route(DATASTAR_CDN_RE, serve)
    context.add_init_script(DATASTAR_READY_SCRIPT)


# --------------------------------------------------------------------------- Chromium

#: Arguments for Debian's Chromium: headless, no sandbox (root), and nothing that
#: phones home or waits on the network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
)
CHROMIUM_INSTALL_HINT = "Chromium not found: apt-get install -y chromium"


def find_chromium() -> str | None:
    """Path of the Chromium binary, or None.

    ``LITH_CHROMIUM`` overrides the lookup (a path; set it to e.g. ``/nonexistent``
    to see how the suite behaves on a machine without Chromium), else ``chromium``
    on PATH.
    """
    override = os.environ.get("LITH_CHROMIUM")
    if override:
        found = shutil.which(override)
        return found if found and os.access(found, os.X_OK) else None
    return shutil.which("chromium")


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


# --------------------------------------------------------------------------- servers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_answers(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether `pid` still runs: a zombie has exited, and so has a process reaped at any point
    of the look (`/proc/PID/stat` gone before the open, or ESRCH from a read of it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"  # the name in parentheses may hold ") " itself


_LIVE: weakref.WeakSet[Server] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:  # a safety net if a fixture's teardown never ran
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout=2.0)


try:  # Linux: a server gets SIGTERM if the test process dies without a teardown
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def _die_with_parent() -> None:  # runs in the child between fork and exec: no imports here
    if _prctl is not None:
        _prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class ServerError(RuntimeError):
    pass


class Server:
    """``python -m uvicorn APP --host HOST --port PORT`` as a subprocess, or with
    ``server="granian"``, ``python -m fastapi_lith serve APP --server granian --host HOST
    --port PORT``: granian with the deploy unit's settings.

    >>> server = Server("app:app", cwd=tmp_path, env={"LITH_DB": str(tmp_path / "t.db")})
    >>> server.start()            # returns once the port answers (bounded time)
    >>> server.url                # "http://127.0.0.1:PORT"
    >>> server.restart()          # stop, then start again on the same port
    >>> server.stop()             # SIGTERM, SIGKILL after ``stop_timeout`` s
    >>> server.output             # stdout+stderr of every run so far

    ``env`` is added to this process's environment (a value of None removes the
    variable). ``args`` go to uvicorn (or to ``serve``) as they are (e.g.
    ``["--timeout-graceful-shutdown", "1"]``). The port is chosen once and kept across restarts. Output goes to
    ``log_path`` (a temp file by default), each run headed by a ``=== start #N`` line.
    A server that the test process leaves behind by dying gets SIGTERM (Linux
    PR_SET_PDEATHSIG, when started from the main thread); an atexit hook stops the rest.
    """

    def __init__(
        self,
        app: str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        args: Sequence[str] = (),
        # Guards against a hang, never measures: a machine busy with other work can take many
        # seconds to start a Python process, or to end one.
        startup_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        log_path: str | os.PathLike[str] | None = None,
        server: str = "uvicorn",
    ) -> None:
        assert server in ("uvicorn", "granian"), server
        self.app = app
        self.server = server
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.env: dict[str, str | None] = dict(env or {})
        self.host = host
        self._port_fixed = port is not None
        self.port = port if port is not None else free_port(host)
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="lith-uvicorn-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._own_log = True
        else:
            self.log_path = Path(log_path)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.touch()
            self._own_log = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: True if the last stop() had to SIGKILL (the server ignored SIGTERM for
        #: ``stop_timeout`` seconds, e.g. an open stream blocked uvicorn's shutdown).
        self.killed = False
        #: Seconds the last stop() took.
        self.stop_seconds: float | None = None
        #: Exit code of the last run (None while running or before the first start).
        self.returncode: int | None = None

    # -- properties

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def stopped_cleanly(self) -> bool:
        """The last run ended on SIGTERM without a SIGKILL. uvicorn re-raises the
        signal after its graceful shutdown, so a clean stop exits with -SIGTERM;
        granian exits 0."""
        return self.returncode in (0, -signal.SIGTERM) and not self.killed

    @property
    def output(self) -> str:
        """Everything the server printed (stdout and stderr), all runs."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def command(self) -> list[str]:
        if self.server == "granian":
            return [
                sys.executable, "-m", "fastapi_lith", "serve", self.app, "--server", "granian",
                "--host", self.host, "--port", str(self.port), *self.args,
            ]  # fmt: skip
        return [
            sys.executable, "-m", "uvicorn", self.app,
            "--host", self.host, "--port", str(self.port), *self.args,
        ]  # fmt: skip

    # -- lifecycle

    def start(self) -> Server:
        """Start the server and wait until its port answers; returns self."""
        if self.running:
            raise ServerError(f"server already running (pid {self.pid})")
        for attempt in range(3):
            try:
                self._spawn_and_wait()
                self._port_fixed = True  # restarts keep this port
                return self
            except ServerError:
                # A port picked by free_port() can be taken by someone else before
                # uvicorn binds it: pick another, but only before the first success.
                if self._port_fixed or "address already in use" not in self._last_run_output().lower() or attempt == 2:
                    raise
                self.port = free_port(self.host)
        raise AssertionError("unreachable")

    def _spawn_and_wait(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        if self.env.get("PYTHONPATH", "") is not None:
            # The package of this checkout (in mutmut's copy, the mutated one), whatever the working
            # directory: not the checkout the virtualenv's editable install points at.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
        env = child_env(env)
        self.starts += 1
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"=== start #{self.starts}: {' '.join(cmd)} (cwd {self.cwd})\n".encode())
            log.flush()
            self._run_offset = log.tell()
            preexec = _die_with_parent if threading.current_thread() is threading.main_thread() else None
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec,
            )
        self.returncode = None
        _LIVE.add(self)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                self.returncode = code
                raise ServerError(
                    f"{self.server} {self.app} exited with {code} before its port answered; its output:\n"
                    f"{self._last_run_output()}"
                )
            # Ours only: another server on this port answers too, while ours fails to bind it.
            if port_answers(self.host, self.port) and listens(self.proc.pid, self.port):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"{self.server} {self.app} did not answer on {self.url} within {self.startup_timeout} s;"
                    f" its output:\n{self._last_run_output()}"
                )
            time.sleep(0.05)

    def _last_run_output(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(getattr(self, "_run_offset", 0))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait up to ``timeout`` (default ``stop_timeout``) s, then SIGKILL.

        Returns the exit code; a no-op if not running. Never leaves the process behind.
        """
        proc = self.proc
        if proc is None:
            return self.returncode
        timeout = self.stop_timeout if timeout is None else timeout
        t0 = time.monotonic()
        self.killed = False
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(10)
        self.stop_seconds = time.monotonic() - t0
        self.returncode = proc.returncode
        self.proc = None
        _LIVE.discard(self)
        return self.returncode

    def restart(self, *, env: Mapping[str, str | None] | None = None) -> Server:
        """Stop, then start again on the same port (``env`` updates the environment)."""
        self.stop()
        if env:
            self.env.update(env)
        return self.start()

    def close(self) -> None:
        """Stop and remove the log if it is a temp file of ours."""
        self.stop()
        if self._own_log:
            with contextlib.suppress(FileNotFoundError):
                self.log_path.unlink()

    def __enter__(self) -> Server:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<Server {self.server} {self.app} {self.url} {state}>"


@contextlib.contextmanager
def running_server(app: str, **kwargs: Any) -> Iterator[Server]:
    """``with running_server("app:app", cwd=...) as server:`` -- started and stopped."""
    server = Server(app, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.close()
