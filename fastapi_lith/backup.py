"""Backups: consistent copies of a live database, a timer that keeps the newest N, verify, restore.

```python
info = backup("app.db", "backups/")        # backups/app-20261129T214501Z.db (+ .sha256)
report = verify(info.path)                 # version, size, integrity, checksum
restore(info.path, "app.db")               # refuses while an app holds app.db open
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

import asyncio
import fcntl
import hashlib
import logging
import os
import re
import sqlite3
import struct
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from . import db

log = logging.getLogger("fastapi_lith.backup")

Method = Literal["backup", "vacuum"]
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
CHECKSUM_SUFFIX = ".sha256"

# SQLite's lock bytes (https://www.sqlite.org/fileformat.html#the_lock_byte_page and
# https://www.sqlite.org/walformat.html#the_wal_index_file_format): PENDING, RESERVED and the
# 510 SHARED bytes of the database file start at 0x40000000; the -shm file has 8 WAL locks at
# byte 120 and the dead-man switch (DMS) at byte 128, on which every connection that has the
# WAL index open holds a shared lock for as long as it is open.
_DB_LOCKS = (0x40000000, 512)
_SHM_LOCKS = (120, 9)


class BackupError(RuntimeError):
    """A copy could not be taken, checked or restored."""


class InUse(BackupError):
    """Another process holds the database open: it must be stopped first."""


def stamp(at: datetime | None = None) -> str:
    """`20261129T214501Z`: UTC, to the second, sorts as it reads."""
    return (at or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(STAMP_FORMAT)


def copy_name(db_path: str | Path, at: datetime | None = None) -> str:
    """The name of a timed copy of `db_path`: `app.db` -> `app-20261129T214501Z.db`."""
    return f"{Path(db_path).stem}-{stamp(at)}.db"


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


# --------------------------------------------------------------------------- taking a copy


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
            f"{self.path}: {_mb(self.size)}, version {self.version}, {check}, "
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
    tmp = _temp_beside(target, "backup")
    started = time.perf_counter()
    try:
        snapshot = _copy(source, tmp, method)
        with _open_ro(tmp) as conn:
            if check:
                problems = _check(conn, "quick_check")
                if problems != ["ok"]:
                    raise BackupError(
                        f"the copy of {source} fails quick_check, so the database itself is damaged: "
                        + "; ".join(problems[:5])
                    )
            version = db.user_version(conn)
        _fsync(tmp)
        digest = _sha256(tmp) if checksum else ""
        sidecar = checksum_path(target)
        sidecar.unlink(missing_ok=True)  # an old checksum must never stand beside a new copy
        os.replace(tmp, target)
        if checksum:
            _write_atomic(sidecar, f"{digest}  {target.name}\n".encode())
        _fsync_dir(target.parent)
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


def _copy(source: Path, tmp: Path, method: Method) -> float:
    """Copy one snapshot of `source` into the new file `tmp`; returns the snapshot's seconds."""
    if method == "backup":
        src = db.connect(source, read_only=True)
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
    raise ValueError(f"method must be 'backup' or 'vacuum', not {method!r}")


# --------------------------------------------------------------------------- verify


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
        with _open_ro(path) as conn:
            try:
                report.version = db.user_version(conn)
                report.page_size = conn.execute("PRAGMA page_size").fetchone()[0]
                report.pages = conn.execute("PRAGMA page_count").fetchone()[0]
                report.freelist = conn.execute("PRAGMA freelist_count").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                report.error = f"not a readable SQLite database: {exc}"
                return report
            try:
                report.integrity = _check(conn, f"integrity_check({int(max_errors)})")
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
    return "ok" if expected == _sha256(path) else "mismatch"


def _check(conn: sqlite3.Connection, pragma: str) -> list[str]:
    rows = [str(row[0]) for row in conn.execute(f"PRAGMA {pragma}")]
    return rows or ["ok"]


# --------------------------------------------------------------------------- restore


@dataclass(frozen=True)
class RestoreInfo:
    path: Path
    source: Path
    version: int
    size: int
    replaced: Path | None  # the database that was there before, kept beside it

    def summary(self) -> str:
        kept = f"; the previous database is kept as {self.replaced}" if self.replaced else ""
        return f"restored {self.path} from {self.source} (version {self.version}, {_mb(self.size)}){kept}"


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
    tmp = _temp_beside(target, "restore")
    try:
        _copy(source, tmp, "backup")
        with _open_ro(tmp) as conn:
            problems = _check(conn, "integrity_check(20)")
            version = db.user_version(conn)
        if problems != ["ok"] or version != report.version:
            raise BackupError(f"the copy written to {tmp} does not check out "
                              f"({'; '.join(problems[:5])}, version {version}); nothing was replaced")  # fmt: skip
        if target.exists():
            _copy_ownership(target, tmp)
        _fsync(tmp)
        replaced = None
        if target.exists() and keep_replaced:
            replaced = _unique(target.with_name(f"{target.name}.replaced-{stamp()}"))
            try:
                os.link(target, replaced)
            except OSError:
                _copy_file(target, replaced)
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
        _fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return RestoreInfo(path=target, source=source, version=version, size=target.stat().st_size, replaced=replaced)


def holders(db_path: str | Path) -> list[str]:
    """Who holds the database open, as readable strings; empty when nobody does.

    A running app holds POSIX read locks on SQLite's lock bytes: in WAL mode every open
    connection keeps a shared lock on the database file and on the `-shm` file's dead-man
    switch for as long as it is open, even while idle. (`BEGIN EXCLUSIVE` is no test: in WAL
    mode it takes only the write lock, which an idle app does not hold, so it succeeds
    against a running app.) `F_GETLK` asks the kernel whether a lock conflicts without taking
    one, and names the process. On Linux the open files in `/proc/*/fd` are checked too.

    POSIX locks belong to a process, and closing any descriptor of a file drops every lock the
    process holds on it: so this refuses to run in a process that has the database open itself.
    """
    target = Path(db_path)
    if not target.exists():
        return []
    paths = [target, Path(f"{target}-wal"), Path(f"{target}-shm")]
    real = {os.path.realpath(p) for p in paths}
    if _open_here(real):
        raise BackupError(f"this process has {target} open: run the check from another process")
    found: dict[int | None, list[str]] = {}
    for path, (start, length) in ((target, _DB_LOCKS), (paths[2], _SHM_LOCKS)):
        locked, pid = _lock_holder(path, start, length)
        if locked:
            found.setdefault(pid, []).append(f"a lock on {path.name}")
    for pid in _pids_with_open(real):
        found.setdefault(pid, []).append("an open file")
    return [f"{_describe(pid)} holds {', '.join(what)}" for pid, what in found.items()]


def _lock_holder(path: Path, start: int, length: int) -> tuple[bool, int | None]:
    """Whether another process holds a lock in the byte range, and its pid when known."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    try:
        if sys.platform == "darwin":  # struct flock: l_start, l_len, l_pid, l_type, l_whence
            query = struct.pack("qqihh", start, length, 0, fcntl.F_WRLCK, os.SEEK_SET)
            _, _, pid, kind, _ = struct.unpack("qqihh", fcntl.fcntl(fd, fcntl.F_GETLK, query))
        else:  # Linux: l_type, l_whence, l_start, l_len, l_pid
            # An OFD query also sees the locks of this process's own connections.
            cmd = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
            query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
            kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, cmd, query))
    finally:
        os.close(fd)
    if kind == fcntl.F_UNLCK:
        return False, None
    return True, (pid if pid > 0 else None)  # a pid of another PID namespace reads as 0


def _open_here(real: set[str]) -> bool:
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in real:
                return True
        except OSError:
            continue
    return False


def _pids_with_open(real: set[str]) -> list[int]:
    """Processes (that we may look at) with one of `real` open, from /proc (Linux only)."""
    me = os.getpid()
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in real:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def _describe(pid: int | None) -> str:
    if pid is None:
        return "a process"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    except OSError:
        cmd = ""
    return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")


# --------------------------------------------------------------------------- the timer


_STAMP_RE = r"\d{8}T\d{6}Z"


class Backups:
    """A copy of the database every `every` seconds into `folder`, the newest `keep` kept.

    ```python
    backups = Backups("app.db", "backups/", every=3600, keep=48)
    await backups.start()      # in the app's lifespan, after the database exists
    ...
    await backups.stop()       # waits for a copy in progress
    ```

    Copies are named by UTC time, `app-20261129T214501Z.db`, each with its `.sha256`. The
    first copy is due `every` seconds after the newest one already in the folder (at once if
    there is none or it is older), so restarts neither skip copies nor take extra ones.
    A failed copy is logged, deletes nothing, and is tried again after `min(every, 60)` s.
    Copies run on a thread of their own, on their own read connection.
    """

    def __init__(
        self,
        path: str | Path,
        folder: str | Path,
        *,
        every: float = 3600.0,
        keep: int = 24,
        method: Method = "backup",
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1 second, not {every}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.path = Path(path)
        self.folder = Path(folder)
        self.every = float(every)
        self.keep = keep
        self.method = method
        self.last: BackupInfo | None = None
        self.taken = 0
        self.failures = 0
        self._pattern = re.compile(rf"^{re.escape(self.path.stem)}-({_STAMP_RE})\.db$")
        self._task: asyncio.Task[None] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: Future[BackupInfo] | None = None
        self._started_at: float | None = None  # when this process last started a copy
        self._lead_fd: int | None = None  # the timer lock: held by the one process that copies

    def copies(self) -> list[Path]:
        """The timed copies in the folder, oldest first."""
        if not self.folder.is_dir():
            return []
        named = [(m.group(1), p) for p in self.folder.iterdir() if (m := self._pattern.match(p.name))]
        return [p for _, p in sorted(named)]

    def next_due(self, now: float | None = None) -> float:
        """The time (`time.time()`) the next copy is due: `every` after the newest copy."""
        now = time.time() if now is None else now
        copies = self.copies()
        if not copies:
            return now
        newest = self._pattern.match(copies[-1].name).group(1)  # type: ignore[union-attr]
        taken = datetime.strptime(newest, STAMP_FORMAT).replace(tzinfo=timezone.utc).timestamp()
        if self._started_at is not None:  # names keep whole seconds; this process knows better
            taken = max(taken, self._started_at)
        return min(taken + self.every, now + self.every)

    def take_now(self) -> BackupInfo:
        """Take one copy and prune, blocking (the timer runs this on its thread)."""
        self._started_at = time.time()
        self.folder.mkdir(parents=True, exist_ok=True)
        info = backup(self.path, self.folder / copy_name(self.path), method=self.method)
        self.last = info
        self.taken += 1
        self.prune()
        return info

    async def take(self) -> BackupInfo:
        """Take one copy now, on the backup thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lith-backup")
        fut = self._pool.submit(self.take_now)
        self._inflight = fut
        return await asyncio.wrap_future(fut)

    def prune(self) -> list[Path]:
        """Delete all but the newest `keep` copies (and their checksums); returns the deleted."""
        copies = self.copies()
        gone = copies[: max(0, len(copies) - self.keep)]
        for path in gone:
            path.unlink(missing_ok=True)
            checksum_path(path).unlink(missing_ok=True)
        # Temporary files of copies that a crash interrupted, once clearly abandoned.
        for tmp in self.folder.glob(f".{self.path.stem}-*.tmp"):
            try:
                if time.time() - tmp.stat().st_mtime > max(3600.0, 2 * self.every):
                    tmp.unlink()
            except FileNotFoundError:
                pass
        return gone

    async def start(self) -> None:
        """Start the timer (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="lith-backups")

    async def stop(self) -> None:
        """Stop the timer; a copy in progress finishes first (it is not left half-written)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.done():
            try:
                await asyncio.wrap_future(inflight)
            except Exception:  # noqa: BLE001 - already logged by run()
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._lead_fd is not None:
            os.close(self._lead_fd)
            self._lead_fd = None

    def lead(self) -> bool:
        """Whether this process takes the copies: several processes of one app (`--workers N`)
        each run the timer, and only the holder of the folder's timer lock copies. The lock is
        an `flock`, freed when its process ends, kill -9 too; another process then takes over."""
        if self._lead_fd is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = self.folder / f".{self.path.stem}-timer.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._lead_fd = fd
        return True

    async def run(self) -> None:
        """The timer loop: copy when due, forever (cancel to stop)."""
        while not self.lead():  # another process of this app copies; take over if it ends
            await asyncio.sleep(min(self.every, 60.0))
        while True:
            delay = self.next_due() - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                info = await self.take()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                log.exception("backup of %s into %s failed", self.path, self.folder)
                await asyncio.sleep(min(self.every, 60.0))
            else:
                log.info("backup %s", info.summary())

    async def __aenter__(self) -> Backups:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# --------------------------------------------------------------------------- files


@contextmanager
def _open_ro(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection (`?mode=ro`): it can neither write nor create the file.

    A WAL-mode file with no `-wal` beside it (a plain copy of a stopped app's database) opens
    `immutable`, or SQLite would create `-wal` and `-shm` files beside it to read it.
    """
    path = Path(path).resolve()
    uri = "file:" + quote(str(path)) + "?mode=ro"
    if not Path(f"{path}-wal").exists() and _is_wal_file(path):
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
        yield conn
    finally:
        conn.close()


def _is_wal_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return header.startswith(b"SQLite format 3\0") and header[18:20] == b"\x02\x02"


def _unique(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`...: the first name that is free."""
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _temp_beside(target: Path, what: str) -> Path:
    """A fresh name in the target's folder (same file system, so the rename is atomic)."""
    return target.with_name(f".{target.stem}-{what}-{os.getpid()}-{time.monotonic_ns()}.tmp")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = _temp_beside(path, "write")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_file(src: Path, dst: Path) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(1 << 20):
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())


def _copy_ownership(src: Path, dst: Path) -> None:
    """Give the restored file the old one's mode and, when we may, its owner: a root shell
    restoring for a service user must not leave it a file the service cannot write."""
    st = src.stat()
    os.chmod(dst, st.st_mode & 0o7777)
    try:
        os.chown(dst, st.st_uid, st.st_gid)
    except PermissionError:
        pass


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size:,} bytes"

