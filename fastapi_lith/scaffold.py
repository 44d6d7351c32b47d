"""Write a new project from the template beside this module (`python -m fastapi_lith new`).

The template is the folder `template/`: every `*.tmpl` file, with `{{name}}`, `{{package}}`
and `{{lith_version}}` filled in; `__package__` in a path becomes the project's package and a
leading `dot-` a leading dot.

fastapi-lith is not on PyPI, so the project carries its wheel: `wheels/`, committed with it,
where `pip install --find-links wheels` finds the exact version the project pins. The wheel is
built from the checkout `new` runs from, or else repacked from the installed files.
"""

from __future__ import annotations

import base64
import hashlib
import keyword
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from pathlib import Path

from . import __version__
from .exceptions import ProjectError

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


def _checkout() -> Path | None:
    """The source checkout this module runs from, if it does."""
    checkout = Path(__file__).resolve().parent.parent
    try:
        if 'name = "fastapi-lith"' in (checkout / "pyproject.toml").read_text(encoding="utf-8"):
            return checkout
    except OSError:
        pass
    return None


def lith_wheel(into: Path) -> Path:
    """Write fastapi-lith's wheel, this version, into `into`; returns its path."""
    into.mkdir(parents=True, exist_ok=True)
    checkout = _checkout()
    if checkout is None:
        return _repack(metadata.distribution("fastapi-lith"), into)
    with tempfile.TemporaryDirectory(prefix="lith-wheel-") as tmp:
        # A clean copy: setuptools' build/ folder in a checkout can hold files since deleted.
        source = Path(tmp) / "src"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(checkout / name, source / name)
        shutil.copytree(checkout / "fastapi_lith", source / "fastapi_lith",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into), str(source)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise ProjectError(f"could not build fastapi-lith's wheel from {checkout}:\n{done.stderr}")
    (wheel,) = into.glob(f"fastapi_lith-{__version__}-*.whl")
    return wheel


def _repack(dist: metadata.Distribution, into: Path) -> Path:
    """The wheel of an installed, pure-Python distribution, from the files its RECORD lists."""
    info = f"fastapi_lith-{dist.version}.dist-info"
    wheel = into / f"fastapi_lith-{dist.version}-py3-none-any.whl"
    skip = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for file in dist.files or ():
            name = file.as_posix()
            if "__pycache__" in name or name.startswith("..") or (name.startswith(info) and file.name in skip):
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        records.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel


def render_text(text: str, *, name: str, package: str) -> str:
    return (
        text.replace("{{name}}", name)
        .replace("{{package}}", package)
        .replace("{{lith_version}}", __version__)
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
    written.append(lith_wheel(root / "wheels"))
    return written


