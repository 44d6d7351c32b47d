"""A uvicorn server of the library under test, started as deploy/lith@.service starts one.

The flags are the unit's (uvloop, httptools, the graceful-shutdown timeout, no Server header,
deploy/logging.json); a load scenario may leave the access log out, and says so, since a line
per POST is CPU the figures would carry.

    with Server("examples.kanban.app:app", env={"KANBAN_DB": str(db)}, ready="/boards/1") as server:
        ... server.port, server.pid ...

`held=True` serves as the unit does under deploy/lith@.socket: this process holds the listening
socket and each uvicorn it starts takes it as `--fd`, so a restart keeps the port listening and
a connect meanwhile waits in its queue instead of being refused.

`serving="granian"` serves the same app with granian (its ASGI interface, uvloop, the same
backlog, and no cap on the requests it runs at once: a stream is a request), for comparing the
serving stack; it takes no held socket (granian has no `--fd`).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .checkout import LIBRARY, ROOT, child_env
from .proc import listens

STARTUP_SECONDS = 60.0
BACKLOG = 16384  # the unit's --backlog and the socket unit's Backlog= (the kernel caps it at somaxconn)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deploy_flags(workers: int = 1, *, access_log: bool = True, http: str = "httptools") -> list[str]:
    """The unit's ExecStart flags, as far as they apply on 127.0.0.1 (no proxy in front)."""
    flags = ["--loop", "uvloop", "--http", http, "--timeout-graceful-shutdown", "10", "--backlog", str(BACKLOG),
             "--no-server-header", "--log-config", str(ROOT / "deploy" / "logging.json")]
    if workers > 1:
        flags += ["--workers", str(workers)]
    if not access_log:
        flags.append("--no-access-log")
    return flags


def granian_flags(workers: int = 1, *, access_log: bool = True) -> list[str]:
    """granian's nearest to the unit's flags. Its default backpressure (the requests one worker
    runs at once) is the backlog: a tab's stream is a request that never ends, so it is lifted."""
    flags = ["--interface", "asgi", "--http", "1", "--loop", "uvloop", "--backlog", str(BACKLOG),
             "--backpressure", "1000000", "--workers", str(workers), "--no-ws"]
    if access_log:
        flags.append("--access-log")
    return flags


SERVING = ("uvicorn", "granian")


def held_socket() -> socket.socket:
    """A listening socket on a free port of 127.0.0.1, as systemd opens one for a socket unit.

    uvicorn takes an `--fd` socket as AF_UNIX whatever it is, so uvloop serves it as a pipe and
    sets no TCP_NODELAY on what it accepts: set on the listening socket, every accepted one has
    it (as the unit's own TCP ports would by NoDelay=yes), and frames are not held by Nagle.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def answers(port: int, path: str) -> bool:
    """Whether `GET path` answers 200 (a raw request: no client library's start-up in the way)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


class Server:
    """`python -m uvicorn APP` on a free port, its output in a log file, stopped by SIGINT; with
    `held`, on a socket this process holds until `close()`."""

    def __init__(self, app: str, *, env: dict[str, str] | None = None, workers: int = 1, access_log: bool = True,
                 http: str = "httptools", ready: str = "/", log: Path | None = None, held: bool = False,
                 serving: str = "uvicorn") -> None:
        assert serving in SERVING, serving
        assert not (held and serving == "granian"), "granian takes no --fd: it binds its own port"
        self.app, self.workers, self.ready, self.serving = app, workers, ready, serving
        self.env = child_env(LIBRARY, **(env or {}))
        if serving == "granian":
            self.flags = granian_flags(workers, access_log=access_log)
        else:
            self.flags = deploy_flags(workers, access_log=access_log, http=http)
        self.socket = held_socket() if held else None
        self.port = free_port() if self.socket is None else int(self.socket.getsockname()[1])
        self.log = log or Path(tempfile.mkstemp(prefix="lith-bench-server-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = float("nan")

    @property
    def command(self) -> list[str]:
        if self.socket is not None:
            listen = ["--fd", str(self.socket.fileno())]
        else:
            listen = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", self.serving, self.app, *listen, *self.flags]

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the server is not started"
        return self.proc.pid

    def start(self) -> Server:
        if self.proc is not None and self.proc.poll() is None:
            # A second process would find the port taken and exit, while the readiness check below
            # heard the first: that one would outlive `close()`, which stops only the newest.
            raise RuntimeError(f"{self.serving} {self.app} is already running (pid {self.proc.pid})")
        began = time.monotonic()
        with self.log.open("ab") as out:
            fds = () if self.socket is None else (self.socket.fileno(),)
            self.proc = subprocess.Popen(self.command, cwd=LIBRARY, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         pass_fds=fds)
        # Its own answer: another server that took a free port before this one bound it answers too.
        while not (answers(self.port, self.ready) and listens(self.proc.pid, self.port)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.serving} exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() - began > STARTUP_SECONDS:
                self.stop()
                raise RuntimeError(f"{self.serving} did not answer {self.ready} in {STARTUP_SECONDS:.0f} s:\n"
                                   f"{self.tail()}")
            time.sleep(0.05)  # polling a port that is not yet open: nothing else to wait on
        self.started_in = time.monotonic() - began
        return self

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> None:
        """Stop the server (its own pid only) and wait for it; kill it if it will not stop."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop the server, and close the socket it was held on: the port refuses from now on."""
        self.stop()
        if self.socket is not None:
            self.socket.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
