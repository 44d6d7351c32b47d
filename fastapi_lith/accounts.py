"""`Accounts`: one SQLite file per account, served by one process.

Accounts that share nothing keep nothing in common: each has its own file, writer, readers
and hub, so one account's large batch holds no other account's commands, a backup or a
restore is one file, and deleting an account is deleting its file. Every account runs the
same migrations, commands and views.

Accounts open on a request and close when idle, within a limit (account_pool.py); a request
never creates an account: an unknown one is a 404. With `admits`, a request whose principal is
not admitted to the account gets that same 404, decided before the account's file is opened.
"""

from __future__ import annotations

import inspect
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
from starlette.concurrency import run_in_threadpool
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
from .web.operator import scrape_router, unguarded

_current: ContextVar[Account | None] = ContextVar("lith_account", default=None)


def path_account(account: str = PathParam(description="the account's name")) -> str:
    """The default way to find the account: the `{account}` parameter of the route's path."""
    return account


Admits = Callable[..., bool | Awaitable[bool]]
"""`admits(principal, account, **dependencies)`: whether the principal may use the account."""


def not_found() -> HTTPException:
    """The answer to an account the request may not use: one that does not exist, or one its
    principal is not admitted to. It names nothing, not even the account, so the two read the same."""
    return HTTPException(404, "no such account")


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
    (a subdomain, the session), with `prefix=""`.

    `admits(principal, account)` (with `identity=`, the app's dependency giving the principal)
    says whether the principal may use the account; it runs for every request on the router,
    before the account opens, and a refusal answers what an unknown account answers. Without
    it, every account is open to anyone who can reach it. Any other keyword is a `Lith`
    setting, the same for every account; `backup_folder` holds one sub-folder per account, and
    `replica` may name the account as `{account}` (one Litestream process per open account).
    """

    @settings.checked(forward=Lith.__init__)  # any other keyword is a Lith setting
    def __init__(
        self,
        folder: str | Path,
        *,
        migrations: str | Path | None = None,
        prefix: str = "/a/{account}",
        account: Callable[..., str | Awaitable[str]] | None = None,
        admits: Admits | None = None,
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
        name_of = account or path_account
        # The probe's `principal` wraps the same identity as the web layer's below: FastAPI runs
        # the identity itself once per request however many wrappers ask for it.
        if admits is not None:
            if probe.web.settings.identity is None:
                raise SettingError(
                    "admits needs identity= (the app's dependency giving the principal): without it "
                    "every request is anonymous and admits would be asked about nobody"
                )
            name_of = self._admission(name_of, admits, probe.principal)
        self.current = self._resolver(name_of)
        router = APIRouter(
            prefix=prefix, dependencies=[Depends(self.current)], include_in_schema=False, lifespan=self.lifespan
        )
        # The same web layer as one Lith's, its engine the request's account's.
        self.web = WebLayer(
            probe.web.settings, current=self._engine_dependency(), engine_of=_engine_of, views=self.views,
            router=router, stream_path="/lith/stream",
        )
        self.router = self.web.router
        self.writer = self.web.writer
        self.encoder = self.web.encoder
        self.same_origin = self.web.same_origin
        self.principal = self.web.principal
        self.datastar = self.web.datastar  # the script and its notice, as `lith.datastar()`
        self.db = self._db_dependency()
        self._serving: FastAPI | None = None
        self._metrics_router: APIRouter | None = None

    # `Depends(accounts.unguarded)`: the scrape open to anyone, on purpose.
    unguarded = staticmethod(unguarded)

    @property
    def metrics_router(self) -> APIRouter:
        """`GET /lith/metrics`: every account's metrics in one scrape, off until the app
        includes it with its guard (as `lith.metrics_router`)."""
        if self._metrics_router is None:
            metrics = self.metrics
            self._metrics_router = scrape_router(
                metrics.scrape, metrics.content_type, "/lith", included_as="accounts.metrics_router"
            )
        return self._metrics_router

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

    def _admission(
        self, name_of: Callable[..., Any], admits: Admits, principal: Callable[..., Any]
    ) -> Callable[..., Awaitable[str]]:
        """A dependency giving the request's account name once `admits` has let its principal in.

        `admits` is called like a FastAPI dependency: its first two parameters are the
        principal and the account's name, and FastAPI resolves any others (`Depends(...)`, a
        header), so a membership can be read through the app's own database dependency. A
        plain `def` runs in the thread pool, as FastAPI runs a plain dependency.
        """
        dependencies = _dependencies_of(admits)
        # A function, or an object whose __call__ is one.
        asynchronous = inspect.iscoroutinefunction(admits) or inspect.iscoroutinefunction(type(admits).__call__)

        async def admitted(lith_principal: Principal, lith_account: str, **given: Any) -> str:
            try:
                self.path(lith_account)  # admits is only asked about a name that can be an account's
            except UnknownAccount:
                raise not_found() from None
            if asynchronous:
                allowed = await admits(lith_principal, lith_account, **given)  # type: ignore[misc]
            else:
                allowed = await run_in_threadpool(admits, lith_principal, lith_account, **given)
            if allowed is True:
                return lith_account
            if allowed is False:
                raise not_found()
            raise LithError(f"admits {_name(admits)} returned {type(allowed).__name__}: it must return True or False")

        own = (
            inspect.Parameter("lith_principal", inspect.Parameter.KEYWORD_ONLY, default=Depends(principal)),
            inspect.Parameter("lith_account", inspect.Parameter.KEYWORD_ONLY, default=Depends(name_of)),
        )
        clash = {p.name for p in own} & {p.name for p in dependencies}
        if clash:
            raise SettingError(f"admits {_name(admits)}: the parameter names {sorted(clash)} are taken")
        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in dependencies]
        admitted.__signature__ = inspect.Signature([*own, *keyword])  # type: ignore[attr-defined]
        # FastAPI reads string annotations in the module of the function it unwraps to: admits',
        # or for an object its __call__'s (an object has no module of its own to read them in).
        admitted.__wrapped__ = admits if hasattr(admits, "__globals__") else type(admits).__call__  # type: ignore[attr-defined]
        return admitted

    def _resolver(self, name_of: Callable[..., Any]) -> Callable[..., AsyncIterator[Account]]:
        async def current(request: Request, name: str = Depends(name_of)) -> AsyncIterator[Account]:
            """The request's account, open and held open until the response is done."""
            try:
                account = await self._acquire(name)
            except UnknownAccount:
                raise not_found() from None
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

    def body(self, command: type[Command]) -> Callable[..., Any]:
        """`Depends(accounts.body(Command))`: as `lith.body`, in the request's account."""
        return self.web.body(command)

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


def _dependencies_of(admits: Admits) -> list[inspect.Parameter]:
    """`admits`' parameters after the principal and the account's name: FastAPI's to fill."""
    if not callable(admits):
        raise SettingError(f"admits must be a function (principal, account) -> bool, not {admits!r}")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(inspect.signature(admits).parameters.values())
    if len(params) < 2 or any(p.kind not in positional for p in params[:2]):
        raise SettingError(
            f"admits {_name(admits)} must take the principal and the account's name as its first two "
            "parameters; FastAPI resolves any others"
        )
    for p in params[2:]:
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise SettingError(f"admits {_name(admits)}: FastAPI cannot fill its parameter {p.name!r}")
    return params[2:]


def _name(fn: Callable[..., Any]) -> str:
    return repr(getattr(fn, "__name__", fn))


def _engine_of(request: Request) -> Engine | None:
    account: Account | None = getattr(request.state, "lith_account", None)
    return account.engine if account is not None else None


_PREFIX = re.compile(r"(/([A-Za-z0-9._~-]+|\{account\}))+")
