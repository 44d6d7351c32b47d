"""Put a copy back in place of the database, refusing while any process holds it open.

```python
restore("backups/app-20261129T214501Z.db", "app.db")   # from a shell, the app stopped
```
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..backends.sqlite import db
from ..exceptions import BackupError, InUse
from . import files
from .backup import copy_snapshot
from .files import stamp
from .locks import holders
from .verify import verify


@dataclass(frozen=True)
class RestoreInfo:
    path: Path
    source: Path
    version: int
    size: int
    replaced: Path | None  # the database that was there before, kept beside it

    def summary(self) -> str:
        kept = f"; the previous database is kept as {self.replaced}" if self.replaced else ""
        return f"restored {self.path} from {self.source} (version {self.version}, {files.mb(self.size)}){kept}"


def restore(backup_path: str | Path, db_path: str | Path, *, keep_replaced: bool = True) -> RestoreInfo:
    """Put the copy `backup_path` in place of the database `db_path`.

    In order, and stopping at the first failure with nothing replaced: the copy must verify
    (integrity and, when present, checksum); no process may hold `db_path` open (see
    `holders`: stop the app first); the copy is written to a temporary file beside `db_path`,
    checked again and fsynced. Then the old database moves aside as
    `app.db.replaced-STAMP` (with its `-wal`, so it stays whole) unless `keep_replaced` is
    False, the stale `-shm` is removed, and the temporary file is renamed over `db_path`.

    Run it from a shell (`python -m fastapi_lith restore`), not from a process that has the
    database open: see `holders`.
    """
    source = Path(backup_path)
    target = Path(db_path)
    report = verify(source)
    if not report.ok:
        raise BackupError(f"{source} is not a sound copy, nothing was replaced: " + "; ".join(report.problems()))
    if target.exists() and target.resolve() == source.resolve():
        raise BackupError(f"{source} is the database itself")
    busy = holders(target)
    if busy:
        raise InUse(
            f"{target} is open in another process ({'; '.join(busy)}): stop the app first "
            f"(e.g. systemctl stop lith@NAME), then restore; nothing was replaced"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = files.temp_beside(target, "restore")
    try:
        copy_snapshot(source, tmp, "backup")
        try:
            with files.open_ro(tmp) as conn:
                problems = files.check(conn, "integrity_check(20)")
                version = db.user_version(conn)
            fault = None if problems == ["ok"] and version == report.version else (
                f"{'; '.join(problems[:5])}, version {version}")  # fmt: skip
        except sqlite3.DatabaseError as exc:  # read back as no database at all
            fault = str(exc)
        if fault is not None:
            raise BackupError(f"the copy written to {tmp} does not check out ({fault}); nothing was replaced")
        if target.exists():
            files.copy_ownership(target, tmp)
        files.fsync(tmp)
        replaced = None
        if target.exists() and keep_replaced:
            replaced = files.unique(target.with_name(f"{target.name}.replaced-{stamp()}"))
            try:
                os.link(target, replaced)
            except OSError:
                files.copy_file(target, replaced)
        # The old database's journals belong to it: beside the new file SQLite would replay them
        # into it. They go with the kept copy (which opens whole), or away.
        for suffix in ("-wal", "-journal"):
            old = Path(f"{target}{suffix}")
            if old.exists():
                if replaced is not None:
                    os.replace(old, f"{replaced}{suffix}")
                else:
                    old.unlink()
        Path(f"{target}-shm").unlink(missing_ok=True)
        os.replace(tmp, target)
        files.fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return RestoreInfo(path=target, source=source, version=version, size=target.stat().st_size, replaced=replaced)
