"""What the pages say is what the code has: the version, and every name a page gives."""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import re
import tomllib

import fastapi_lith
from tests.support import REPO

DOCS = REPO / "docs"
SRC = DOCS / "src"


# -- the version -------------------------------------------------------------------------------


def test_the_version_has_one_source_and_the_changelog_names_it() -> None:
    """pyproject's version is `fastapi_lith.__version__`, the version of CHANGELOG's top section."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fastapi_lith.__version__"}
    top = re.search(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert top is not None
    named = re.fullmatch(r"Unreleased \((\d+\.\d+\.\d+)\)|(\d+\.\d+\.\d+)\b.*", top.group(1))
    assert named is not None, f"CHANGELOG's top section names no version: {top.group(0)!r}"
    assert fastapi_lith.__version__ == (named.group(1) or named.group(2))


# -- every name a page gives -------------------------------------------------------------------

PAGES = [*sorted(DOCS.glob("*.md")), REPO / "README.md", REPO / "AGENTS.md", *sorted(REPO.glob("examples/*/README.md"))]
# Backticked capitalised words on the pages that are not Python names of this repository.
NOT_PYTHON = {
    "CommandClass",  # a placeholder in a signature
    "Client",  # httpx's, in `Client(transport=...)`
    "GZipMiddleware",  # Starlette's, which the pages warn against
    "Host", "Origin",  # HTTP headers
    "Infinity",  # JavaScript, in a Datastar option
    "SQLite",  # in an error message
    "TimeoutStopSec",  # systemd's
}  # fmt: skip


def names_in_the_code() -> set[str]:
    """Every name the library, the examples and the docs' apps define or import."""
    names: set[str] = set()
    for path in [*REPO.glob("fastapi_lith/**/*.py"), *REPO.glob("examples/**/*.py"), *SRC.glob("**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def resolves(dotted: str) -> bool:
    """`fastapi_lith.ops` (a module) or `fastapi_lith.backends.sqlite.db.open_sqlite` (a name in one)."""
    module, _, attr = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attr) or importlib.util.find_spec(dotted) is not None
    except ImportError:
        return False


def test_every_name_a_page_gives_exists() -> None:
    """A class, a function or a module path on a page is one the code has: renamed, the page follows."""
    code = names_in_the_code() | set(dir(builtins)) | NOT_PYTHON
    missing: list[str] = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(REPO)
        for module, bracketed, names in re.findall(
            r"^\s*from (fastapi_lith[\w.]*) import (?:\(([^)]*)\)|([\w, ]+))", text, re.M
        ):
            imported = importlib.import_module(module)
            for name in re.findall(r"\w+", bracketed or names):
                if not hasattr(imported, name):
                    missing.append(f"{where}: {module}.{name}")
        for span in re.findall(r"`([^`\n]+)`", text):
            for dotted in re.findall(r"\bfastapi_lith(?:\.\w+)+", span):
                if not resolves(dotted):
                    missing.append(f"{where}: {dotted}")
            # Capitalised words that stand alone: not in a header (`Vary: Accept-Encoding`), a path or
            # a systemd setting (`KillMode=mixed`)
            for name in re.findall(r"(?<![\w./-])([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(?![\w/=:-])", span):
                if name not in code:
                    missing.append(f"{where}: {name} in `{span}`")
    assert not missing, "\n".join(missing)
