"""Check a copy: its schema version, size, integrity and checksum, read-only.

```python
report = verify("backups/app-20261129T214501Z.db")
report.ok          # what matters; report.lines() says it for a person
```

The two checks find different things. `PRAGMA integrity_check` walks every b-tree and index
(a damaged page, a broken index, a truncated file); it cannot see a changed byte inside a
row's data, because SQLite keeps no checksum of its pages. The SHA-256 in `NAME.sha256`
(written by `backup`) sees any byte that changed after the copy was taken.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..backends.sqlite import db
from . import files
from .files import checksum_path


@dataclass
class Report:
    """What `verify` found. `ok` is what matters; `lines()` says it for a person."""

    path: Path
    size: int = 0
    page_size: int = 0
    pages: int = 0
    freelist: int = 0
    version: int | None = None
    integrity: list[str] = field(default_factory=list)  # ["ok"] when sound
    checksum: Literal["ok", "mismatch", "missing", "skipped"] = "missing"
    error: str | None = None  # the file could not be read as a database at all

    @property
    def ok(self) -> bool:
        return self.error is None and self.integrity == ["ok"] and self.checksum != "mismatch"

    def problems(self) -> list[str]:
        out = []
        if self.error:
            out.append(self.error)
        if self.integrity and self.integrity != ["ok"]:
            out.append("integrity_check: " + "; ".join(self.integrity[:5]))
        if self.checksum == "mismatch":
            out.append(f"checksum mismatch: the file changed after the copy was taken "
                       f"({checksum_path(self.path).name})")  # fmt: skip
        return out

    def lines(self) -> list[str]:
        out = [str(self.path)]
        if self.error:
            out.append(f"  error      {self.error}")
        else:
            out.append(f"  version    {self.version}")
            out.append(f"  size       {self.size:,} bytes ({self.pages:,} pages of {self.page_size:,};"
                       f" {self.freelist:,} free)")  # fmt: skip
            if self.integrity == ["ok"]:
                out.append("  integrity  ok")
            else:
                out.append(f"  integrity  FAILED ({len(self.integrity)} problems)")
                out.extend(f"    {line}" for line in self.integrity[:20])
        checksum = {
            "ok": f"ok ({checksum_path(self.path).name})",
            "mismatch": f"MISMATCH: the file changed after the copy was taken ({checksum_path(self.path).name})",
            "missing": "none (no .sha256 file beside it: structure checked, bytes not)",
            "skipped": "not checked",
        }[self.checksum]
        out.append(f"  checksum   {checksum}")
        out.append("  verdict    " + ("ok" if self.ok else "BAD: do not restore this copy"))
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "ok": self.ok,
            "version": self.version,
            "size": self.size,
            "page_size": self.page_size,
            "pages": self.pages,
            "freelist": self.freelist,
            "integrity": self.integrity,
            "checksum": self.checksum,
            "error": self.error,
        }


def verify(path: str | Path, *, checksum: bool = True, max_errors: int = 100) -> Report:
    """Open a copy read-only and report its version, size, integrity and checksum.

    Never writes: the copy is opened with `?mode=ro`. The checksum is compared when a
    `NAME.sha256` file stands beside it (`backup` writes one).
    """
    path = Path(path)
    report = Report(path=path)
    if not path.is_file():
        report.error = "no such file"
        report.checksum = "skipped"
        return report
    report.size = path.stat().st_size
    if checksum:
        report.checksum = _compare_checksum(path)
    else:
        report.checksum = "skipped"
    try:
        with files.open_ro(path) as conn:
            try:
                report.version = db.user_version(conn)
                report.page_size = conn.execute("PRAGMA page_size").fetchone()[0]
                report.pages = conn.execute("PRAGMA page_count").fetchone()[0]
                report.freelist = conn.execute("PRAGMA freelist_count").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                report.error = f"not a readable SQLite database: {exc}"
                return report
            try:
                report.integrity = files.check(conn, f"integrity_check({int(max_errors)})")
            except sqlite3.DatabaseError as exc:  # damage bad enough to stop the check itself
                report.integrity = [str(exc)]
    except sqlite3.DatabaseError as exc:
        report.error = f"not a readable SQLite database: {exc}"
    return report


def _compare_checksum(path: Path) -> Literal["ok", "mismatch", "missing"]:
    sidecar = checksum_path(path)
    try:
        text = sidecar.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return "missing"
    expected = text[0].lower() if text else ""
    return "ok" if expected == files.sha256(path) else "mismatch"
