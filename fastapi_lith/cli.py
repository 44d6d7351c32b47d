"""The command line (`python -m fastapi_lith`): backups, restores, migrations and new projects from a shell.

    python -m fastapi_lith backup  DB DEST            # DEST: a file, or a folder for DB-STAMP.db
    python -m fastapi_lith verify  BACKUP [--json]
    python -m fastapi_lith restore BACKUP DB          # refuses while an app holds DB open
    python -m fastapi_lith migrate DB --migrations DIR
    python -m fastapi_lith status  DB --migrations DIR
    python -m fastapi_lith new     DIR [--name NAME]
    python -m fastapi_lith check   APP                # module:attr imports, as uvicorn will
    python -m fastapi_lith serve   APP [--server granian] [--fd N] [--workers N]  # as the deploy unit does
    python -m fastapi_lith replica status|restore|verify DB REPLICA
    python -m fastapi_lith accounts list|backup|verify|restore|migrate ...   # one file per account

Exit status: 0 done, 1 refused or failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__
from .backends.sqlite import db
from .engine.db import find_migrations
from .exceptions import LithError, MigrationError, ReplicaError
from .ops import InUse, backup, files, holders, litestream, restore, verify
from .ops.files import open_ro
from .ops.replica import Replica
from .ops.replica_check import check_replica, last_check
from .scaffold import new_project, package_name
from .serving import BACKLOG, GRACEFUL_SECONDS, SERVERS, Serving, serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except LithError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:
        print(f"error: SQLite: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastapi_lith",
        description="Backups, restores, migrations and new projects for fastapi-lith apps.",
    )
    parser.add_argument("--version", action="version", version=f"fastapi-lith {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")

    p = sub.add_parser("backup", help="copy a live database (safe while the app runs)")
    p.add_argument("db", metavar="DB", type=Path)
    p.add_argument("dest", metavar="DEST", help="a file, or a folder (ending in /, or existing) for DB-STAMP.db")
    p.add_argument("--method", choices=("backup", "vacuum"), default="backup",
                   help="backup: SQLite's online backup API, fastest (default); "
                        "vacuum: VACUUM INTO, a compacted copy")  # fmt: skip
    p.set_defaults(func=cmd_backup)

    p = sub.add_parser("verify", help="check a copy: version, size, integrity, checksum")
    p.add_argument("backup", metavar="BACKUP", type=Path)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("restore", help="replace a database by a copy (the app must be stopped)")
    p.add_argument("backup", metavar="BACKUP", type=Path)
    p.add_argument("db", metavar="DB", type=Path)
    p.add_argument("--no-keep", action="store_true",
                   help="delete the replaced database instead of keeping it as DB.replaced-STAMP")  # fmt: skip
    p.set_defaults(func=cmd_restore)

    for name, func, text in (
        ("migrate", cmd_migrate, "apply pending migrations (the app must be stopped)"),
        ("status", cmd_status, "list applied and pending migrations"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("db", metavar="DB", type=Path)
        p.add_argument("--migrations", metavar="DIR", type=Path, required=True,
                       help="the folder of numbered .sql files")  # fmt: skip
        p.set_defaults(func=func)

    p = sub.add_parser("replica", help="continuous replication (Litestream): status, restore, verify")
    actions = p.add_subparsers(metavar="ACTION")
    for name, func, text in (
        ("status", cmd_replica_status, "the replica's newest position against the live one, and the last check"),
        ("restore", cmd_replica_restore, "restore DB from the replica (the app must be stopped)"),
        ("verify", cmd_replica_verify, "restore the latest replica into a temporary file and compare it with DB"),
    ):
        q = actions.add_parser(name, help=text)
        q.add_argument("db", metavar="DB", type=Path)
        q.add_argument("url", metavar="REPLICA", help="the replica's URL, as given to Lith(replica=...)")
        q.set_defaults(func=func)
        if name == "restore":
            q.add_argument("--no-keep", action="store_true", help="delete the replaced database instead of keeping it")
        if name == "verify":
            q.add_argument("--sync-interval", type=float, default=1.0, metavar="SECONDS",
                           help="the app's replica_sync_interval: how far the replica may trail (default 1)")  # noqa: E501 # fmt: skip
            q.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=lambda args, usage=p.print_help: usage(sys.stderr) or 2)  # no ACTION given

    add_accounts_commands(sub)

    p = sub.add_parser("check", help="import an ASGI app as uvicorn will (the unit runs it before the workers)")
    p.add_argument("app", metavar="APP", help="module:attribute, e.g. myapp.app:app")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("serve", help="run APP as the deploy unit does, with uvicorn or granian")
    p.add_argument("app", metavar="APP", help="module:attribute, e.g. myapp.app:app")
    p.add_argument("--server", choices=SERVERS, default="uvicorn",
                   help="uvicorn (default) or granian (pip install 'fastapi-lith[granian]')")  # fmt: skip
    p.add_argument("--host", help="default 127.0.0.1")
    p.add_argument("--port", type=int, help="default 8000")
    p.add_argument("--fd", type=int, help="serve on this listening socket (systemd's: 3) instead of a port")
    p.add_argument("--workers", type=int, default=1, help="processes; several share their metrics")
    p.add_argument("--backlog", type=int, default=BACKLOG, help=f"the listen queue (default {BACKLOG})")
    p.add_argument("--timeout-graceful-shutdown", type=int, default=GRACEFUL_SECONDS, metavar="SECONDS",
                   help=f"the bound on a stop after SIGTERM (default {GRACEFUL_SECONDS})")  # fmt: skip
    p.add_argument("--forwarded-allow-ips", default="127.0.0.1", metavar="IPS",
                   help="whose X-Forwarded-Proto and -For to believe ('*': a unix socket only a proxy reaches)")  # noqa: E501 # fmt: skip
    p.add_argument("--log-config", type=Path, metavar="FILE", help="a dictConfig JSON file (deploy/logging.json)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("new", help="write a new project")
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("--name", help="the project's name (default: the folder's name)")
    p.set_defaults(func=cmd_new)
    return parser


# --------------------------------------------------------------------------- backups


def cmd_backup(args: argparse.Namespace) -> int:
    info = backup(args.db, args.dest, method=args.method)
    print(f"backed up {args.db} to {info.summary()}")
    print(f"sha256 {info.sha256}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify(args.backup)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1


def cmd_restore(args: argparse.Namespace) -> int:
    info = restore(args.backup, args.db, keep_replaced=not args.no_keep)
    print(info.summary())
    return 0


# --------------------------------------------------------------------------- migrations


def cmd_migrate(args: argparse.Namespace) -> int:
    migrations = find_migrations(args.migrations)  # a missing folder fails before any file is made
    if args.db.exists():
        busy = holders(args.db)
        if busy:
            raise MigrationError(
                f"{args.db} is open in another process ({'; '.join(busy)}): a running app migrates "
                f"itself when it starts; stop it to migrate from the shell"
            )
    conn = db.open_sqlite(args.db)
    try:
        before, after = db.migrate(conn, args.migrations)
    finally:
        conn.close()
    if before == after:
        print(f"{args.db}: already at version {after}, nothing to apply")
    else:
        ran = [m.path.name for m in migrations if before < m.version <= after]
        print(f"{args.db}: migrated from version {before} to {after} ({', '.join(ran)})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    migrations = find_migrations(args.migrations)
    if args.db.exists():
        with open_ro(args.db) as conn:
            version = db.user_version(conn)
        where = str(args.db)
    else:
        version, where = 0, f"{args.db} (no such file yet)"
    newest = migrations[-1].version if migrations else 0
    pending = [m for m in migrations if m.version > version]
    if version > newest:
        state = f"NEWER than the newest migration ({newest}): this app would refuse to start"
    elif pending:
        state = f"{len(pending)} pending"
    else:
        state = "up to date"
    print(f"{where}: version {version}; newest migration {newest}; {state}")
    for m in migrations:
        print(f"  {'pending' if m.version > version else 'applied'}  {m.path.name}")
    return 1 if version > newest else 0


# --------------------------------------------------------------------------- replication


def cmd_replica_status(args: argparse.Namespace) -> int:
    litestream.check_environment(args.url)
    replicated = litestream.replica_position(args.url)
    local = litestream.local_position(args.db)
    print(f"replica     {litestream.redact(args.url)}")
    print(f"replicated  {_position(replicated) if replicated else 'nothing yet'}")
    print(f"live        {_position(local) if local else 'Litestream has not read this database yet'}")
    if replicated and local:
        behind = local.txid - replicated.txid
        if behind > 0 and replicated.at is not None:
            age = (datetime.now(timezone.utc) - replicated.at).total_seconds()
            print(f"lag         {behind} transactions; the newest replicated one is {age:.0f} s old")
        else:
            print("lag         none: the replica holds every change Litestream has read")
    last = last_check(args.db)
    if last is None:
        print("last check  none yet (python -m fastapi_lith replica verify DB REPLICA)")
    else:
        print(f"last check  {'ok' if last.ok else 'FAILED'} at {last.at}" + "".join(f"\n  {p}" for p in last.problems))
    return 0


def _position(pos: litestream.Position) -> str:
    return f"txid {pos.txid:016x}" + (f" at {pos.at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC" if pos.at else "")


def cmd_replica_restore(args: argparse.Namespace) -> int:
    replica = Replica(args.db, args.url, check_every=None)
    if not args.db.exists():  # a fresh disk: what the app does before it opens the database
        if not replica.prepare():
            raise ReplicaError(f"{litestream.redact(args.url)} holds no copy of the database")
        print(f"restored {args.db} from {litestream.redact(args.url)} ({files.mb(args.db.stat().st_size)})")
        return 0
    busy = holders(args.db)  # before a long download, not after
    if busy:
        raise InUse(
            f"{args.db} is open in another process ({'; '.join(busy)}): stop the app first; nothing was replaced"
        )
    replica.prepare()
    tmp = files.temp_beside(args.db, "replica")
    try:
        if not litestream.restore(args.url, tmp, binary=replica.binary):
            raise ReplicaError(f"{litestream.redact(args.url)} holds no copy of the database")
        print(restore(tmp, args.db, keep_replaced=not args.no_keep).summary())
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    return 0


def cmd_replica_verify(args: argparse.Namespace) -> int:
    litestream.check_environment(args.url)
    result = check_replica(args.db, args.url, sync_interval=args.sync_interval)
    print(json.dumps(asdict(result), indent=2) if args.json else "\n".join(result.lines()))
    return 0 if result.ok else 1


# --------------------------------------------------------------------------- new projects


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 1 if the app cannot import. uvicorn with `--workers` respawns a worker that dies at
    import forever and exits 0 only when stopped, so systemd would never see the release fail."""
    import traceback

    from uvicorn.importer import import_from_string

    try:
        import_from_string(args.app)
    except BaseException as exc:  # a SystemExit at import is a broken release too
        traceback.print_exception(exc)
        print(f"error: {args.app} cannot be imported: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {args.app} imports")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.fd is not None and (args.host is not None or args.port is not None):
        print("error: --fd serves on a socket given to this process: no --host or --port with it", file=sys.stderr)
        return 2
    serve(serving_of(args))
    return 0


def serving_of(args: argparse.Namespace) -> Serving:
    """What `serve`'s command line asks for."""
    where = {name: value for name, value in (("host", args.host), ("port", args.port)) if value is not None}
    return Serving(
        args.app, server=args.server, fd=args.fd, workers=args.workers, backlog=args.backlog,
        graceful=args.timeout_graceful_shutdown, forwarded_allow_ips=args.forwarded_allow_ips,
        log_config=args.log_config, **where,
    )  # fmt: skip


def cmd_new(args: argparse.Namespace) -> int:
    files = new_project(args.dir, name=args.name)
    package = package_name(args.name or args.dir.resolve().name)
    print(f"wrote {len(files)} files into {args.dir} (package {package}):")
    for path in files:
        print(f"  {path.relative_to(args.dir)}")
    print(f"\nnext:\n  cd {args.dir}\n  make test      # a venv, the tests (a browser test with chromium)\n"
          f"  make run       # http://127.0.0.1:8000")  # fmt: skip
    return 0


# --------------------------------------------------------------------------- accounts
#
# An `Accounts` folder holds NAME.db per account; its copies go to DEST/NAME/NAME-STAMP.db, the
# layout `backup_folder` uses. Every action takes all accounts, or those named by --account.


def add_accounts_commands(sub: Any) -> None:
    p = sub.add_parser("accounts", help="one database per account: list, backup, verify, restore, migrate")
    actions = p.add_subparsers(metavar="ACTION")
    q = actions.add_parser("list", help="the accounts in FOLDER, with their version and size")
    q.add_argument("folder", metavar="FOLDER", type=Path)
    q.set_defaults(func=cmd_accounts_list)
    q = actions.add_parser("backup", help="copy each account (safe while the app runs) to DEST/NAME/")
    q.add_argument("folder", metavar="FOLDER", type=Path)
    q.add_argument("dest", metavar="DEST", type=Path)
    q.set_defaults(func=cmd_accounts_backup)
    q = actions.add_parser("verify", help="check the newest copy of each account in DEST")
    q.add_argument("dest", metavar="DEST", type=Path)
    q.add_argument("--json", action="store_true", help="print the reports as JSON")
    q.set_defaults(func=cmd_accounts_verify)
    q = actions.add_parser("restore", help="put back the newest copy of each account (refused for one held open)")
    q.add_argument("dest", metavar="DEST", type=Path)
    q.add_argument("folder", metavar="FOLDER", type=Path)
    q.add_argument("--no-keep", action="store_true", help="delete each replaced database instead of keeping it")
    q.set_defaults(func=cmd_accounts_restore)
    q = actions.add_parser("migrate", help="apply pending migrations to each account not held open")
    q.add_argument("folder", metavar="FOLDER", type=Path)
    q.add_argument("--migrations", metavar="DIR", type=Path, required=True, help="the folder of numbered .sql files")
    q.set_defaults(func=cmd_accounts_migrate)
    for q in actions.choices.values():
        q.add_argument("--account", metavar="NAME", action="append", dest="accounts",
                       help="only this account (repeat for several); default: every account")  # fmt: skip
    p.set_defaults(func=lambda args, usage=p.print_help: usage(sys.stderr) or 2)


def _accounts_in(folder: Path, only: list[str] | None, *, copies: bool = False) -> list[str]:
    from .account_pool import ACCOUNT_NAME, SUFFIX

    if not folder.is_dir():
        raise LithError(f"{folder}: no such folder")
    found = sorted(
        p.name if copies else p.stem
        for p in (folder.iterdir() if copies else folder.glob(f"*{SUFFIX}"))
        if ACCOUNT_NAME.fullmatch(p.name if copies else p.stem) and (p.is_dir() if copies else p.is_file())
    )
    if only:
        missing = sorted(set(only) - set(found))
        if missing:
            raise LithError(f"no account {', '.join(missing)} in {folder}")
        return [name for name in found if name in only]
    return found


def _newest_copy(dest: Path, name: str) -> Path:
    pattern = re.compile(rf"^{re.escape(name)}-{files.STAMP_RE}\.db$")
    found = sorted(p for p in (dest / name).iterdir() if pattern.match(p.name))
    if not found:
        raise LithError(f"{dest / name}: no copy of account {name}")
    return found[-1]


def _each(names: list[str], action: Callable[[str], str]) -> int:
    """Run `action` for every account, on past a failure; exit 1 if any failed."""
    failed = 0
    for name in names:
        try:
            print(f"{name}: {action(name)}")
        except (LithError, sqlite3.Error) as exc:
            failed += 1
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
    print(f"{len(names) - failed} of {len(names)} accounts done" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


def cmd_accounts_list(args: argparse.Namespace) -> int:
    for name in _accounts_in(args.folder, args.accounts):
        path = args.folder / f"{name}.db"
        with open_ro(path) as conn:
            version = db.user_version(conn)
        print(f"{name}  version {version}  {files.mb(path.stat().st_size)}")
    return 0


def cmd_accounts_backup(args: argparse.Namespace) -> int:
    names = _accounts_in(args.folder, args.accounts)
    return _each(names, lambda name: backup(args.folder / f"{name}.db", f"{args.dest / name}/").summary())


def cmd_accounts_verify(args: argparse.Namespace) -> int:
    names = _accounts_in(args.dest, args.accounts, copies=True)
    reports = {name: verify(_newest_copy(args.dest, name)) for name in names}
    if args.json:
        print(json.dumps({name: r.as_dict() for name, r in reports.items()}, indent=2))
    else:
        for report in reports.values():
            print("\n".join(report.lines()))
    bad = [name for name, r in reports.items() if not r.ok]
    print(f"{len(names) - len(bad)} of {len(names)} copies ok" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def cmd_accounts_restore(args: argparse.Namespace) -> int:
    names = _accounts_in(args.dest, args.accounts, copies=True)
    args.folder.mkdir(parents=True, exist_ok=True)
    return _each(names, lambda name: restore(
        _newest_copy(args.dest, name), args.folder / f"{name}.db", keep_replaced=not args.no_keep
    ).summary())  # fmt: skip


def cmd_accounts_migrate(args: argparse.Namespace) -> int:
    find_migrations(args.migrations)  # a missing folder fails before any file is touched
    names = _accounts_in(args.folder, args.accounts)

    def migrate(name: str) -> str:
        path = args.folder / f"{name}.db"
        busy = holders(path)
        if busy:
            raise MigrationError(f"open in another process ({'; '.join(busy)}): the app migrates it when it opens it")
        conn = db.open_sqlite(path)
        try:
            before, after = db.migrate(conn, args.migrations)
        finally:
            conn.close()
        return f"already at version {after}" if before == after else f"migrated from version {before} to {after}"

    return _each(names, migrate)
