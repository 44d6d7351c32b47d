"""Take a consistent copy of a live database, on its own read connection.

```python
info = backup("app.db", "backups/")        # backups/app-20261129T214501Z.db (+ .sha256)
```

A copy is taken on its own read connection, never on the writer's: in WAL mode a reader sees
one committed state for as long as its transaction lasts while the writer goes on committing,
so the copy holds exactly the commands committed before it started and the writer does not
wait for it. The copy uses SQLite's online backup API in one step (one read transaction, so one
snapshot); `method="vacuum"` uses `VACUUM INTO` instead, which reads the same kind of snapshot
and writes a compacted file, at more CPU and a longer read transaction (see docs/backups.md
for the measurements).

Every copy is written to a temporary file beside its destination, checked (`PRAGMA
quick_check`), made a rollback-journal file (so it opens read-only without `-wal`/`-shm`
files), fsynced and renamed into place; a `NAME.sha256` file beside it (the format of
`sha256sum`) lets `verify` see any byte that changed later, which `PRAGMA integrity_check`
alone cannot: it checks the structure of the b-trees, not the bytes of the rows.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..backends.sqlite import db
from ..exceptions import BackupError, SettingError
from . import files
from .files import checksum_path, copy_name

Method = Literal["backup", "vacuum"]

@dataclass(frozen=True)
class BackupInfo:
    """What `backup` wrote."""

    path: Path
    size: int
    version: int
    sha256: str
    seconds: float  # the whole copy: snapshot, check, fsync, checksum
    snapshot_seconds: float  # how long the read transaction on the live database lasted
    method: Method
    checked: bool = True  # quick_check passed (False: not run)

    def summary(self) -> str:
        check = "quick_check ok" if self.checked else "not checked"
        return (
            f"{self.path}: {files.mb(self.size)}, version {self.version}, {check}, "
            f"{self.method} in {self.seconds:.2f} s (snapshot held {self.snapshot_seconds:.2f} s)"
        )


def backup(
    db_path: str | Path,
    dest: str | Path,
    *,
    method: Method = "backup",
    check: bool = True,
    checksum: bool = True,
) -> BackupInfo:
    """Copy the database `db_path` to `dest` (a file, or a folder to hold `app-STAMP.db`).

    Safe while the app runs: the copy reads one snapshot on its own connection, and holds
    every command committed before it started. `dest` is replaced atomically if it exists.
    Blocking: an app calls it on a worker thread (`Backups` does).
    """
    source = Path(db_path)
    if not source.is_file():
        raise BackupError(f"{source}: no such database")
    target = Path(dest)
    if target.is_dir() or str(dest).endswith(("/", os.sep)):
        target.mkdir(parents=True, exist_ok=True)
        target = target / copy_name(source)
    if target.exists() and target.resolve() == source.resolve():
        raise BackupError(f"{target} is the database itself")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = files.temp_beside(target, "backup")
    started = time.perf_counter()
    try:
        snapshot = copy_snapshot(source, tmp, method)
        with files.open_ro(tmp) as conn:
            if check:
                problems = files.check(conn, "quick_check")
                if problems != ["ok"]:
                    raise BackupError(
                        f"the copy of {source} fails quick_check, so the database itself is damaged: "
                        + "; ".join(problems[:5])
                    )
            version = db.user_version(conn)
        files.fsync(tmp)
        digest = files.sha256(tmp) if checksum else ""
        sidecar = checksum_path(target)
        sidecar.unlink(missing_ok=True)  # an old checksum must never stand beside a new copy
        os.replace(tmp, target)
        if checksum:
            files.write_atomic(sidecar, f"{digest}  {target.name}\n".encode())
        files.fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return BackupInfo(
        path=target,
        size=target.stat().st_size,
        version=version,
        sha256=digest,
        seconds=time.perf_counter() - started,
        snapshot_seconds=snapshot,
        method=method,
        checked=check,
    )


def copy_snapshot(source: Path, tmp: Path, method: Method) -> float:
    """Copy one snapshot of `source` into the new file `tmp`; returns the snapshot's seconds."""
    if method == "backup":
        src = db.open_sqlite(source, read_only=True)
        try:
            dst = sqlite3.connect(tmp, isolation_level=None)
            try:
                # The copy is written in one go into a file nobody else sees: no journal, no
                # syncs until the end; the fsync before the rename makes it durable.
                dst.execute("PRAGMA journal_mode = OFF")
                dst.execute("PRAGMA synchronous = OFF")
                t0 = time.perf_counter()
                src.backup(dst, pages=-1)  # one step: one read transaction, one snapshot
                held = time.perf_counter() - t0
                # Pages came from a WAL database; make the copy a rollback-journal file.
                dst.execute("PRAGMA journal_mode = DELETE")
            finally:
                dst.close()
        finally:
            src.close()
        return held
    if method == "vacuum":
        # VACUUM INTO writes, so it cannot run on a `query_only` connection; it reads only.
        src = sqlite3.connect(source, isolation_level=None)
        try:
            src.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
            t0 = time.perf_counter()
            src.execute("VACUUM INTO ?", (str(tmp),))
            return time.perf_counter() - t0
        finally:
            src.close()
    raise SettingError(f"method must be 'backup' or 'vacuum', not {method!r}")

