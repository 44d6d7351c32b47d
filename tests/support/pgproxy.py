"""A TCP proxy in front of the tests' PostgreSQL server, for the faults only a network shows."""

from __future__ import annotations

import socket
import threading
from urllib.parse import quote

import psycopg

from fastapi_lith.backends.postgres.db import dsn


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 (on `port`, or a free one) to the server that, once armed, passes
    the next statement `at` on (COMMIT: the batch committed, and the writer cannot know) and
    drops the client's connection before the server's answer reaches it; `times` such statements
    in turn, each on its own connection. Unarmed, it passes everything."""

    def __init__(self, url: str, port: int = 0, at: str = "COMMIT") -> None:
        self.at = at.encode() + b"\x00"  # a statement sent alone, without parameters
        self.info = psycopg.conninfo.conninfo_to_dict(dsn(url))
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.times = 1
        self.cut = threading.Event()
        self.cuts = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        user = quote(self.info.get("user") or "postgres", safe="")
        password = self.info.get("password")
        auth = f"{user}:{quote(password, safe='')}" if password else user
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{self.info['dbname']}?sslmode=disable"

    def _upstream(self) -> socket.socket:
        host, port = self.info.get("host") or "/tmp", int(self.info.get("port") or 5432)
        if host.startswith("/"):  # the test cluster listens on a unix socket only
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(f"{host}/.s.PGSQL.{port}")
            return sock
        return socket.create_connection((host, port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = self._upstream()
            self._sockets += [client, server]
            committing = threading.Event()
            threading.Thread(target=self._pump, args=(client, server, committing, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, committing, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, committing: threading.Event, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.armed.is_set() and self.at in data:
                    self.times -= 1
                    if not self.times:
                        self.armed.clear()
                    committing.set()
                elif not upstream and committing.is_set():  # the server's answer to it
                    self.cuts += 1
                    self.cut.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stop listening (the port refuses from here on) and drop every connection."""
        for sock in (self.listener, *self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it: close alone does not
            except OSError:
                pass
            sock.close()
