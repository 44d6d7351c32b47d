"""The files of copies: names, checksums, read-only opening, atomic writes, fsync.

Everything here is shared by taking a copy (`backup.py`), checking one (`verify.py`) and
putting one back (`restore.py`), so each of those reads as its steps alone.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from ..backends.sqlite import db

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
STAMP_RE = r"\d{8}T\d{6}Z"
CHECKSUM_SUFFIX = ".sha256"



def stamp(at: datetime | None = None) -> str:
    """`20261129T214501Z`: UTC, to the second, sorts as it reads."""
    return (at or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(STAMP_FORMAT)


def copy_name(db_path: str | Path, at: datetime | None = None) -> str:
    """The name of a timed copy of `db_path`: `app.db` -> `app-20261129T214501Z.db`."""
    return f"{Path(db_path).stem}-{stamp(at)}.db"


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def check(conn: sqlite3.Connection, pragma: str) -> list[str]:
    """The rows of `PRAGMA quick_check` / `integrity_check(N)`: `["ok"]` when sound."""
    rows = [str(row[0]) for row in conn.execute(f"PRAGMA {pragma}")]
    return rows or ["ok"]


@contextmanager
def open_ro(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection (`?mode=ro`): it can neither write nor create the file.

    A WAL-mode file with no `-wal` beside it (a plain copy of a stopped app's database) opens
    `immutable`, or SQLite would create `-wal` and `-shm` files beside it to read it.
    """
    path = Path(path).resolve()
    uri = "file:" + quote(str(path)) + "?mode=ro"
    if not Path(f"{path}-wal").exists() and is_wal_file(path):
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
        yield conn
    finally:
        conn.close()


def is_wal_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return header.startswith(b"SQLite format 3\0") and header[18:20] == b"\x02\x02"


def unique(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`...: the first name that is free."""
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def temp_beside(target: Path, what: str) -> Path:
    """A fresh name in the target's folder (same file system, so the rename is atomic)."""
    return target.with_name(f".{target.stem}-{what}-{os.getpid()}-{time.monotonic_ns()}.tmp")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = temp_beside(path, "write")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def copy_file(src: Path, dst: Path) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(1 << 20):
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())


def copy_ownership(src: Path, dst: Path) -> None:
    """Give the restored file the old one's mode and, when we may, its owner: a root shell
    restoring for a service user must not leave it a file the service cannot write."""
    st = src.stat()
    os.chmod(dst, st.st_mode & 0o7777)
    try:
        os.chown(dst, st.st_uid, st.st_gid)
    except PermissionError:
        pass


def mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size:,} bytes"

