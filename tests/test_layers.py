"""The package's layers (docs/layout.md), kept by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the package found in `root`, with the contracts of `root`'s pyproject."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_package_keeps_its_layers_and_has_no_import_cycle() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 3 kept, 0 broken." in run.stdout, run.stdout


def test_a_cycle_or_the_web_in_the_engine_breaks_a_contract(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "fastapi_lith", tmp_path / "fastapi_lith", ignore=shutil.ignore_patterns("__pycache__"))
    engine = tmp_path / "fastapi_lith" / "engine"
    with (engine / "tx.py").open("a") as tx:  # the writer imports tx: a cycle, in a function
        tx.write("\n\ndef _later() -> None:\n    from . import writer  # noqa: F401\n")
    with (engine / "views.py").open("a") as views:  # the engine learning of the web
        views.write("\nif False:\n    import starlette  # noqa: F401\n")
    with (tmp_path / "fastapi_lith" / "backends" / "__init__.py").open("a") as backends:  # a layer reaching up
        backends.write("\nif False:\n    from ..web import dependency  # noqa: F401\n")
    run = lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Contracts: 0 kept, 3 broken." in run.stdout, run.stdout
    assert "fastapi_lith.engine.views -> starlette" in run.stdout
    assert "fastapi_lith.backends is not allowed to import fastapi_lith.web" in run.stdout
    assert ".tx -> .writer" in run.stdout or ".writer -> .tx" in run.stdout
