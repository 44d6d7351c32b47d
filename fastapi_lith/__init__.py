"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar.

Everything an app needs is here; other modules are the library's own, except
`fastapi_lith.testing` (virtual tabs), `fastapi_lith.ops` (backups) and, for scripts,
`fastapi_lith.backends.sqlite.db.open_sqlite` / `migrate`.
"""

from .account_pool import ACCOUNT_NAME, Account
from .accounts import Accounts
from .web.page import DATASTAR_CDN
from .lith import Lith
from .engine.commands import Command, Rejected, TabCommand, TabId
from .web.page import delegate, new_tab, pending, send, tab_signals
from .engine.db import Db
from .web.headers import SecurityHeaders, content_security_policy
from .exceptions import (
    AccountUnavailable,
    AlreadyRunning,
    BadParameter,
    DatabaseError,
    LithError,
    MigrationError,
    MissingParameter,
    NotOneRow,
    NotRunning,
    OutcomeLost,
    SettingError,
    StorageError,
    UnknownAccount,
    ViewError,
    WriterClosed,
)
from .web.forms import form_fields, send_form
from .web.guard import MaxBody
from .engine.frames import Frame
from .engine.streams import Stream
from .engine.views import fragment
from .engine.tx import Tx
from .backends.sqlite.writer import SqliteWriter as Writer

__all__ = [
    # the app, its commands and views
    "Lith", "Command", "TabCommand", "TabId", "Rejected", "Tx", "Db", "Writer", "fragment",
    "MaxBody",
    # the page's side of a tab
    "new_tab", "tab_signals", "send", "delegate", "pending", "DATASTAR_CDN",
    # a form or an upload: its tab and op as fields
    "form_fields", "send_form",
    # a production page's headers
    "SecurityHeaders", "content_security_policy",
    # what the hub sends a tab
    "Frame", "Stream",
    # one database per account
    "Accounts", "Account", "ACCOUNT_NAME",
    # errors: every one is a LithError
    "LithError", "AccountUnavailable", "AlreadyRunning", "BadParameter", "DatabaseError", "MigrationError",
    "MissingParameter", "NotOneRow", "NotRunning", "OutcomeLost", "SettingError", "StorageError", "UnknownAccount",
    "ViewError", "WriterClosed",
]  # fmt: skip
__version__ = "0.2.0"
