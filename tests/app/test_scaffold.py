"""`python -m fastapi_lith new`: the project it writes installs, and its own tests pass."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest

from fastapi_lith import __version__
from fastapi_lith.cli import main
from fastapi_lith.scaffold import render_text, template_files
from tests.support import REPO
from tests.support.browser import Server, ensure_datastar_js, find_chromium

PLACEHOLDER = re.compile(r"\{\{(name|package|lith_version)\}\}")
EXPECTED = {
    ".ci/run", ".gitignore", "Makefile", "README.md", "pyproject.toml",
    "guestbook/__init__.py", "guestbook/app.py", "guestbook/signin.py", "guestbook/migrations/0001_init.sql",
    "tests/conftest.py", "tests/test_app.py", "tests/test_browser.py",
    "deploy/Caddyfile", "deploy/deploy.sh", "deploy/env.example", "deploy/lith@.service", "deploy/lith@.socket",
    "deploy/logging.json",
}  # fmt: skip
WHEEL = f"wheels/fastapi_lith-{__version__}-py3-none-any.whl"  # the version pyproject.toml pins


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("new") / "guestbook"
    assert main(["new", str(root)]) == 0
    return root


def test_the_project_has_every_part_and_no_placeholder_left(project: Path) -> None:
    files = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
    assert files == EXPECTED | {WHEEL}
    assert f'"fastapi-lith=={__version__}"' in (project / "pyproject.toml").read_text()
    for rel in EXPECTED:
        text = (project / rel).read_text()
        assert not PLACEHOLDER.search(text), rel
    for rel in (".ci/run", "deploy/deploy.sh"):
        assert os.access(project / rel, os.X_OK), rel
    app = (project / "guestbook/app.py").read_text()
    # the same helpers as the examples: a tab command, its one-line route, the pending button
    for piece in ("class Sign(TabCommand)", 'lith.command(app, "/sign", Sign)', 'send("/sign")',
                  "h.button(pending())", "tab_signals(tab", "Backups(", '@app.get("/health"',
                  "identity=signed_in", "FromServer()", '"mine/{principal}"'):  # fmt: skip
        assert piece in app, piece
    compile(app, "app.py", "exec")


def test_the_deploy_files_are_the_repositorys(project: Path) -> None:
    """One source of truth: the template's copies of deploy/ may not drift from the repo's."""
    for name in ("lith@.service", "lith@.socket", "Caddyfile", "deploy.sh", "logging.json"):
        assert (project / "deploy" / name).read_bytes() == (REPO / "deploy" / name).read_bytes(), name
    (template,) = [t for rel, t in template_files() if rel == "deploy/env.example.tmpl"]
    example = render_text(template.read_text(), name="myapp", package="myapp")
    assert example == (REPO / "deploy" / "env.example").read_text()


def test_the_project_installs_and_its_tests_pass(project: Path, tmp_path: Path) -> None:
    # A venv that sees this environment (fastapi_lith and its dependencies, pytest, Playwright):
    # --system-site-packages reaches the base interpreter's, and a .pth file adds this one's.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]
    Path(purelib, "_lith_parent_env.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check", "-e", str(project)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    check = subprocess.run([python, "-c", "import guestbook.app, fastapi_lith; print(guestbook.app.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={**os.environ, "APP_SECRET": TEST_SECRET})  # fmt: skip
    assert check.stdout.strip() == str(project / "guestbook" / "app.py"), check.stderr

    # `make test`, with the venv made above standing in for the one `make install` would make
    (venv / ".installed").touch()
    env = {**os.environ, "DATASTAR_JS": str(ensure_datastar_js())}
    env.pop("PYTEST_CURRENT_TEST", None)
    done = subprocess.run(["make", "test", f"VENV={venv}"], cwd=project, capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # pytest's closing line; a `make` nested in ours adds "Leaving directory" after it
    summary = next(line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line))
    if find_chromium() is not None:
        assert re.search(r"\b8 passed\b", summary) and "skipped" not in summary, output
    else:
        assert re.search(r"\b5 passed, 1 skipped\b", summary), output
    assert not (project / "app.db").exists()  # the tests keep their databases elsewhere

    dry = subprocess.run(["make", "-n", "run", f"VENV={venv}"], cwd=project, capture_output=True, text=True)
    assert "-m fastapi_lith serve guestbook.app:app --server uvicorn " in dry.stdout  # as the unit serves
    dry = subprocess.run(["make", "-n", "run", f"VENV={venv}", "SERVER=granian"], cwd=project, capture_output=True,
                         text=True)  # fmt: skip
    assert "-m fastapi_lith serve guestbook.app:app --server granian " in dry.stdout
    assert subprocess.run(["bash", "-n", str(project / ".ci" / "run")]).returncode == 0


TEST_SECRET = "a secret for the tests alone"


@contextmanager
def signed_up(url: str, name: str) -> Iterator[httpx.Client]:
    """A client holding a new person's session cookie, as the browser has after signing up."""
    with httpx.Client(base_url=url, headers={"Sec-Fetch-Site": "same-origin"}, timeout=30) as client:
        answer = client.post("/signup", data={"name": name, "password": "correct horse battery"})
        assert answer.status_code == 303, answer.text
        yield client


def test_the_sign_in_is_the_todo_examples(project: Path) -> None:
    """One sign-in, written once: the template's file is the example's, byte for byte."""
    assert (project / "guestbook" / "signin.py").read_bytes() == (REPO / "examples" / "todos" / "signin.py").read_bytes()


def test_make_exists() -> None:
    assert shutil.which("make"), "the project template's Makefile needs make"


def test_the_projects_app_replicates_when_its_environment_names_a_replica(project: Path, tmp_path: Path) -> None:
    """What the deploy's env file sets (APP_REPLICA) reaches Litestream, and the health route says so."""
    db_path, replica = tmp_path / "data" / "app.db", f"file://{tmp_path / 'replica'}"
    server = Server("guestbook.app:app", cwd=project, log_path=tmp_path / "server.log", startup_timeout=60,
                    env={"APP_DB": str(db_path), "APP_BACKUPS": str(tmp_path / "backups"), "APP_REPLICA": replica,
                         "APP_SECRET": TEST_SECRET})  # fmt: skip
    headers = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}
    with server:
        health = httpx.get(f"{server.url}/health").json()
        assert health["replica"]["replicating"] is True, health
        with signed_up(server.url, "ada") as ada:
            signed = ada.post("/sign", json={"note": "hello", "tab": "t1", "op": 1}, headers=headers)
        assert signed.status_code == 204, signed.text
    restored = tmp_path / "restored.db"
    assert main(["replica", "restore", str(restored), replica]) == 0  # uploaded by the time it stopped
    with closing(sqlite3.connect(restored)) as conn:
        assert conn.execute("SELECT name, note FROM entry JOIN person ON person.id = entry.person").fetchall() == [
            ("ada", "hello")
        ]
