"""`python -m fastapi_lith`: backups, restores, migrations and new projects from a shell.

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
import keyword
import re
import sqlite3
import sys
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from . import __version__, db
from .backup import BackupError, _open_ro, backup, holders, restore, verify


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (BackupError, db.MigrationError, ProjectError) as exc:
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
            raise BackupError(
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
        with _open_ro(args.db) as conn:
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


class ProjectError(RuntimeError):
    pass


#: Files of the written project that must be executable.
EXECUTABLE = {".ci/run", "deploy/deploy.sh"}


def package_name(name: str) -> str:
    """The Python package of a project called `name`: `My Guestbook` -> `my_guestbook`."""
    package = re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()
    if not package:
        raise ProjectError(f"cannot make a Python package name out of {name!r}: pass --name")
    if package[0].isdigit():
        package = f"app_{package}"
    if keyword.iskeyword(package) or package in {"fastapi_lith", "tests", "test", "app", "deploy"}:
        raise ProjectError(f"{package!r} cannot be the package name: pass another --name")
    return package


def template_files() -> list[tuple[str, Traversable]]:
    """(relative path in the template, file) for every file of the project template."""
    out: list[tuple[str, Traversable]] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__":
                continue
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, rel + "/")
            elif child.name.endswith(".tmpl"):
                out.append((rel, child))

    root = resources.files("fastapi_lith") / "template"
    if not root.is_dir():
        raise ProjectError("the project template is missing from this installation of fastapi-lith")
    walk(root, "")
    return out


def render_path(rel: str, package: str) -> str:
    """`dot-ci/run.tmpl` -> `.ci/run`, `__package__/app.py.tmpl` -> `guestbook/app.py`."""
    parts = []
    for part in rel.removesuffix(".tmpl").split("/"):
        if part == "__package__":
            part = package
        elif part.startswith("dot-"):
            part = "." + part[4:]
        parts.append(part)
    return "/".join(parts)


def lith_source() -> str:
    """What a new project installs fastapi-lith from: this checkout when we run from one."""
    checkout = Path(__file__).resolve().parent.parent
    try:
        if 'name = "fastapi-lith"' in (checkout / "pyproject.toml").read_text(encoding="utf-8"):
            return str(checkout)
    except OSError:
        pass
    return f"fastapi-lith>={__version__}"


def render_text(text: str, *, name: str, package: str) -> str:
    return (
        text.replace("{{name}}", name)
        .replace("{{package}}", package)
        .replace("{{lith_version}}", __version__)
        .replace("{{lith_source}}", lith_source())
    )


def new_project(directory: str | Path, *, name: str | None = None) -> list[Path]:
    """Write the project template into `directory` (new or empty); returns the files written."""
    root = Path(directory)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ProjectError(f"{root} exists and is not an empty folder")
    name = name or root.resolve().name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}", name):
        raise ProjectError(f"{name!r}: a project name is letters, digits, spaces, '_', '.' and '-'")
    package = package_name(name)
    written = []
    for rel, source in template_files():
        path = root / render_path(rel, package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_text(source.read_text(encoding="utf-8"), name=name, package=package), encoding="utf-8")
        if path.relative_to(root).as_posix() in EXECUTABLE:
            path.chmod(0o755)
        written.append(path)
    return written


def cmd_new(args: argparse.Namespace) -> int:
    files = new_project(args.dir, name=args.name)
    package = package_name(args.name or args.dir.resolve().name)
    print(f"wrote {len(files)} files into {args.dir} (package {package}):")
    for path in files:
        print(f"  {path.relative_to(args.dir)}")
    print(f"\nnext:\n  cd {args.dir}\n  make test      # a venv, the tests (a browser test with chromium)\n"
          f"  make run       # http://127.0.0.1:8000")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
