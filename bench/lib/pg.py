"""A PostgreSQL server for the PostgreSQL scenarios: `LITH_PG_URL`, or a throwaway cluster.

The cluster comes from Debian's tools (`initdb`, `pg_ctl`) in a temporary folder, listening on
a unix socket there only, with the server's durable defaults (fsync and synchronous_commit
on): benchmarks measure what a real server does. As root, the tools run as `postgres`.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit


def tool(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} not found: install Debian's postgresql, or set LITH_PG_URL")
    return path


class Postgres:
    """One server: `create_database()` gives a fresh database's URL, `postmaster` its pid."""

    def __init__(self) -> None:
        self.url = os.environ.get("LITH_PG_URL", "")
        self.dir = Path(tempfile.mkdtemp(prefix="lith-bench-pg-"))
        self.data = self.dir / "data"
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self.described = "LITH_PG_URL" if self.url else "a throwaway cluster, default durable settings, unix socket"

    def run(self, *args: str) -> None:
        kw: dict[str, object] = {}
        if self.user is not None:
            kw = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": [], "cwd": self.dir}
        done = subprocess.run(args, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
        if done.returncode:
            raise SystemExit(f"{Path(args[0]).name} failed: {done.stderr or done.stdout}")

    def __enter__(self) -> Postgres:
        if self.url:
            return self
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.run(tool("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8",
                 "--locale=C")
        options = f"-k {self.dir} -c listen_addresses='' -c max_connections=300 -c shared_buffers=128MB"
        self.run(tool("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")
        self.url = f"postgresql+psycopg://postgres@/postgres?host={self.dir}&port=5432"
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.data.exists():
            self.run(tool("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def postmaster(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def dsn(self, url: str | None = None) -> str:
        """A psycopg connection string for one of the server's databases."""
        return "postgresql://" + (url or self.url).split("://", 1)[1]

    def create_database(self) -> str:
        import psycopg

        name = f"bench_{secrets.token_hex(4)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return urlunsplit(urlsplit(self.url)._replace(path="/" + name))
