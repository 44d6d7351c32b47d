"""A throwaway PostgreSQL cluster for the tests, from Debian's `postgresql` (bench/lib/pg.py is bench's own).

`LITH_PG_URL` points at an existing server instead. Otherwise the cluster tools (`initdb`,
`pg_ctl`) create one in a temporary folder, listening on a unix socket in that folder only (no
TCP port to collide with anything), and it is stopped and removed at exit. Run as root, the
tools run as the `postgres` user, since the server refuses to run as root.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

# Settings for a throwaway cluster: nothing here has to survive a crash of the machine.
FAST = ("-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        " -c max_connections=300 -c shared_buffers=64MB")
# For benchmarks: the defaults that a real server runs with (durable commits).
DURABLE = "-c max_connections=300 -c shared_buffers=128MB"


class Unavailable(RuntimeError):
    """No PostgreSQL here: neither LITH_PG_URL nor Debian's cluster tools."""


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise Unavailable(f"{name} not found: install Debian's postgresql package")
    return path


class Cluster:
    """One server: `url(db)` for SQLAlchemy-style URLs, `dsn(db)` for psycopg."""

    def __init__(self, *, durable: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lith-pg-"))
        self.data = self.dir / "data"
        self.port = 5432
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise Unavailable("running as root and there is no postgres user") from exc
            os.chown(self.dir, self._user.pw_uid, self._user.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        options = f"-k {self.dir} -c listen_addresses='' -p {self.port} {DURABLE if durable else FAST}"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")
        atexit.register(self.stop)

    def _run(self, *args: str) -> None:
        if self._user is not None:
            # The server refuses root: the cluster tools run as postgres, as pg_ctlcluster does.
            pw = self._user
            result = subprocess.run(args, capture_output=True, text=True, user=pw.pw_uid,
                                    group=pw.pw_gid, extra_groups=[], cwd=self.dir)
        else:
            result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode:
            raise Unavailable(f"{Path(args[0]).name} failed: {result.stderr or result.stdout}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.dir} port={self.port} user=postgres dbname={dbname}"

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@/{dbname}?host={self.dir}&port={self.port}"

    def create_database(self, prefix: str = "lith") -> str:
        """A fresh empty database; returns its URL."""
        name = f"{prefix}_{secrets.token_hex(4)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def log_size(self) -> int:
        """Where the server's log ends now: `log_since` reads what comes after."""
        log = self.dir / "log"
        return log.stat().st_size if log.exists() else 0

    def log_since(self, offset: int) -> str:
        with open(self.dir / "log", "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except Unavailable:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class Existing:
    """A server named by LITH_PG_URL (postgresql://user:password@host/db): databases made on it."""

    def __init__(self, url: str) -> None:
        self.base = "postgresql://" + url.split("://", 1)[1]

    def _with_db(self, dbname: str) -> str:
        return urlunsplit(urlsplit(self.base)._replace(path="/" + dbname))

    def dsn(self, dbname: str = "postgres") -> str:
        return self._with_db(dbname)

    def create_database(self, prefix: str = "lith") -> str:
        name = f"{prefix}_{secrets.token_hex(4)}"
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return "postgresql+psycopg://" + self._with_db(name).split("://", 1)[1]

    def log_size(self) -> int:
        return 0

    def log_since(self, offset: int) -> str:
        return "(a server of LITH_PG_URL: its log is its own)"

    def stop(self) -> None:
        pass


def drop_database(server: Cluster | Existing, url: str) -> None:
    """Drop a database `create_database` made, ending its connections: a server named by
    LITH_PG_URL outlives every session, and thousands of databases left on it (a mutmut run
    makes some per mutant) slow it down, autovacuum visiting each."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_server: Cluster | Existing | None = None


def server() -> Cluster | Existing:
    """The session's server, started on first use."""
    global _server
    if _server is None:
        url = os.environ.get("LITH_PG_URL")
        _server = Existing(url) if url else Cluster()
    return _server
