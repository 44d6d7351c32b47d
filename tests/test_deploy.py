"""deploy/: the deploy script against a local install folder and real uvicorn processes, and the
unit file and Caddyfile checked by systemd's and Caddy's own tools where they are installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from browser import free_port
from fastapi_lith.backup import verify

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"

APP = """
from fastapi import FastAPI
from fastapi.responses import JSONResponse

{crash}
app = FastAPI()


@app.get("/health")
def health():
    return JSONResponse({{"version": {version!r}}}, status_code={status})
"""

# Stands in for `systemctl restart lith@NAME`: stop the one process, then start the release that
# `current` points to. The pid file says which process is ours.
RESTART = r"""#!/usr/bin/env bash
set -u
pidfile="$ROOT/app.pid"
if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 200); do
        state="$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)"
        { [ -z "$state" ] || [ "$state" = Z ]; } && break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
fi
echo "$(date +%s.%N) restart" >> "$ROOT/restarts.log"
cd "$ROOT/current"
"$PY" -m uvicorn app:app --host 127.0.0.1 --port "$PORT" --timeout-graceful-shutdown 2 \
    >> "$ROOT/app.log" 2>&1 < /dev/null &
echo $! > "$pidfile"
"""


def write_version(folder: Path, version: str, *, status: int = 200, crash: bool = False) -> Path:
    folder.mkdir(parents=True)
    crash_line = f"raise SystemExit('{version} cannot start')" if crash else ""
    (folder / "app.py").write_text(APP.format(version=version, status=status, crash=crash_line))
    return folder


class Site:
    """A local stand-in for /srv/lith/NAME, and deploy.sh run against it."""

    def __init__(self, root: Path, sources: Path) -> None:
        self.root = root
        self.sources = sources
        self.port = free_port()
        restart = root.parent / "restart.sh"
        restart.write_text(RESTART)
        restart.chmod(0o755)
        self.env = {
            **os.environ,
            "ROOT": str(root),
            "NAME": "testapp",
            "PY": sys.executable,
            "PORT": str(self.port),
            "RESTART_CMD": str(restart),
            "INSTALL_CMD": 'cp -R "$SOURCE"/. "$RELEASE"/',  # instead of a venv and pip install
            "HEALTH_URL": f"http://127.0.0.1:{self.port}/health",
            "HEALTH_TIMEOUT": "15",
            "KEEP_RELEASES": "2",
        }

    def deploy(self, source: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(DEPLOY / "deploy.sh"), str(source)],
            env={**self.env, **env}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def health(self) -> str:
        try:
            with urllib.request.urlopen(self.env["HEALTH_URL"], timeout=5) as r:
                return f"{r.status} {json.loads(r.read())['version']}"
        except urllib.error.HTTPError as exc:
            return str(exc.code)

    @property
    def pid(self) -> int:
        return int((self.root / "app.pid").read_text())

    def current(self) -> str:
        return Path(os.readlink(self.root / "current")).name

    def releases(self) -> list[str]:
        return sorted(p.name for p in (self.root / "releases").iterdir())

    def restarts(self) -> int:
        log = self.root / "restarts.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def stop(self) -> None:
        try:
            pid = self.pid
        except FileNotFoundError:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not alive(pid):
                    return
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    root = tmp_path / "srv" / "testapp"
    (root / "data").mkdir(parents=True)
    s = Site(root, tmp_path / "src")
    yield s
    s.stop()


def test_a_release_that_fails_its_health_check_is_rolled_back(site: Site, tmp_path: Path) -> None:
    v1 = write_version(site.sources / "v1", "v1")
    done = site.deploy(v1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert site.health() == "200 v1"
    first, v1_pid = site.current(), site.pid
    assert "deployed" in done.stdout

    # v2 starts but answers 500 on /health. A copy of the database is taken before the switch.
    db_path = site.root / "data" / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.executescript("PRAGMA journal_mode = WAL; CREATE TABLE t (x); PRAGMA user_version = 3;")
    v2 = write_version(site.sources / "v2", "v2", status=500)
    done = site.deploy(v2, HEALTH_TIMEOUT="4", DB=str(db_path), LITH_PYTHON=sys.executable)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "UNHEALTHY" in done.stdout and "rolled back" in done.stdout
    assert "the previous release serves again" in done.stderr
    assert site.current() == first and site.health() == "200 v1"
    assert not alive(v1_pid)  # one process at a time: v1 was stopped, v2 too, v1 started again
    (copy,) = (site.root / "data" / "backups").glob("app-before-*.db")
    report = verify(copy)
    assert report.ok and report.version == 3
    failed = [r for r in site.releases() if r.endswith(".failed")]
    assert len(failed) == 1

    # v3 crashes on start: nothing ever answers.
    v3 = write_version(site.sources / "v3", "v3", crash=True)
    done = site.deploy(v3, HEALTH_TIMEOUT="4")
    assert done.returncode == 1, done.stdout + done.stderr
    assert site.current() == first and site.health() == "200 v1"
    assert "v3 cannot start" in (site.root / "app.log").read_text()

    # A failed install changes nothing: no new release, no restart.
    pid, restarts, releases = site.pid, site.restarts(), site.releases()
    done = site.deploy(v3, INSTALL_CMD="false")
    assert done.returncode == 1 and "install failed; nothing changed" in done.stderr
    assert (site.pid, site.restarts(), site.releases()) == (pid, restarts, releases)

    # v4 is fine: it serves, and the releases beyond the newest KEEP_RELEASES=2 are deleted,
    # except the previous one (v1), kept for the next rollback.
    before = site.releases()
    v4 = write_version(site.sources / "v4", "v4")
    done = site.deploy(v4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert site.health() == "200 v4"
    assert site.current() not in before
    assert site.releases() == [first, before[-1], site.current()], site.releases()
    assert before[-1].endswith(".failed") and before[-2].endswith(".failed")  # v2's was deleted


def test_a_first_release_that_fails_has_nothing_to_roll_back_to(site: Site) -> None:
    bad = write_version(site.sources / "bad", "bad", status=500)
    done = site.deploy(bad, HEALTH_TIMEOUT="2")
    assert done.returncode == 2
    assert "no previous release to roll back to" in done.stderr and "stays current" in done.stderr
    assert site.releases() == [site.current()]


def test_usage() -> None:
    done = subprocess.run(["bash", str(DEPLOY / "deploy.sh")], capture_output=True, text=True)
    assert done.returncode == 64 and "deploy/deploy.sh [options] SOURCE" in done.stdout
    env = {k: v for k, v in os.environ.items() if k not in {"NAME", "ROOT", "RESTART_CMD"}}
    done = subprocess.run(["bash", str(DEPLOY / "deploy.sh"), "x.whl"], capture_output=True, text=True, env=env)
    assert done.returncode == 64 and "--name is required" in done.stderr


def test_the_unit_runs_uvicorn_workers_on_one_database_and_restarts_on_failure(tmp_path: Path) -> None:
    unit = (DEPLOY / "lith@.service").read_text()
    assert "--timeout-graceful-shutdown" in unit and "Restart=on-failure" in unit
    exec_start = unit.split("ExecStart=")[1].split("\nKillSignal")[0]
    # Processes on one file share its commits through the change feed (tests/test_workers.py);
    # the env file may set WORKERS, the unit's own default applies otherwise.
    assert "--workers ${WORKERS}" in exec_start
    assert unit.index("Environment=WORKERS=") < unit.index("EnvironmentFile=")
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # Point the unit at a folder that exists here, so the check can find the executable.
    srv = tmp_path / "srv"
    uvicorn = srv / "lith" / "demo" / "current" / ".venv" / "bin" / "uvicorn"
    uvicorn.parent.mkdir(parents=True)
    uvicorn.write_text("#!/bin/sh\n")
    uvicorn.chmod(0o755)
    (srv / "lith" / "demo" / "data").mkdir()
    units = tmp_path / "units"
    units.mkdir()
    (units / "lith@.service").write_text(unit.replace("/srv/lith/", f"{srv}/lith/"))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(units / "lith@demo.service")],
        capture_output=True, text=True, timeout=60, cwd=units,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_the_caddyfile_is_valid_and_leaves_the_streams_alone() -> None:
    text = (DEPLOY / "Caddyfile").read_text()
    assert "flush_interval -1" in text and "not path /lith/stream*" in text
    if shutil.which("caddy") is None:
        pytest.skip("caddy is not installed (apt-get install caddy)")
    env = {**os.environ, "LITH_DOMAIN": "app.example.com", "LITH_PORT": "8000"}
    done = subprocess.run(["caddy", "adapt", "--config", str(DEPLOY / "Caddyfile"), "--adapter", "caddyfile"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    routes = config["apps"]["http"]["servers"]["srv0"]["routes"][0]["handle"][0]["routes"]
    encode = next(r for r in routes if r["handle"][0]["handler"] == "encode")
    assert encode["match"] == [{"not": [{"path": ["/lith/stream*"]}]}]
    proxy = next(r for r in routes if r["handle"][0]["handler"] == "reverse_proxy")["handle"][0]
    assert proxy["flush_interval"] == -1 and proxy["upstreams"] == [{"dial": "127.0.0.1:8000"}]
