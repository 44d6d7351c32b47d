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
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from fastapi import Path as PathParam
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request
from starlette.responses import Response

from . import settings
from .lith import Lith
from .exceptions import AccountUnavailable, LithError, SettingError, UnknownAccount, ViewError
from .web.guard import BodyLimit, add_error_handlers, add_storage_error_handler
from .web.origin import same_origin_reason
from .engine.commands import TAB_ID
from .engine.frames import Frame
from .account_pool import Account, AccountPool
from .engine.views import Render, Topics
from .engine.writer import Writer


_current: ContextVar[Account | None] = ContextVar("lith_account", default=None)


def path_account(account: str = PathParam(description="the account's name")) -> str:
    """The default way to find the account: the `{account}` parameter of the route's path."""
    return account


class Accounts(AccountPool):
    """Many accounts, one SQLite file each, with one set of migrations, commands and views.

    ```python
    accounts = Accounts("accounts/", migrations=Path(__file__).parent / "migrations")  # accounts/NAME.db
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
        self._installed: weakref.WeakSet[FastAPI] = weakref.WeakSet()
        # Every setting is checked now, by building (not starting) one account's Lith.
        probe = self._lith("settings-check")
        self.error_id, self.max_body = probe.error_id, probe.max_body
        self.messages, self.datastar_url = probe.messages, probe.datastar_url
        self.current = self._resolver(account or path_account)
        self.writer = self._writer_dependency()
        self.db = self._db_dependency()
        self.router = APIRouter(prefix=prefix, dependencies=[Depends(self.current)], include_in_schema=False)
        self.router.add_api_route("/lith/stream", self._stream_endpoint(), methods=["GET"])

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
        async with self.serve():
            yield

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

    def view(self, key: str, *, topics: Topics = ()) -> Callable[[Render], Render]:
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
        add_storage_error_handler(app, error_id=self.error_id, push=self._push)
        self._installed.add(app)

    def _push(self, request: Request, tab: str, frame: Frame) -> None:
        account: Account | None = getattr(request.state, "lith_account", None)
        hub = account.lith._hub if account is not None else None
        if hub is not None:
            hub.push(tab, frame)


_PREFIX = re.compile(r"(/([A-Za-z0-9._~-]+|\{account\}))+")

