"""The replica check: restore the latest replica into a temporary file and compare it with the
live database, daily in the app and on demand from a shell (`replica verify`).

A replica that uploads without error can still be useless: files damaged in storage, a gap in
the chain of changes, a replication that stopped days ago. The only proof is a restore. The
check restores the latest state into a temporary folder beside the database, then:

* `PRAGMA integrity_check` on the restored file;
* its schema version (`user_version`) against the live one;
* the row count of every table (Litestream's own `_litestream_*` tables left out) against
  the live database's.

The replica trails the live database by up to one sync interval, so the live side is read
several times: first, then while waiting one lag window (twice the sync interval, so that
the replica holds at least the first reading's state), during the restore and after it. A
restored count must lie between the smallest and the largest live count seen; a replica that
stopped following falls below that window and fails. The result is recorded beside the
database (`.NAME-replica-check.json`), so the shell's `replica status` shows it too; a failure
is logged at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from ..backends.sqlite import db
from ..exceptions import ReplicaError, SettingError
from . import files, litestream

log = logging.getLogger("fastapi_lith.replica")


class CheckStopped(Exception):
    """The app stopped during a check: nothing is recorded, it runs again after the restart."""


@dataclass
class CheckResult:
    """What one check found; `ok` is what matters, `lines()` says it for a person."""

    at: str  # when it started, ISO 8601 UTC
    replica: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    restore_seconds: float = 0.0
    size: int = 0
    txid: int | None = None  # the replica's newest position when the check began
    version: int | None = None
    live_versions: list[int] = field(default_factory=list)  # the lowest and highest seen
    tables: dict[str, list[int | None]] = field(default_factory=dict)  # name: [restored, live min, live max]

    def lines(self) -> list[str]:
        out = [f"replica check of {self.replica} at {self.at}: {'ok' if self.ok else 'FAILED'}"]
        out += [f"  problem    {p}" for p in self.problems]
        if self.size:
            out.append(f"  restored   {files.mb(self.size)} in {self.restore_seconds:.2f} s "
                       f"(txid {self.txid or 0:016x}); the whole check {self.seconds:.1f} s")  # fmt: skip
        if self.version is not None:
            live = "-".join(str(v) for v in sorted(set(self.live_versions))) or "no live database"
            out.append(f"  version    {self.version} (live {live})")
        for name, (restored, low, high) in sorted(self.tables.items()):
            live = "missing" if low is None else (str(low) if low == high else f"{low} to {high}")
            out.append(f"  {name:<10} {restored if restored is not None else 'missing'} rows (live {live})")
        return out


def record_path(db_path: Path) -> Path:
    return db_path.with_name(f".{db_path.name}-replica-check.json")


def last_check(db_path: Path) -> CheckResult | None:
    """The last recorded check of this database's replica, from any process."""
    try:
        data = json.loads(record_path(db_path).read_text(encoding="utf-8"))
        return CheckResult(**data)
    except (OSError, ValueError, TypeError):
        return None


def check_replica(
    db_path: Path,
    url: str,
    *,
    sync_interval: float = 1.0,
    binary: Path | None = None,
    cancel: threading.Event | None = None,
    record: bool = True,
) -> CheckResult:
    """Restore the replica's latest state into a temporary file and compare (blocking)."""
    db_path = Path(db_path)
    result = CheckResult(at=datetime.now(timezone.utc).isoformat(timespec="seconds"), replica=litestream.redact(url))
    started = time.perf_counter()
    live = _LiveEnvelope(db_path)
    here = db_path.parent if db_path.parent.is_dir() else None  # beside the database: same disk, same permissions
    folder = Path(tempfile.mkdtemp(prefix=f".{db_path.name}-check-", dir=here))
    try:
        live.sample()
        position = litestream.replica_position(url, binary=binary)
        result.txid = position.txid if position else None
        # Wait one lag window: then the replica holds at least the state sampled first.
        live.sample_for(2 * sync_interval, cancel)
        restored = folder / db_path.name
        t0 = time.perf_counter()
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(litestream.restore, url, restored, binary=binary)
            while not fut.done():
                live.sample_for(0.25, cancel)
            found = fut.result()
        result.restore_seconds = time.perf_counter() - t0
        live.sample()
        if not found:
            result.problems.append("the replica holds no copy of the database")
        else:
            _compare(restored, live, result)
    except ReplicaError as exc:
        result.problems.append(str(exc))
    except _LiveUnreadable as exc:
        result.problems.append(f"the live database could not be read: {exc.__cause__}")
    except sqlite3.DatabaseError as exc:
        result.problems.append(f"the restored file is not a readable SQLite database: {exc}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result.ok = not result.problems
    result.seconds = time.perf_counter() - started
    if record and here is not None:
        files.write_atomic(record_path(db_path), (json.dumps(asdict(result), indent=2) + "\n").encode())
    if result.ok:
        log.info(
            "replica check of %s ok: restored %s in %.2f s", db_path.name, files.mb(result.size), result.restore_seconds
        )
    else:
        log.error("REPLICA CHECK FAILED for %s (%s): %s", db_path, result.replica, "; ".join(result.problems))
    return result


def _compare(restored: Path, live: _LiveEnvelope, result: CheckResult) -> None:
    result.size = restored.stat().st_size
    with files.open_ro(restored) as conn:
        integrity = files.check(conn, "integrity_check(20)")
        if integrity != ["ok"]:
            result.problems.append("integrity_check: " + "; ".join(integrity[:5]))
            return
        result.version = db.user_version(conn)
        counts = _counts(conn)
    if not live.exists:
        return  # nothing to compare with: a restore that checks out is all there is to say
    result.live_versions = [min(live.versions), max(live.versions)]
    if not min(live.versions) <= result.version <= max(live.versions):
        result.problems.append(f"schema version {result.version}, the live database's is {result.live_versions[-1]}")
    for name in sorted(set(counts) | set(live.low)):
        got, low, high = counts.get(name), live.low.get(name), live.high.get(name)
        result.tables[name] = [got, low, high]
        if got is None:
            result.problems.append(f"table {name} is missing from the replica")
        elif low is None or high is None:
            result.problems.append(f"table {name} is in the replica but not in the live database")
        elif not low <= got <= high:
            seen = str(low) if low == high else f"{low} to {high}"
            result.problems.append(f"table {name}: {got} rows in the replica, {seen} in the live database")


def _counts(conn: sqlite3.Connection) -> dict[str, int]:
    names = [row[0] for row in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_litestream\\_%' ESCAPE '\\'"
    )]  # fmt: skip
    quote = '"{}"'.format
    return {
        name: conn.execute(f"SELECT count(*) FROM {quote(name.replace(chr(34), chr(34) * 2))}").fetchone()[0]
        for name in names
    }


class _LiveUnreadable(Exception):
    """The live database failed a read (its SQLite error is the cause): the fault is not the
    replica's."""


class _LiveEnvelope:
    """The lowest and highest row count and schema version the live database showed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.exists = path.exists()
        self.low: dict[str, int] = {}
        self.high: dict[str, int] = {}
        self.versions: list[int] = []

    def sample(self) -> None:
        if not self.exists:
            return
        try:
            with files.open_ro(self.path) as conn:
                conn.execute("BEGIN")  # one snapshot for the version and every count
                version, counts = db.user_version(conn), _counts(conn)
                conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise _LiveUnreadable from exc
        self.versions.append(version)
        for name, n in counts.items():
            self.low[name] = min(n, self.low.get(name, n))
            self.high[name] = max(n, self.high.get(name, n))

    def sample_for(self, seconds: float, cancel: threading.Event | None) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.wait(min(left, 0.25)):
                raise CheckStopped("the app is stopping")
            if cancel is None:
                time.sleep(min(left, 0.25))
            self.sample()


class Replicated(Protocol):
    """What a check reads of a `Replica`: this module sits below replica.py, which starts it."""

    path: Path
    url: str
    sync_interval: float
    binary: Path | None


class ReplicaChecks:
    """The daily check inside the app: every `every` seconds, counted from the last recorded one.

    With no record yet the first check runs a minute after the replica starts, so a new
    deployment proves its replica restores on its first day.
    """

    def __init__(self, replica: Replicated, *, every: float = 86400.0) -> None:
        if every < 1:
            raise SettingError(f"replica_check_every must be at least 1 second, not {every}")
        self.replica = replica
        self.every = float(every)
        self.last: CheckResult | None = last_check(replica.path)
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._cancel = threading.Event()

    def next_due(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        if self.last is None:
            return now + min(self.every, 60.0)
        at = datetime.fromisoformat(self.last.at).timestamp()
        return max(at + self.every, now + min(self.every, 60.0))

    def start(self) -> None:
        if self._task is None:
            self._cancel.clear()
            self._task = asyncio.create_task(self._run(), name="lith-replica-check")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._cancel.set()  # a check in progress stops at its next look at the live database
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def check_now(self) -> CheckResult:
        replica = self.replica
        result = await asyncio.to_thread(
            check_replica, replica.path, replica.url, sync_interval=replica.sync_interval,
            binary=replica.binary, cancel=self._cancel,
        )  # fmt: skip
        self.last = result
        if not result.ok:
            self.failures += 1
        return result

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self.next_due() - time.time()))
            try:
                await self.check_now()
            except CheckStopped:
                return
            except Exception:  # noqa: BLE001 - a check that cannot even run is a failed check
                self.failures += 1
                log.exception("REPLICA CHECK could not run for %s", self.replica.path)
                await asyncio.sleep(min(self.every, 3600.0))

