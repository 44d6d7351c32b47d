"""`Accounts`: one SQLite file per account, served by one process.

Accounts that share nothing keep nothing in common: each has its own file, writer, readers
and hub, so one account's large batch holds no other account's commands, a backup or a
restore is one file, and deleting an account is deleting its file. Every account runs the
same migrations, commands and views.

An account's database opens on its first request and closes once it has been idle for
`idle_after` seconds (no request in flight, no stream open, its writer drained); at most
`max_open` are open at once, the least recently used idle one closing first. A process with
10,000 account files and 100 active ones holds resources for about 100. A request never
creates an account: an unknown one is a 404; `await accounts.create(name)` makes the file.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from fastapi import Path as PathParam
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request
from starlette.responses import Response

from . import settings
from .app import Lith
from .exceptions import AccountUnavailable, LithError, SettingError, UnknownAccount, ViewError
from .feed import Feed
from .guard import BodyLimit, add_error_handlers, same_origin_reason
from .streams import TAB_ID, Frame
from .views import Render, Views
from .writer import Writer

log = logging.getLogger("fastapi_lith.accounts")

# Lower case only: account names become file names, and some file systems ignore case.
ACCOUNT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
SUFFIX = ".db"

_current: ContextVar[Account | None] = ContextVar("lith_account", default=None)


def path_account(account: str = PathParam(description="the account's name")) -> str:
    """The default way to find the account: the `{account}` parameter of the route's path."""
    return account


@dataclass(eq=False)
class Account:
    """One open account: its `Lith` (writer, readers, hub) and who is using it."""

    name: str
    lith: Lith
    leases: int = 0  # requests (or `accounts.use`) in flight
    last_used: float = field(default_factory=time.monotonic)
    ready: asyncio.Future[None] | None = None  # the opening: migrate, start the writer and hub
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    def idle(self) -> bool:
        """Nothing would notice it closing: no request, no stream, no queued command."""
        lith = self.lith
        if self.leases or self.ready is None or not self.ready.done():
            return False
        hub = lith._hub
        return not (hub is not None and hub.streams) and not lith.writer._queue


class Accounts:
    """Many accounts, one SQLite file each, with one set of migrations, commands and views.

    ```python
    accounts = Accounts("accounts/", migrations="migrations/")   # accounts/NAME.db
    app = FastAPI(lifespan=accounts.lifespan)
    accounts.install(app)

    @accounts.router.post("/add", status_code=204)                # POST /a/{account}/add
    async def add(cmd: Add, writer: Writer = Depends(accounts.writer)) -> None:
        await writer.do(cmd)
    ```

    Routes on `accounts.router` live under `prefix` (`/a/{account}`) and know their account:
    `Depends(accounts.writer)`, `Depends(accounts.db)`, `accounts.render` and
    `accounts.connect` use it. `account=` takes a FastAPI dependency returning the name instead
    (a subdomain, the session), with `prefix=""`. Any other keyword is a `Lith` setting, the
    same for every account; `backup_folder` holds one sub-folder per account, and `replica`
    may name the account as `{account}` (one Litestream process per open account).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        migrations: str | Path | None = None,
        prefix: str = "/a/{account}",
        account: Callable[..., str | Awaitable[str]] | None = None,
        max_open: int = 100,
        idle_after: float = 60.0,
        **lith_settings: Any,
    ) -> None:
        self.folder = Path(folder)
        self.migrations = migrations
        self.max_open = settings.number("max_open", max_open, low=1, integer=True)
        self.idle_after = settings.number("idle_after", idle_after, low=0.01)
        if not isinstance(prefix, str) or (prefix and not _PREFIX.fullmatch(prefix)):
            raise SettingError(f"prefix must be '' or a path like '/a/{{account}}', not {prefix!r}")
        if account is None and "{account}" not in prefix:
            raise SettingError("prefix must hold '{account}', or pass account= (a dependency returning the name)")
        for fixed in ("path", "feed", "prefix"):
            if fixed in lith_settings:
                raise SettingError(f"{fixed} is set per account by Accounts, not a setting")
        self.prefix = prefix
        self._settings = lith_settings
        self.views = Views()
        self._open: OrderedDict[str, Account] = OrderedDict()  # least recently used first
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._running = False
        self._installed: weakref.WeakSet[FastAPI] = weakref.WeakSet()
        self.opened = self.closed = 0  # counters the tests and benchmarks read
        # Every setting is checked now, by building (not starting) one account's Lith.
        probe = self._lith("settings-check")
        self.error_id, self.max_body = probe.error_id, probe.max_body
        self.messages, self.datastar_url = probe.messages, probe.datastar_url
        self.current = self._resolver(account or path_account)
        self.writer = self._writer_dependency()
        self.db = self._db_dependency()
        self.router = APIRouter(prefix=prefix, dependencies=[Depends(self.current)], include_in_schema=False)
        self.router.add_api_route("/lith/stream", self._stream_endpoint(), methods=["GET"])

    # -- the account files -------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """The database file of account `name` (which need not exist)."""
        if not isinstance(name, str) or not ACCOUNT_NAME.fullmatch(name):
            raise UnknownAccount(f"{name!r} is not an account name: 1 to 63 of a-z, 0-9, '-' and '_', starting with a letter or digit")
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
        lith = Lith(self.folder / f"{name}{SUFFIX}", migrations=self.migrations, feed=Feed(), **extra)
        lith.views = self.views
        return lith

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
            await account._stack.enter_async_context(account.lith.lifespan())
        except BaseException as exc:
            if self._open.get(account.name) is account:
                del self._open[account.name]
            await account._stack.aclose()
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
            await account._stack.aclose()  # streams end, the writer drains, the files close
        except Exception:  # noqa: BLE001 - one account's failure must not stop the others closing
            log.exception("account %s did not close cleanly", account.name)
        self.closed += 1

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
                now = time.monotonic()
                for account in list(self._open.values()):
                    if account.idle() and now - account.last_used >= self.idle_after:
                        self._begin_close(account.name)
            except Exception:  # noqa: BLE001 - a broken pass must not stop the closing of idle accounts
                log.exception("closing idle accounts failed")

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None) -> AsyncIterator[None]:
        """Serve accounts; on exit close every open one (each writer drained)."""
        if app is not None:
            if app not in self._installed:
                raise LithError("accounts.install(app) was not called: call it right after app = FastAPI(lifespan=...)")
            # Included now, not at install: the app's routes on accounts.router are declared by then.
            if not getattr(app.state, "lith_accounts_routes", False):
                app.include_router(self.router)
                app.state.lith_accounts_routes = True
        self.folder.mkdir(parents=True, exist_ok=True)
        self._running = True
        self._reaper = asyncio.ensure_future(self._reap())
        try:
            yield
        finally:
            self._running = False
            self._reaper.cancel()
            for name in list(self._open):
                self._begin_close(name)
            if self._closing:
                await asyncio.wait(list(self._closing.values()))

    # -- what routes use ---------------------------------------------------------------------

    def _resolver(self, name_of: Callable[..., Any]) -> Callable[..., AsyncIterator[Account]]:
        async def current(request: Request, name: str = Depends(name_of)) -> AsyncIterator[Account]:
            """The request's account, open and held open until the response is done."""
            try:
                account = await self._acquire(name)
            except UnknownAccount as exc:
                raise HTTPException(404, str(exc)) from None
            except AccountUnavailable as exc:
                raise HTTPException(503, str(exc)) from None
            request.state.lith_account = account
            _current.set(account)
            try:
                yield account
            finally:
                self._release(account)

        return current

    def _writer_dependency(self) -> Callable[..., Awaitable[Writer]]:
        async def writer(request: Request, account: Account = Depends(self.current)) -> Writer:
            """`Depends(accounts.writer)`: the account's writer, guarded as `Depends(lith.writer)`."""
            return await account.lith.writer(request)

        return writer

    def _db_dependency(self) -> Callable[..., AsyncIterator[AsyncConnection]]:
        async def db(account: Account = Depends(self.current)) -> AsyncIterator[AsyncConnection]:
            """`Depends(accounts.db)`: a read-only connection on the request's account."""
            async for conn in account.lith.db():
                yield conn

        return db

    async def same_origin(self, request: Request) -> None:
        """`Depends(accounts.same_origin)`: as `lith.same_origin`, for a route of no account
        (a form that creates one)."""
        if self._settings.get("same_origin_only", True):
            reason = same_origin_reason(request)
            if reason:
                raise HTTPException(403, reason)

    def account(self) -> Account:
        """The account of the request being handled (on `accounts.router`)."""
        account = _current.get()
        if account is None:
            raise LithError(
                "no account in this context: the route must be on accounts.router "
                "(or take Depends(accounts.current))"
            )
        return account

    def view(self, key: str, *, topics: set[str] | frozenset[str] | tuple[str, ...] = ()) -> Callable[[Render], Render]:
        """`@accounts.view(...)`: as `@lith.view`, a view every account has, on its own data."""
        return self.views.register(key, topics)

    async def render(self, key: str, **params: Any) -> Markup:
        """A view's HTML in the request's account, for a page's first paint."""
        return await self.account().lith.render(key, **params)

    def url(self, path: str = "") -> str:
        """`path` under the request's account: `accounts.url("/add")` is `/a/acme/add`."""
        return self.prefix.replace("{account}", self.account().name) + path

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` in the request's account."""
        if not TAB_ID.fullmatch(tab):
            raise ViewError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
        lith = self.account().lith
        expression = lith.connect(*keys, tab=tab)
        return expression.replace(f"'{lith.prefix}/stream?", f"'{self.url('/lith/stream')}?", 1)

    def _stream_endpoint(self) -> Callable[..., Any]:
        async def stream(request: Request, accept_encoding: str | None = Header(None)) -> Response:
            """`GET {prefix}/lith/stream?views=…&tab=…`: one SSE response per tab, per account."""
            lith = self.account().lith
            return await lith.open_stream(request, await lith.encoder(accept_encoding))

        return stream

    # -- the app -----------------------------------------------------------------------------

    def install(self, app: FastAPI) -> None:
        """As `lith.install`: the body limit on command routes and HTML errors for them.

        The routes of `accounts.router` (with the stream route) join the app when it starts.
        """
        app.add_middleware(BodyLimit, writer=self.writer, max_body=self.max_body)
        add_error_handlers(app, error_id=self.error_id, messages=self.messages, push=self._push)
        self._installed.add(app)

    def _push(self, request: Request, tab: str, frame: Frame) -> None:
        account: Account | None = getattr(request.state, "lith_account", None)
        hub = account.lith._hub if account is not None else None
        if hub is not None:
            hub.push(tab, frame)


_PREFIX = re.compile(r"(/([A-Za-z0-9._~-]+|\{account\}))+")

