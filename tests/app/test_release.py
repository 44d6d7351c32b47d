"""A generated project away from this checkout: its CI from a fresh clone, then a release from a
tag deployed to a folder standing in for the server, checked, and rolled back.

This is the path docs/deploying.md writes down, run as written: `git clone`, `.ci/run`,
`git tag`, `make release`, the release folder copied over, its `deploy/deploy.sh`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastapi_lith import __version__
from fastapi_lith.cli import main
from tests.app.test_deploy import Site
from tests.app.test_scaffold import TEST_SECRET, signed_up
from tests.support import REPO
from tests.support.browser import ensure_datastar_js, find_chromium

# The clone's tools must not see this checkout: no PYTHONPATH, no venv of ours.
ENV = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST"}}
GIT = ["git", "-c", "user.name=CI", "-c", "user.email=ci@example.com", "-c", "init.defaultBranch=main"]
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Datastar-Request": "true"}


def run(*cmd: str | Path, cwd: Path, timeout: float = 900, **env: str) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env={**ENV, **env}, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{cmd}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`new guestbook`, committed, cloned into another folder: what a teammate's machine has."""
    if find_chromium() is None:
        pytest.skip("the project's .ci/run needs Chromium (it runs its browser test under CI=true)")
    project = tmp_path_factory.mktemp("author") / "guestbook"
    assert main(["new", str(project)]) == 0
    run(*GIT, "init", "-q", cwd=project)
    run(*GIT, "add", "-A", cwd=project)
    run(*GIT, "commit", "-qm", "new guestbook", cwd=project)
    elsewhere = tmp_path_factory.mktemp("teammate")
    run(*GIT, "clone", "-q", project, "guestbook", cwd=elsewhere)
    return elsewhere / "guestbook"


def test_the_projects_ci_passes_from_a_fresh_clone(clone: Path) -> None:
    assert (clone / f"wheels/fastapi_lith-{__version__}-py3-none-any.whl").is_file()  # committed with it
    tracked = run("git", "ls-files", cwd=clone).split()
    here = str(REPO)  # the checkout that ran `new`
    assert not [name for name in tracked if here.encode() in (clone / name).read_bytes()]
    output = run(clone / ".ci" / "run", cwd=clone, DATASTAR_JS=str(ensure_datastar_js()))
    summary = next(line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line))
    assert re.search(r"\b8 passed\b", summary) and "skipped" not in summary, output


def release(clone: Path, version: str) -> Path:
    run(*GIT, "tag", f"v{version}", cwd=clone)
    run("make", "release", cwd=clone)
    folder = clone / "dist" / f"guestbook-{version}"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([f"guestbook-{version}-py3-none-any.whl", f"fastapi_lith-{__version__}-py3-none-any.whl",
                            "constraints.txt", "deploy"]), names  # fmt: skip
    return folder


def test_a_tagged_release_deploys_to_a_server_and_a_broken_one_rolls_back(clone: Path, tmp_path: Path) -> None:
    # The server: its folder, an env file only root reads, and nothing of the project but what
    # each release brings (copied as `rsync` would).
    root = tmp_path / "srv" / "lith" / "guestbook"
    (root / "data").mkdir(parents=True)
    site = Site(root, tmp_path / "incoming")
    env = root / "env"
    env.write_text(f"APP=guestbook.app:app\nPORT={site.port}\nAPP_SECRET={TEST_SECRET}\n")
    env.chmod(0o600)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else str(Path(sys.executable).resolve())
    server = {**site.env, "INSTALL_CMD": "", "PYTHON": python, "APP": "guestbook.app:app",
              "PY": str(root / "current" / ".venv" / "bin" / "python"), "HEALTH_TIMEOUT": "60",
              "APP_DB": str(root / "data" / "app.db"), "APP_BACKUPS": str(root / "data" / "backups"),
              "APP_SECRET": TEST_SECRET}  # fmt: skip
    server = {k: v for k, v in server.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}

    def deploy(version: str, **env: str) -> subprocess.CompletedProcess[str]:
        shipped = shutil.copytree(release(clone, version), site.sources / f"guestbook-{version}")
        script = shipped / "deploy" / "deploy.sh"
        return subprocess.run(
            [script, "--db", str(root / "data" / "app.db"), str(shipped / f"guestbook-{version}-py3-none-any.whl")],
            env={**server, **env}, capture_output=True, text=True, timeout=900,
        )  # fmt: skip

    try:
        done = deploy("0.1.0")
        assert done.returncode == 0, done.stdout + done.stderr
        assert site.health() == "200 1"  # migrated to version 1
        url = f"http://127.0.0.1:{site.port}"
        with signed_up(url, "ada") as ada:
            signed = ada.post("/sign", json={"note": "hello", "tab": "t1", "op": 1}, headers=SAME_ORIGIN)
        assert signed.status_code == 204, signed.text
        first = site.current()
        # What runs is what the tests passed with: every installed version is the pinned one.
        pins = set((site.sources / "guestbook-0.1.0" / "constraints.txt").read_text().split())
        frozen = run(root / "current" / ".venv" / "bin" / "python", "-m", "pip", "freeze", cwd=tmp_path).splitlines()
        frozen = [line for line in frozen if not line.startswith("guestbook")]  # the app: its wheel
        assert set(frozen) <= pins, set(frozen) - pins
        assert any(line.startswith("greenlet==") for line in frozen)

        # 0.2.0 answers 500 on /health: deploy.sh puts 0.1.0 back.
        app = clone / "guestbook" / "app.py"
        app.write_text(app.read_text().replace('    version = (await db.exec_driver_sql("PRAGMA user_version")).scalar()\n',
                                               '    raise RuntimeError("0.2.0 is broken")\n'))  # fmt: skip
        pyproject = clone / "pyproject.toml"
        pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
        run(*GIT, "commit", "-qam", "0.2.0", cwd=clone)
        # Its /health answers 500 for as long as deploy.sh asks: a shorter wait, still long
        # enough for 0.1.0 to start again on a busy machine.
        done = deploy("0.2.0", HEALTH_TIMEOUT="20")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "rolled back" in done.stdout and site.current() == first and site.health() == "200 1"
        (copy,) = (root / "data" / "backups").glob("app-before-*.db")  # taken before 0.2.0 started
        assert copy.stat().st_mode == (root / "data" / "app.db").stat().st_mode  # no more readable than it
    finally:
        site.stop()
