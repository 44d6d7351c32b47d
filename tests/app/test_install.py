"""An install without the dev extras starts every example.

`make test` runs in a venv with the dev extras, and those pull in packages the library needs
too (Playwright brings greenlet, which `sqlalchemy.ext.asyncio` imports): a missing
dependency would pass every other test. Here `pip install .` goes into a fresh venv, no
extras, and each example runs from there under uvicorn: a command is posted and its frame read
off the stream.

A test rather than a step of `.ci/run`: it runs wherever the suite runs (`make test`), and it
reuses the suite's server harness.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.browser import Server

# Nothing of this process's environment may reach the bare venv: PYTHONPATH would put the
# checkout's fastapi_lith first.
BARE_ENV = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}


class VenvServer(Server):
    """uvicorn run by another venv's Python."""

    def __init__(self, python: Path, app: str, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self.python = python

    def command(self) -> list[str]:
        return [str(self.python), *super().command()[1:]]


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh venv with `pip install <this repository>` in it, and nothing else."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", str(REPO)], capture_output=True, text=True,
                          env=BARE_ENV, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return python


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory, bare_python: Path) -> Path:
    """A copy of examples/ away from the checkout, so that fastapi_lith comes from the venv."""
    root = tmp_path_factory.mktemp("apps")
    shutil.copytree(REPO / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__", "*.db*"))
    where = subprocess.run([bare_python, "-c", "import fastapi_lith; print(fastapi_lith.__file__)"],
                           cwd=root, env=BARE_ENV, capture_output=True, text=True)  # fmt: skip
    assert where.stdout.startswith(str(bare_python.parent.parent)), where.stdout + where.stderr
    return root


# (app, its environment, the account to create first, the stream's views, the command's route
# and body, what the frame after it shows)
EXAMPLES = {
    "counter": ("examples.counter.app:app", "COUNTER_DB", None, "counter", "/add", {"n": 7}, ">7</p>"),
    "kanban": ("examples.kanban.app:app", "KANBAN_DB", None, "board/1", "/cards",
               {"lane_id": 1, "title": "Installed bare"}, "Installed bare"),
    "accounts": ("examples.accounts.app:app", "ACCOUNTS_DIR", "acme", "counter", "/add", {"n": 7}, ">7</p>"),
}  # fmt: skip


@pytest.fixture(params=list(EXAMPLES))
def example(request: pytest.FixtureRequest, bare_python: Path, examples: Path, tmp_path: Path) -> Iterator[tuple]:
    app, variable, *rest = EXAMPLES[request.param]
    data = tmp_path / "data"
    data.mkdir()
    env = {variable: str(data / "app.db" if variable.endswith("_DB") else data), "PYTHONPATH": None}
    server = VenvServer(bare_python, app, cwd=examples, env=env, log_path=tmp_path / "server.log",
                        startup_timeout=60)  # fmt: skip
    try:
        with server:
            yield server, *rest
    finally:
        print(server.output)  # shown when the test fails


def test_each_example_starts_from_a_bare_install_and_streams_a_command(example: tuple) -> None:
    server, account, views, route, body, shows = example
    base = server.url
    if account is not None:
        created = httpx.post(f"{base}/accounts", data={"name": account}, headers={"Sec-Fetch-Site": "same-origin"})
        assert created.status_code == 303, created.text
        base = f"{base}/a/{account}"
    url = f"{base}/lith/stream?views={views}&tab=bare1"
    with httpx.stream("GET", url, headers={"Accept-Encoding": "identity"}, timeout=30) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(lines).startswith("retry: ")  # when to come back, in the first event
        assert next(lines) == "event: datastar-patch-elements"  # the first paint
        command = {"tab": "bare1", "op": 1, **body}
        posted = httpx.post(base + route, json=command, headers=SAME_ORIGIN)
        assert posted.status_code == 204, posted.text
        deadline = time.monotonic() + 30  # keepalives arrive meanwhile: bound the wait itself
        for line in lines:  # up to the frame that carries the change
            if shows in line:
                break
            assert time.monotonic() < deadline, f"no frame with {shows!r}"
        else:
            pytest.fail(f"the stream ended without {shows!r}")


def test_new_from_an_installed_fastapi_lith_repacks_its_wheel(bare_python: Path, tmp_path: Path) -> None:
    """Away from a checkout, `new` rebuilds the wheel from the installed files: the same files."""
    done = subprocess.run([bare_python, "-m", "fastapi_lith", "new", "guestbook"], cwd=tmp_path, env=BARE_ENV,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "guestbook" / "wheels").glob("fastapi_lith-*-py3-none-any.whl")
    target = tmp_path / "unpacked"
    installed = subprocess.run([bare_python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                                str(wheel)], env=BARE_ENV, capture_output=True, text=True)  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = bare_python.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

    def package(root: Path) -> dict[str, bytes]:
        folder = root / "fastapi_lith"
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip

    unpacked, original = package(target), package(site)
    assert "template/Makefile.tmpl" in unpacked and unpacked == original


class VenvServe(VenvServer):
    """`python -m fastapi_lith serve`, the deploy unit's command, run by another venv's Python."""

    def command(self) -> list[str]:
        return [str(self.python), "-m", "fastapi_lith", "serve", self.app, "--host", self.host,
                "--port", str(self.port), *self.args]  # fmt: skip


def test_a_bare_install_serves_as_the_unit_does_and_names_the_extra_granian_needs(
    bare_python: Path, examples: Path, tmp_path: Path
) -> None:
    env = {"COUNTER_DB": str(tmp_path / "c.db"), "PYTHONPATH": None}
    with VenvServe(bare_python, "examples.counter.app:app", cwd=examples, env=env, log_path=tmp_path / "serve.log",
                   startup_timeout=60) as server:  # fmt: skip
        assert httpx.get(server.url + "/").status_code == 200
        assert "Uvicorn running on http://127.0.0.1:" in server.output
    done = subprocess.run([bare_python, "-m", "fastapi_lith", "serve", "examples.counter.app:app", "--server",
                           "granian"], cwd=examples, env=BARE_ENV, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: serving with granian needs it: pip install 'fastapi-lith[granian]'" in done.stderr
