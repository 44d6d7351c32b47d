"""The command line (`python -m fastapi_lith`): backups, restores, migrations and new projects from a shell.

    python -m fastapi_lith backup  DB DEST            # DEST: a file, or a folder for DB-STAMP.db
    python -m fastapi_lith verify  BACKUP [--json]
    python -m fastapi_lith restore BACKUP DB          # refuses while an app holds DB open
    python -m fastapi_lith migrate DB --migrations DIR
    python -m fastapi_lith status  DB --migrations DIR
    python -m fastapi_lith new     DIR [--name NAME]

Exit status: 0 done, 1 refused or failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__, db
from .exceptions import LithError
from .ops import backup, holders, restore, verify
from .ops.files import open_ro
from .scaffold import new_project, package_name


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (LithError, db.MigrationError) as exc:  # a MigrationError is a LithError too
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
    migrations = db.find_migrations(args.migrations)  # a missing folder fails before any file is made
    if args.db.exists():
        busy = holders(args.db)
        if busy:
            raise db.MigrationError(
                f"{args.db} is open in another process ({'; '.join(busy)}): a running app migrates "
                f"itself when it starts; stop it to migrate from the shell"
            )
    conn = db.connect(args.db)
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
    migrations = db.find_migrations(args.migrations)
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


# --------------------------------------------------------------------------- new projects


def cmd_new(args: argparse.Namespace) -> int:
    files = new_project(args.dir, name=args.name)
    package = package_name(args.name or args.dir.resolve().name)
    print(f"wrote {len(files)} files into {args.dir} (package {package}):")
    for path in files:
        print(f"  {path.relative_to(args.dir)}")
    print(f"\nnext:\n  cd {args.dir}\n  make test      # a venv, the tests (a browser test with chromium)\n"
          f"  make run       # http://127.0.0.1:8000")  # fmt: skip
    return 0

