"""A uvicorn server of the library under test, started as deploy/lith@.service starts one.

The flags are the unit's (uvloop, httptools, the graceful-shutdown timeout, no Server header,
deploy/logging.json); a load scenario may leave the access log out, and says so, since a line
per POST is CPU the figures would carry.

    with Server("examples.kanban.app:app", env={"KANBAN_DB": str(db)}, ready="/boards/1") as server:
        ... server.port, server.pid ...
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

STARTUP_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deploy_flags(workers: int = 1, *, access_log: bool = True, http: str = "httptools") -> list[str]:
    """The unit's ExecStart flags, as far as they apply on 127.0.0.1 (no proxy in front)."""
    flags = ["--loop", "uvloop", "--http", http, "--timeout-graceful-shutdown", "10", "--backlog", "16384",
             "--no-server-header", "--log-config", str(ROOT / "deploy" / "logging.json")]
    if workers > 1:
        flags += ["--workers", str(workers)]
    if not access_log:
        flags.append("--no-access-log")
    return flags


def answers(port: int, path: str) -> bool:
    """Whether `GET path` answers 200 (a raw request: no client library's start-up in the way)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


class Server:
    """`python -m uvicorn APP` on a free port, its output in a log file, stopped by SIGINT."""

    def __init__(self, app: str, *, env: dict[str, str] | None = None, workers: int = 1, access_log: bool = True,
                 http: str = "httptools", ready: str = "/", log: Path | None = None) -> None:
        self.app, self.workers, self.ready = app, workers, ready
        self.env = child_env(LIBRARY, **(env or {}))
        self.flags = deploy_flags(workers, access_log=access_log, http=http)
        self.port = free_port()
        self.log = log or Path(tempfile.mkstemp(prefix="lith-bench-server-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = float("nan")

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(self.port),
                *self.flags]

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the server is not started"
        return self.proc.pid

    def start(self) -> Server:
        began = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command, cwd=LIBRARY, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        while not answers(self.port, self.ready):
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() - began > STARTUP_SECONDS:
                self.stop()
                raise RuntimeError(f"uvicorn did not answer {self.ready} in {STARTUP_SECONDS:.0f} s:\n{self.tail()}")
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

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
