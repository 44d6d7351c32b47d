"""Write a new project from the template beside this module (`python -m fastapi_lith new`).

The template is the folder `template/`: every `*.tmpl` file, with `{{name}}`, `{{package}}`,
`{{lith_version}}` and `{{lith_source}}` filled in; `__package__` in a path becomes the
project's package and a leading `dot-` a leading dot.
"""

from __future__ import annotations

import keyword
import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from . import __version__
from .exceptions import LithError


class ProjectError(LithError):
    """A project could not be written: a bad name, a folder in the way, a missing template."""


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


