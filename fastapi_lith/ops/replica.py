"""Continuous replication: Litestream as the app's managed child process.

```python
lith = Lith("app.db", migrations=Path(__file__).parent / "migrations", replica="s3://bucket/app")
```

In the app's lifespan, in order: `prepare()` finds the binary, checks the credentials and, when
the database file is missing and the replica holds a copy, restores it (a fresh disk); then
the writer opens and migrates; then `start()` runs `litestream replicate` with a generated
configuration. If Litestream exits on its own it is logged, counted and started again, waiting
longer after each quick failure. `stop()`, after the writer's last commit, asks it to upload
what is left and waits for it.

Litestream runs under a small shell that holds the read end of a pipe from the app: when the
app ends, however it ends (kill -9 too), the pipe closes and the shell stops Litestream, so no
replicator outlives its app to race the next one on the same replica.

Several processes of one app (`--workers N`) each build a `Replica`; one of them, the holder
of a lock file beside the database, runs Litestream. The others wait on that lock and take
over when its holder ends, kill -9 too. A missing database is restored under a second lock, so
processes starting together on a fresh disk restore it once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import deque
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..exceptions import ReplicaError, SettingError
from . import files, litestream
from .replica_check import ReplicaChecks, last_check

log = logging.getLogger("fastapi_lith.replica")

# $0 is the binary and $1 the configuration. fd 3 keeps the app's pipe: a background job's
# stdin is /dev/null in a non-interactive shell.
_WRAPPER = r"""
exec 3<&0
"$0" replicate -no-expand-env -config "$1" </dev/null &
child=$!
echo "lith: litestream pid $child"
{ read -r line <&3; kill -TERM "$child" 2>/dev/null; } &
watcher=$!
wait "$child"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"""
_PID_LINE = re.compile(r"^lith: litestream pid (\d+)$")
_LEVEL = re.compile(r"\blevel=(DEBUG|INFO|WARN|ERROR)\b")
_SYNCED = " msg=sync "  # Litestream's line for each look at the WAL, once it has opened the database
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}
# Seconds a start waits, past one sync interval, for Litestream's first look at the database
# before it goes on without it (a slow disk or storage must not keep the app down).
START_WAIT = 30.0
# A Litestream that ran this many seconds before it died was working: its restart waits the
# shortest back-off again, not the longer one its earlier deaths had reached.
STABLE_AFTER = 60.0
# Seconds a start Litestream did not survive waits for the rest of its output, for the error:
# the pipe closes as it exits, so only a child of its own left running would hold it open.
DRAIN_WAIT = 5.0


class Replica:
    """One database's replica, kept current by a Litestream process that this object runs."""

    def __init__(
        self,
        db_path: str | Path,
        url: str,
        *,
        sync_interval: float = 1.0,
        check_every: float | None = 86400.0,
        binary: str | Path | None = None,
    ) -> None:
        litestream.check_url(url)
        if not 0.2 <= sync_interval <= 3600:
            raise SettingError(f"replica_sync_interval must be 0.2 to 3600 seconds, not {sync_interval}")
        self.path = Path(db_path)
        self.url = url
        self.sync_interval = float(sync_interval)
        self.binary = Path(binary) if binary is not None else None
        self.checks = ReplicaChecks(self, every=check_every) if check_every else None
        self.config_path = self.path.with_name(f".{self.path.name}-litestream.yml")
        self.lead_path = self.path.with_name(f".{self.path.name}-litestream.lock")
        self.restarts = 0
        self.pid: int | None = None  # Litestream's own, once it said so
        self.restored = False  # this process restored the database from the replica
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._synced = asyncio.Event()
        self._drained = asyncio.Event()
        self._said: deque[str] = deque(maxlen=5)  # its last lines above DEBUG, for an error
        self._lead_fd: int | None = None  # held while this process runs Litestream
        self._follower: asyncio.Task[None] | None = None  # waits to take over from another process

    # -- before the database opens ------------------------------------------------------------

    def prepare(self) -> bool:
        """Check binary and credentials; restore the database if its file is missing (blocking).

        Returns True when it restored. Raises ReplicaError, before anything starts, when the
        binary or the credentials are missing.
        """
        self.binary = self.binary or litestream.find_binary()
        litestream.check_environment(self.url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock(self.path.with_name(f".{self.path.name}-restore.lock"), wait=True)
        try:
            return self.restore_if_missing()
        finally:
            os.close(fd)

    def restore_if_missing(self) -> bool:
        """A missing database file with a replica that holds a copy: restore it first.

        What a lost file leaves behind belongs to the lost database: a stale `-wal` would be
        replayed into the restored file, and Litestream's own folder describes positions of
        the old one. They are moved aside (`NAME.orphaned-STAMP`), not deleted.
        """
        if self.path.exists():
            return False
        when = files.stamp()
        for stale in (Path(f"{self.path}-wal"), Path(f"{self.path}-shm"), litestream.meta_dir(self.path)):
            if stale.exists():
                aside = files.unique(stale.with_name(f"{stale.name}.orphaned-{when}"))
                os.replace(stale, aside)
                log.warning("%s is missing: moved its leftover %s aside as %s", self.path.name, stale.name, aside.name)
        tmp = files.temp_beside(self.path, "replica")
        started = time.perf_counter()
        try:
            if not litestream.restore(self.url, tmp, binary=self.binary):
                log.info("%s is missing and %s holds no copy: starting empty", self.path, self.url)
                return False
            files.fsync(tmp)
            os.replace(tmp, self.path)
            files.fsync_dir(self.path.parent)
        finally:
            tmp.unlink(missing_ok=True)  # Litestream writes a plain file: nothing opened it as a database
        self.restored = True
        log.warning("%s was missing: restored it from %s in %.1f s (%s)", self.path, litestream.redact(self.url),
                    time.perf_counter() - started, files.mb(self.path.stat().st_size))  # fmt: skip
        return True

    # -- the process ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Run Litestream (idempotent); the database must exist (start after the writer).

        Another process of the app already running it for this database: wait to take over.
        """
        if self._task is not None or self._follower is not None:
            return
        if self.binary is None:
            await asyncio.to_thread(self.prepare)
        self._stopping = False
        if self._lead():
            await self._replicate()
        else:
            log.info("another process replicates %s; this one takes over if it ends", self.path.name)
            self._follower = asyncio.create_task(self._follow(), name="lith-replica-follower")

    def _lead(self) -> bool:
        if self._lead_fd is None:
            try:
                self._lead_fd = _lock(self.lead_path, wait=False)
            except BlockingIOError:
                return False
        return True

    async def _follow(self) -> None:
        while not self._lead():
            await asyncio.sleep(self.sync_interval)
        # The last holder's Litestream stops as its app's pipe closes: give it that moment.
        await asyncio.sleep(self.sync_interval)
        log.warning("took over replicating %s from a process that ended", self.path.name)
        await self._replicate()

    async def _replicate(self) -> None:
        litestream.write_config(
            self.config_path, litestream.config(self.path, self.url, sync_interval=self.sync_interval)
        )
        self._synced = asyncio.Event()  # of this loop: an app may start again on another
        await self._spawn()
        self._task = asyncio.create_task(self._watch(), name="lith-replica")
        await self._wait_started(self.sync_interval + START_WAIT)
        if self.checks is not None:
            self.checks.start()

    async def _wait_started(self, timeout: float) -> None:
        """Return once Litestream has read the database: before that, a stop uploads nothing.

        A Litestream that exits at once (credentials it cannot use, a bad setting) stops the
        app's start with its last words.
        """
        deadline, restarts = time.monotonic() + timeout, self.restarts
        while not self._synced.is_set():
            exited = self._proc is not None and self._proc.returncode is not None
            if self.restarts != restarts or exited:
                if self.restarts == restarts:  # its last words may still be in the pipe, which closes as it exits
                    with suppress(TimeoutError):
                        await asyncio.wait_for(self._drained.wait(), DRAIN_WAIT)
                await self.stop()
                said = " | ".join(self._said) or "no output"
                raise ReplicaError(
                    f"litestream stopped as it started, replicating to {litestream.redact(self.url)}: {said}"
                )
            if time.monotonic() > deadline:
                log.warning("litestream has not read %s after %.0f s; starting anyway", self.path, timeout)
                return
            try:
                await asyncio.wait_for(self._synced.wait(), 0.05)
            except TimeoutError:
                pass

    async def _spawn(self) -> None:
        self.pid = None
        self._drained = asyncio.Event()  # its output read to the end
        self._proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", _WRAPPER, str(self.binary), str(self.config_path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            # Its own session: a Ctrl+C meant for the app must not stop Litestream before the
            # writer's last commit; the app stops it after that (systemd: KillMode=mixed).
            start_new_session=True,
        )  # fmt: skip

    async def _watch(self) -> None:
        """Log Litestream's output; when it exits unasked, start it again."""
        backoff = 1.0
        while True:
            proc = self._proc
            assert proc is not None
            started = time.monotonic()
            await self._pump(proc)
            code = await proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            if time.monotonic() - started > STABLE_AFTER:
                backoff = 1.0
            log.error("litestream %s; starting it again in %.0f s (restart %d)", _exit(code), backoff, self.restarts)
            while True:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                if self._stopping:
                    return
                try:
                    await self._spawn()
                    break
                except OSError as exc:  # no shell (out of descriptors): a missing binary exits 127
                    log.error("litestream could not be started again: %s; next try in %.0f s", exc, backoff)

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                if match := _PID_LINE.match(line):
                    self.pid = int(match.group(1))
                    continue
                level = _LEVELS[m.group(1)] if (m := _LEVEL.search(line)) else logging.INFO
                if level == logging.DEBUG:
                    if _SYNCED in line:
                        self._synced.set()
                else:
                    self._said.append(line)
                log.log(level, "litestream: %s", line)
        finally:
            self._drained.set()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self._stopping

    async def stop(self, timeout: float = 20.0) -> None:
        """Let Litestream upload what is left and exit; kill it past `timeout` seconds."""
        self._stopping = True
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            try:
                await follower
            except asyncio.CancelledError:
                pass
        try:
            await self._stop_litestream(timeout)
        finally:
            if self._lead_fd is not None:
                os.close(self._lead_fd)
                self._lead_fd = None

    async def _stop_litestream(self, timeout: float) -> None:
        if self.checks is not None:
            await self.checks.stop()
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        proc, killed = self._proc, False
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the shell stops Litestream, which uploads what is left
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except TimeoutError:
                log.error("litestream did not stop within %.0f s: killed", timeout)
                killed = True
                proc.kill()
                if self.pid:
                    try:
                        os.kill(self.pid, 9)
                    except ProcessLookupError:
                        pass
                # Killed, it ends its output: once that is read to the end its pipes close,
                # where a task cancelled mid-read would leave them open.
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout)
                except TimeoutError:
                    pass
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if proc is not None and proc.returncode not in (0, None) and not killed:
            log.warning("litestream %s on stop", _exit(proc.returncode))

    # -- what it says about itself ----------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """For the app's health route: is it replicating, and how did the last check go."""
        last = last_check(self.path)  # recorded by the app's own checks or by `replica verify`
        return {
            "replicating": self.running,
            "leader": self._lead_fd is not None,
            "restarts": self.restarts,
            "last_check": None if last is None else {"ok": last.ok, "at": last.at, "problems": last.problems},
        }



def _lock(path: Path, *, wait: bool) -> int:
    """An exclusive `flock` on `path`, held by the returned descriptor until it is closed; the
    kernel frees it when the process ends, however it ends. BlockingIOError when taken and not
    `wait`."""
    import fcntl  # Unix only, as Litestream is: kept out of `import fastapi_lith`

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _exit(code: int) -> str:
    # asyncio reports the shell killed by signal N as -N; the shell reports Litestream's as 128 + N.
    if code < 0:
        return f"was killed by signal {-code}"
    return f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"


__all__ = ["Replica", "ReplicaError"]
