"""`Accounts`: one SQLite file per account, served by one process.

Accounts that share nothing keep nothing in common: each has its own file, writer, readers
and hub, so one account's large batch holds no other account's commands, a backup or a
restore is one file, and deleting an account is deleting its file. Every account runs the
same migrations, commands and views.

Accounts open on a request and close when idle, within a limit (account_pool.py); a request
never creates an account: an unknown one is a 404.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi import Path as PathParam
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request

from . import settings
from .account_pool import Account, AccountPool
from .engine.commands import Command
from .engine.engine import Engine, register_view
from .engine.streams import Principal
from .engine.views import Access, Render, Topics
from .exceptions import AccountUnavailable, LithError, NotRunning, SettingError, UnknownAccount
from .lith import Lith
from .web.layer import WebLayer

_current: ContextVar[Account | None] = ContextVar("lith_account", default=None)


def path_account(account: str = PathParam(description="the account's name")) -> str:
    """The default way to find the account: the `{account}` parameter of the route's path."""
    return account


class Accounts(AccountPool):
    """Many accounts, one SQLite file each, with one set of migrations, commands and views.

    ```python
    accounts = Accounts("accounts/", migrations=Path(__file__).parent / "migrations")  # accounts/NAME.db
    app = FastAPI()
    app.include_router(accounts.router)  # routes declared on it later are served too

    @accounts.router.post("/add", status_code=204)                # POST /a/{account}/add
    async def add(cmd: Add, writer: Writer = Depends(accounts.writer)) -> None:
        await writer.do(cmd)
    ```

    Routes on `accounts.router` live under `prefix` (`/a/{account}`) and know their account:
    `Depends(accounts.writer)`, `Depends(accounts.db)`, `accounts.render` and
    `accounts.connect` use it: the same web layer as `Lith`'s (web/layer.py), over the
    request's account's engine. `account=` takes a FastAPI dependency returning the name instead
    (a subdomain, the session), with `prefix=""`. Any other keyword is a `Lith` setting, the
    same for every account; `backup_folder` holds one sub-folder per account, and `replica`
    may name the account as `{account}` (one Litestream process per open account).
    """

    @settings.checked(forward=Lith.__init__)  # any other keyword is a Lith setting
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
        super().__init__(folder, migrations=migrations, max_open=max_open, idle_after=idle_after, **lith_settings)
        if not isinstance(prefix, str) or (prefix and not _PREFIX.fullmatch(prefix)):
            raise SettingError(f"prefix must be '' or a path like '/a/{{account}}', not {prefix!r}")
        if account is None and "{account}" not in prefix:
            raise SettingError("prefix must hold '{account}', or pass account= (a dependency returning the name)")
        self.prefix = prefix
        # Every setting is checked now, by building (not starting) one account's Lith.
        probe = self._lith("settings-check")
        self.current = self._resolver(account or path_account)
        self.router = APIRouter(
            prefix=prefix, dependencies=[Depends(self.current)], include_in_schema=False, lifespan=self.lifespan
        )
        # The same web layer as one Lith's, its engine the request's account's.
        self.web = WebLayer(
            probe.web.settings, current=self._engine_dependency(), engine_of=_engine_of, views=self.views,
            router=self.router, stream_path="/lith/stream",
        )
        self.writer = self.web.writer
        self.encoder = self.web.encoder
        self.same_origin = self.web.same_origin
        self.principal = self.web.principal
        self.datastar = self.web.datastar  # the script and its notice, as `lith.datastar()`
        self.db = self._db_dependency()
        self._serving: FastAPI | None = None

    @property
    def datastar_url(self) -> str:
        return self.web.settings.datastar_url

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None) -> AsyncIterator[None]:
        """Serve accounts; on exit close every open one (each writer drained). With `app`, guard
        its command routes first; nested in the same app's lifespan, it does nothing more."""
        if app is not None and self._serving is app:
            yield
            return
        if app is not None:
            self.web.guard(app)
        async with self.serve():
            self._serving = app
            try:
                yield
            finally:
                self._serving = None

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

    def _engine_dependency(self) -> Callable[..., Awaitable[Engine]]:
        async def engine(account: Account = Depends(self.current)) -> Engine:
            """The request's account's engine: what the web layer serves."""
            return account.engine

        return engine

    def _db_dependency(self) -> Callable[..., AsyncIterator[AsyncConnection]]:
        async def db(account: Account = Depends(self.current)) -> AsyncIterator[AsyncConnection]:
            """`Depends(accounts.db)`: a read-only connection on the request's account."""
            async for conn in account.lith.db():
                yield conn

        return db

    def account(self) -> Account:
        """The account of the request being handled (on `accounts.router`)."""
        account = _current.get()
        if account is None:
            raise LithError(
                "no account in this context: the route must be on accounts.router "
                "(or take Depends(accounts.current))"
            )
        return account

    def view(self, key: str, *, topics: Topics = (), access: Access | None = None) -> Callable[[Render], Render]:
        """`@accounts.view(...)`: as `@lith.view`, a view every account has, on its own data."""
        return register_view(self.views, key, topics, access)

    async def revoke(self, principal: Principal) -> int:
        """As `lith.revoke`, in every account open in this process (one that is not open has no
        stream here); returns how many streams ended."""
        ended = 0
        for name in self.open_names():
            account = self._open.get(name)
            if account is not None and account.ready is not None and account.ready.done() and account.engine.running:
                with suppress(NotRunning):  # closing meanwhile: its streams end with it
                    ended += await account.lith.revoke(principal)
        return ended

    def command(
        self, path: str, command: type[Command], *, dependencies: list[Any] | None = None, max_body: int | None = None
    ) -> None:
        """`POST {prefix}path` on `accounts.router`: as `lith.command`, in the request's account."""
        self.web.command(self.router, path, command, dependencies=dependencies or (), max_body=max_body)

    async def render(self, key: str, **params: Any) -> Markup:
        """A view's HTML in the request's account, for a page's first paint."""
        return await self.account().lith.render(key, **params)

    def url(self, path: str = "") -> str:
        """`path` under the request's account: `accounts.url("/add")` is `/a/acme/add`."""
        return self.prefix.replace("{account}", self.account().name) + path

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` in the request's account."""
        return self.web.connect(self.url("/lith/stream"), *keys, tab=tab)

    def install(self, app: FastAPI) -> None:
        """As `lith.install`: `app.include_router(accounts.router)`, and HTML errors for a
        Datastar request to any route of `app`."""
        self.web.install(app)


def _engine_of(request: Request) -> Engine | None:
    account: Account | None = getattr(request.state, "lith_account", None)
    return account.engine if account is not None else None


_PREFIX = re.compile(r"(/([A-Za-z0-9._~-]+|\{account\}))+")
