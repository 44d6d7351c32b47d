"""Serving an app as the deploy unit does: uvicorn, the default, or granian (`python -m fastapi_lith serve`).

    python -m fastapi_lith serve myapp.app:app                     # uvicorn on 127.0.0.1:8000
    python -m fastapi_lith serve myapp.app:app --server granian    # granian, the same settings
    python -m fastapi_lith serve myapp.app:app --fd 3 --workers 2  # on the socket systemd holds

One place for the settings `make run` and `deploy/lith@.service` serve with: uvloop, the
backlog of the socket unit, a bound on the graceful shutdown, the proxy's headers, no Server
header, a logging config. uvicorn gets them as its own command line; granian (the `granian`
extra) runs in this process with its nearest equivalents, and takes a held socket too, which
its command line cannot (docs/deploying.md, "Serving with granian").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .exceptions import SettingError
from .ops.metrics import ENV as METRICS_FOLDER

SERVERS = ("uvicorn", "granian")
BACKLOG = 16384
"""The socket unit's Backlog=: a server that listens on the held socket again with a smaller one
shrinks the queue a restart's reconnects wait in."""
GRACEFUL_SECONDS = 10
BACKPRESSURE = 1_000_000
"""granian's limit on the connections a worker serves at once. Its default, the backlog divided
by the workers, counts every open stream (a request that never ends): past it, a worker stops
accepting. The open-file limit (the unit's LimitNOFILE) is the bound instead."""


@dataclass(frozen=True)
class Serving:
    """What to serve and how: every field has `make run`'s value by default."""

    app: str
    server: str = "uvicorn"
    host: str = "127.0.0.1"
    port: int = 8000
    fd: int | None = None  # a listening socket this process was given, in place of host and port
    workers: int = 1
    backlog: int = BACKLOG
    graceful: int = GRACEFUL_SECONDS
    forwarded_allow_ips: str = "127.0.0.1"  # whose X-Forwarded-Proto and -For are believed
    log_config: Path | None = None  # a dictConfig JSON file (deploy/logging.json)

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise SettingError(f"server must be one of {', '.join(SERVERS)}, not {self.server!r}")
        if self.workers < 1:
            raise SettingError(f"workers must be 1 or more, not {self.workers}")
        if self.graceful < 1:  # granian would wait for its workers without a bound
            raise SettingError(f"the graceful shutdown's bound must be 1 s or more, not {self.graceful}")


def serve(serving: Serving) -> None:
    """Run the server until it is stopped. With several workers and no PROMETHEUS_MULTIPROC_DIR,
    a fresh folder for this run, removed after it: every worker writes its metrics there, so one
    scrape sees them all, and values of an earlier run (other pids) never mix in."""
    run = run_granian if serving.server == "granian" else run_uvicorn
    fresh = None
    if serving.workers > 1 and not os.environ.get(METRICS_FOLDER):
        fresh = os.environ[METRICS_FOLDER] = tempfile.mkdtemp(prefix="lith-metrics-")
        print(f"the {serving.workers} workers share their metrics in {fresh}", file=sys.stderr, flush=True)
    try:
        run(serving)
    finally:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)


# --------------------------------------------------------------------------- uvicorn


def uvicorn_args(serving: Serving) -> list[str]:
    """uvicorn's command line for `serving`: what the unit ran as `uvicorn ...` itself.

    httptools parses each request in C and uvloop runs the loop (both come with fastapi-lith,
    as uvicorn[standard]): named, a missing one fails at start instead of falling back to h11
    and asyncio.
    """
    s = serving
    listen = ["--fd", str(s.fd)] if s.fd is not None else ["--host", s.host, "--port", str(s.port)]
    logging = ["--log-config", str(s.log_config)] if s.log_config is not None else []
    return [s.app, *listen, "--workers", str(s.workers), "--loop", "uvloop", "--http", "httptools",
            "--timeout-graceful-shutdown", str(s.graceful), "--backlog", str(s.backlog),
            "--proxy-headers", "--forwarded-allow-ips", s.forwarded_allow_ips, "--no-server-header",
            *logging]  # fmt: skip


def run_uvicorn(serving: Serving) -> None:
    from uvicorn.main import main

    main.main(uvicorn_args(serving), prog_name="uvicorn", standalone_mode=False)


# --------------------------------------------------------------------------- granian


def run_granian(serving: Serving) -> None:
    """granian's ASGI interface (with the lifespan) over HTTP/1.1, which is what Caddy speaks to
    the app, with uvicorn's settings as far as granian has them:

    - `--timeout-graceful-shutdown` is granian's workers kill timeout: how long the main process
      waits for its workers after SIGTERM before it kills them;
    - a worker that dies is started again, as uvicorn's supervisor does; one that dies again at
      once (a release that cannot import or start) makes granian exit 1, for systemd to see;
    - the proxy's headers are read by uvicorn's own ProxyHeadersMiddleware around the app, as
      uvicorn's `--proxy-headers` does: granian has no such setting;
    - the logging config is granian's too: its loggers are `_granian` and `granian.access`;
    - no option removes its `server: granian` header.
    """
    try:
        from granian.constants import HTTPModes, Interfaces, Loops
        from granian.server import MPServer
    except ImportError as exc:
        raise SettingError(f"serving with granian needs it: pip install 'fastapi-lith[granian]' ({exc})") from exc
    server_class: type[Any] = MPServer if serving.fd is None else granian_on_fd(MPServer, serving.fd)
    dictconfig = None
    if serving.log_config is not None:
        try:
            dictconfig = json.loads(serving.log_config.read_text())
        except (OSError, ValueError) as exc:
            raise SettingError(f"the log config {serving.log_config} cannot be read as JSON: {exc}") from exc
    server = server_class(
        serving.app, address=serving.host, port=serving.port, interface=Interfaces.ASGI, workers=serving.workers,
        loop=Loops.uvloop, http=HTTPModes.http1, websockets=False, backlog=serving.backlog,
        backpressure=BACKPRESSURE, log_dictconfig=dictconfig, log_access=True,
        workers_kill_timeout=serving.graceful, respawn_failed_workers=True,
    )  # fmt: skip
    server.serve(target_loader=partial(behind_proxy, forwarded_allow_ips=serving.forwarded_allow_ips))


def behind_proxy(target: str, *, forwarded_allow_ips: str) -> Any:
    """The app `target` names, its scheme and client taken from the proxy's headers as uvicorn's
    `--proxy-headers` takes them: the same-origin check compares a page's Origin with that
    scheme. Imported from the working directory, as uvicorn's command line does."""
    from uvicorn.importer import import_from_string
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    if "" not in sys.path:
        sys.path.insert(0, "")
    return ProxyHeadersMiddleware(import_from_string(target), trusted_hosts=forwarded_allow_ips)


def granian_on_fd(base: type[Any], fd: int) -> type[Any]:
    """granian's server serving on the listening socket `fd`, which its command line has no
    option for (emmett-framework/granian#786): the state its own `--uds` leaves, built from the
    held socket instead of one it binds. That state is granian's own, not its API: the extra's
    version range is the one this was tested with."""
    from granian.net import SocketHolder  # type: ignore[attr-defined]  # granian's own, no API

    try:
        held = socket.socket(fileno=fd)
    except OSError as exc:
        raise SettingError(f"fd {fd} is not a socket this process was given: {exc}") from exc
    if not held.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        held.detach()
        raise SettingError(f"fd {fd} is not a listening socket")

    class OnFd(base):  # type: ignore[misc]
        def _init_shared_socket(self) -> None:
            held.set_inheritable(True)  # each worker serves on it; granian closes it at shutdown
            self._ssp = None
            self._shd = SocketHolder(fd, held.family == socket.AF_UNIX, self.backlog)  # type: ignore[call-arg]
            self._sfd = fd
            self._sso = held

        @property
        def _bind_addr_fmt(self) -> str:  # its "Listening at:" line
            name = held.getsockname()
            return f"fd {fd} ({name if isinstance(name, str) else ':'.join(map(str, name[:2]))})"

    return OnFd

