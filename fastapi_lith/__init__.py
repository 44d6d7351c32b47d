"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar.

Everything an app needs is here, the parts it may replace too (`Hub`, `Readers`, a feed, an
encoder) and, for scripts, `open_sqlite` / `migrate` / `open_backend`; other modules are the
library's own, except `fastapi_lith.testing` (virtual tabs) and `fastapi_lith.ops` (backups).
"""

from .account_pool import ACCOUNT_NAME, Account
from .accounts import Accounts
from .backends import open_backend
from .backends.sqlite.db import SqliteReaders as Readers
from .backends.sqlite.db import migrate, open_sqlite
from .backends.sqlite.feed import SqliteFeed
from .backends.sqlite.writer import SqliteWriter as Writer
from .engine.commands import Command, FromServer, TabCommand, TabId
from .engine.db import Db
from .engine.encoders import (
    BrotliEncoder,
    Encoder,
    GzipEncoder,
    IdentityEncoder,
    ZstdEncoder,
    make_encoder,
    negotiate,
)
from .engine.feed import Feed, LocalFeed
from .engine.frames import Frame
from .engine.hub import Hub
from .engine.streams import Stream
from .engine.tx import Tx
from .engine.views import fragment
from .exceptions import (
    AccessDenied,
    AccountUnavailable,
    AlreadyRunning,
    BackupError,
    BadParameter,
    CommandError,
    DatabaseError,
    EncoderClosed,
    FirstAttemptFailed,
    InUse,
    LithError,
    MigrationError,
    MissingParameter,
    NotOneRow,
    NotRunning,
    OutcomeLost,
    OutcomeRefused,
    ProjectError,
    Rejected,
    ReplicaError,
    SettingError,
    StorageError,
    UnknownAccount,
    ViewError,
    WriterClosed,
)
from .lith import Lith
from .ops.metrics import Metrics
from .web.forms import form_fields, send_form
from .web.guard import MaxBody
from .web.headers import SecurityHeaders, content_security_policy
from .web.page import DATASTAR_CDN, delegate, new_tab, pending, send, tab_signals

__all__ = [
    # the app, its commands and views
    "Lith", "Command", "TabCommand", "TabId", "Rejected", "Tx", "Db", "Writer", "fragment",
    "MaxBody", "FromServer",
    # the page's side of a tab
    "new_tab", "tab_signals", "send", "delegate", "pending", "DATASTAR_CDN",
    # a form or an upload: its tab and op as fields
    "form_fields", "send_form",
    # a production page's headers
    "SecurityHeaders", "content_security_policy",
    # what the hub sends a tab
    "Frame", "Stream",
    # what an operator scrapes: `lith.metrics`, `app.include_router(lith.metrics_router, ...)`
    "Metrics",
    # one database per account
    "Accounts", "Account", "ACCOUNT_NAME",
    # the parts an app may replace: `Lith(..., hub=, readers=, feed=)`, `lith.encoder`
    "Hub", "Readers", "Feed", "LocalFeed", "SqliteFeed",
    "Encoder", "IdentityEncoder", "ZstdEncoder", "BrotliEncoder", "GzipEncoder", "make_encoder", "negotiate",
    # for scripts: a database opened and migrated as the app does
    "open_sqlite", "migrate", "open_backend",
    # errors: every one is a LithError
    "LithError", "AccessDenied", "AccountUnavailable", "AlreadyRunning", "BackupError", "BadParameter",
    "CommandError", "DatabaseError", "EncoderClosed", "FirstAttemptFailed", "InUse", "MigrationError",
    "MissingParameter", "NotOneRow", "NotRunning", "OutcomeLost", "OutcomeRefused", "ProjectError", "ReplicaError",
    "SettingError", "StorageError", "UnknownAccount", "ViewError", "WriterClosed",
]  # fmt: skip
__version__ = "0.2.0"
