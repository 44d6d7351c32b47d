"""The account databases: one SQLite file each, opened on demand, closed when idle.

An account's database opens on its first use and closes once it has been idle for
`idle_after` seconds (no request in flight, no stream open, its writer drained); at most
`max_open` are open at once, the least recently used idle one closing first. A process with
10,000 account files and 100 active ones holds resources for about 100. Nothing here creates an
account by using it: an unknown one is `UnknownAccount`; `create(name)` makes the file.
`Accounts` (accounts.py) puts this behind FastAPI routes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import settings
from .engine import collector
from .engine.engine import Engine, app_views
from .engine.feed import Feed
from .exceptions import AccountUnavailable, AlreadyRunning, LithError, SettingError, UnknownAccount
from .lith import Lith
from .ops.metrics import Metrics

log = logging.getLogger("fastapi_lith.accounts")

# Lower case only: account names become file names, and some file systems ignore case.
ACCOUNT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
SUFFIX = ".db"


@dataclass(eq=False)
class Account:
    """One open account: its `Lith` (writer, readers, hub) and who is using it."""

    name: str
    lith: Lith
    leases: int = 0  # requests (or `accounts.use`) in flight
    last_used: float = field(default_factory=time.monotonic)
    ready: asyncio.Future[None] | None = None  # the opening: migrate, start the writer and hub
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    @property
    def engine(self) -> Engine:
        """Its writer, readers and hub: what the web layer serves for it."""
        return self.lith.engine

    def idle(self) -> bool:
        """Nothing would notice it closing: no request, no `use`, no stream (engine.py)."""
        if self.leases or self.ready is None or not self.ready.done():
            return False
        return self.engine.is_idle()

    async def open(self) -> None:
        """Enter its `Lith`'s lifespan: migrate, start the writer and hub."""
        await self._stack.enter_async_context(self.lith.lifespan())

    async def close(self) -> None:
        """Leave the lifespan: streams end, the writer drains, the files close."""
        await self._stack.aclose()


class AccountPool:
    """The accounts of one folder, `NAME.db` each, with one set of migrations and views."""

    def __init__(
        self,
        folder: str | Path,
        *,
        migrations: str | Path | None = None,
        max_open: int = 100,
        idle_after: float = 60.0,
        **lith_settings: Any,
    ) -> None:
        self.folder = Path(folder)
        self.migrations = migrations
        self.max_open = settings.number("max_open", max_open, low=1, integer=True)
        self.idle_after = settings.number("idle_after", idle_after, low=0.01)
        for fixed in ("path", "feed", "prefix", "views"):
            if fixed in lith_settings:
                raise SettingError(f"{fixed} is set per account by Accounts, not a setting")
        self._settings = lith_settings
        # One set of views for every account, the built-in outcome view among them.
        hint = lith_settings.get("outcome_hint", "")
        self.views = app_views(hint if isinstance(hint, str) else "")  # a bad hint: the probe says so
        self._open: OrderedDict[str, Account] = OrderedDict()  # least recently used first
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._running = False
        self.opened = self.closed = 0  # counters the tests and benchmarks read
        self._metrics: Metrics | None = None

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[None]:
        """Open accounts on demand, close idle ones; on exit close every open one (drained)."""
        if self._running:
            raise AlreadyRunning(
                "these accounts are already being served: a second start would close them under the first"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self._running = True
        # Start-up's objects frozen now, none of an account's: they would never be collected.
        collector.freeze_startup()
        self._reaper = asyncio.ensure_future(self._reap())
        sampler: AbstractAsyncContextManager[None] = nullcontext()
        if self._metrics is not None:
            sampler = self._metrics.running()
        async with sampler:  # outside the accounts: each one's last counts are taken as it closes
            try:
                yield
            finally:
                self._running = False
                self._reaper.cancel()
                for name in list(self._open):
                    self._begin_close(name)
                if self._closing:
                    await asyncio.wait(list(self._closing.values()))

    @property
    def metrics(self) -> Metrics:
        """The metrics of every account, summed (no label per account: their number is the
        app's, not bounded); made on first use, to be asked before the accounts are served."""
        if self._metrics is None:
            self._metrics = Metrics(lambda: [a.engine for a in self._open.values()], pool=self)
        return self._metrics

    # -- the account files -------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """The database file of account `name` (which need not exist)."""
        if not isinstance(name, str) or not ACCOUNT_NAME.fullmatch(name):
            raise UnknownAccount(
                f"{name!r} is not an account name: 1 to 63 of a-z, 0-9, '-' and '_', starting with a letter or digit"
            )
        return self.folder / f"{name}{SUFFIX}"

    def names(self) -> list[str]:
        """Every account with a file in the folder, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob(f"*{SUFFIX}") if ACCOUNT_NAME.fullmatch(p.stem))

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    async def create(self, name: str) -> None:
        """Make account `name`'s file and migrate it; an existing account is left as it is."""
        path = self.path(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.touch()  # an empty file is an empty SQLite database: opening migrates it
        async with self.use(name):
            pass

    async def delete(self, name: str) -> None:
        """Close account `name` and delete its files (its backups stay)."""
        path = self.path(name)
        await self.close(name)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    def _lith(self, name: str) -> Lith:
        extra = dict(self._settings)
        if extra.get("backup_folder") is not None:
            extra["backup_folder"] = Path(extra["backup_folder"]) / name
        if isinstance(extra.get("replica"), str):
            extra["replica"] = extra["replica"].replace("{account}", name)
        # One process serves every account, so the hub hears of commits from its own writer:
        # the base feed, which polls nothing.
        return Lith(self.folder / f"{name}{SUFFIX}", migrations=self.migrations, feed=Feed(), views=self.views, **extra)

    # -- open, use, close --------------------------------------------------------------------

    async def get(self, name: str) -> Account:
        """The open account `name`, opened now if need be (hold it open with `use`).

        Raises `UnknownAccount` if it has no file, `AccountUnavailable` if it cannot open (a
        migration failed: the message says which); other accounts are not affected.
        """
        account = await self._acquire(name)
        self._release(account)
        return account

    async def _acquire(self, name: str) -> Account:
        """Open account `name` if need be and hold it: it cannot close until `_release`."""
        if not self._running:
            raise LithError("the app is not running: use accounts.lifespan")
        path = self.path(name)
        while True:  # never two writers on one file: a close under way ends first
            closing = self._closing.get(name)
            if closing is None or closing.done():  # done: its entry goes at the next loop turn
                break
            await asyncio.shield(closing)
        account = self._open.get(name)
        if account is None:
            if not path.is_file():
                raise UnknownAccount(f"no account {name!r}")
            account = self._open[name] = Account(name, self._lith(name))
            account.ready = asyncio.ensure_future(self._start(account))
            self._evict()
        else:
            self._open.move_to_end(name)
        # Held before waiting: an account being opened for someone is never the one evicted.
        account.leases += 1
        try:
            assert account.ready is not None
            await asyncio.shield(account.ready)
        except BaseException:
            self._release(account)
            raise
        return account

    def _release(self, account: Account) -> None:
        account.leases -= 1
        account.last_used = time.monotonic()

    async def _start(self, account: Account) -> None:
        try:
            await account.open()
        except BaseException as exc:
            if self._open.get(account.name) is account:
                del self._open[account.name]
            await account.close()
            log.error("account %s cannot open: %s", account.name, exc)
            raise AccountUnavailable(f"account {account.name!r} cannot open: {exc}") from exc
        self.opened += 1

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Lith]:
        """Hold account `name` open for work outside a request (a job, a script)."""
        account = await self._acquire(name)
        try:
            yield account.lith
        finally:
            self._release(account)

    def open_names(self) -> list[str]:
        """The accounts open now, least recently used first."""
        return list(self._open)

    def _evict(self) -> None:
        """Past `max_open`, close the least recently used idle accounts.

        One with a stream open or a request in flight is not idle: the limit bounds what
        accounts nobody uses hold, so it is passed for the moment rather than a live page
        cut off (it would reconnect and cut off another).
        """
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return
        victims = [a for a in self._open.values() if a.idle()][:excess]
        for account in victims:
            self._begin_close(account.name)
        if len(victims) < excess:
            log.warning("%d accounts open, over max_open=%d: the others are in use", len(self._open), self.max_open)

    def _begin_close(self, name: str) -> asyncio.Task[None]:
        account = self._open.pop(name)
        task = asyncio.ensure_future(self._stop(account))
        self._closing[name] = task
        task.add_done_callback(lambda _: self._closing.pop(name, None))
        return task

    async def _stop(self, account: Account) -> None:
        if account.ready is not None and not account.ready.done():
            await asyncio.wait((account.ready,))
        try:
            await account.close()
        except Exception:  # noqa: BLE001 - one account's failure must not stop the others closing
            log.exception("account %s did not close cleanly", account.name)
        self.closed += 1
        if self._metrics is not None:  # what it did since the last sample, before it is gone
            self._metrics.retire(account.engine)

    async def close(self, name: str) -> None:
        """Close account `name` now, its writer drained and its streams ended (pages reconnect
        and open it again): for a restore from the shell while the app runs."""
        if name in self._open:
            self._begin_close(name)
        closing = self._closing.get(name)
        if closing is not None:
            await asyncio.shield(closing)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_after / 2, 5.0))
            try:
                self._close_idle()
            except Exception:  # noqa: BLE001 - a broken pass must not stop the closing of idle accounts
                log.exception("closing idle accounts failed")

    def _close_idle(self) -> None:
        # A pass of its own: no account stays referenced from the reaper while it sleeps.
        now = time.monotonic()
        for account in list(self._open.values()):
            if account.idle() and now - account.last_used >= self.idle_after:
                self._begin_close(account.name)
