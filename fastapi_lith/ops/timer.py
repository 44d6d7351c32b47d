"""The backup timer: a copy every so often into a folder, the newest N kept."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from ..exceptions import SettingError
from .backup import BackupInfo, Method, backup
from .files import STAMP_FORMAT, STAMP_RE, checksum_path, copy_name

log = logging.getLogger("fastapi_lith.backup")



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
            raise SettingError(f"every must be at least 1 second, not {every}")
        if keep < 1:
            raise SettingError(f"keep must be at least 1, not {keep}")
        self.path = Path(path)
        self.folder = Path(folder)
        self.every = float(every)
        self.keep = keep
        self.method = method
        self.last: BackupInfo | None = None
        self.taken = 0
        self.failures = 0
        self._pattern = re.compile(rf"^{re.escape(self.path.stem)}-({STAMP_RE})\.db$")
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
            import fcntl  # Unix only: kept out of `import fastapi_lith`

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
        """The timer loop: copy when due, forever (cancel to stop). A folder it cannot make or
        read fails like a copy, counted and logged, and is tried again: the timer never ends."""
        while True:
            try:
                if not self.lead():  # another process of this app copies; take over if it ends
                    await asyncio.sleep(min(self.every, 60.0))
                    continue
                delay = self.next_due() - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
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

