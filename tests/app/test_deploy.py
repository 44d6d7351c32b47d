"""deploy/: the deploy script against a local install folder and real uvicorn processes, the
unit's command line run with each server it can name, and the unit file and Caddyfile checked
by systemd's and Caddy's own tools where they are installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from fastapi_lith.ops import verify
from tests.support import REPO, line_with, to_the_end
from tests.support.browser import Server, alive, free_port, port_answers, route_datastar, wait_for_datastar

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
# `current` points to (APP in it, with PY). The pid file says which process is ours.
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
# LISTEN_FD: a socket held by whoever runs deploy.sh, as systemd holds lith@.socket's.
if [ -n "${LISTEN_FD:-}" ]; then listen=(--fd "$LISTEN_FD"); else listen=(--host 127.0.0.1 --port "$PORT"); fi
"$PY" -m uvicorn "${APP:-app:app}" "${listen[@]}" --timeout-graceful-shutdown 2 \
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

    def deploy(self, source: Path, *, pass_fds: tuple[int, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(DEPLOY / "deploy.sh"), str(source)],
            env={**self.env, **env}, capture_output=True, text=True, timeout=120, pass_fds=pass_fds,
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
    # A failing release costs the whole HEALTH_TIMEOUT, and so the rollback may take as long:
    # the default leaves a loaded machine time to start a Python process (v3 crashes after its
    # imports, v1 answers after them).
    done = site.deploy(v2, DB=str(db_path), LITH_PYTHON=sys.executable)
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
    done = site.deploy(v3)
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


def ask(path: Path, url_path: str = "/health") -> bytes:
    """A GET through a unix socket, as Caddy's `reverse_proxy unix/...` sends one."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(str(path))
        s.sendall(f"GET {url_path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        return b"".join(iter(lambda: s.recv(65536), b""))


def test_through_a_held_socket_a_deploy_checks_health_and_a_connect_waits_for_the_next_process(
    site: Site, tmp_path: Path
) -> None:
    """lith@.socket's way: the socket outlives every process. deploy.sh asks /health through it,
    and a connect made while no process serves waits in its queue for the next one."""
    path = tmp_path / "run" / "testapp.sock"
    path.parent.mkdir()
    held = socket.socket(socket.AF_UNIX)
    held.bind(str(path))
    held.listen(64)
    fd = held.fileno()
    through = {"LISTEN_FD": str(fd), "HEALTH_URL": "", "HEALTH_SOCKET": str(path)}
    with held:
        done = site.deploy(write_version(site.sources / "v1", "v1"), pass_fds=(fd,), **through)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"(through {path}) answers 200" in done.stdout
        assert b'{"version":"v1"}' in ask(path)

        site.stop()  # as `systemctl stop lith@testapp.service` leaves it: the socket still held
        waiting = socket.socket(socket.AF_UNIX)
        waiting.connect(str(path))  # not refused: queued
        waiting.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        done = site.deploy(write_version(site.sources / "v2", "v2"), pass_fds=(fd,), **through)
        assert done.returncode == 0, done.stdout + done.stderr
        waiting.settimeout(60)
        with waiting:
            answer = b"".join(iter(lambda: waiting.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.1 200") and b'{"version":"v2"}' in answer, answer


def test_a_first_release_that_fails_has_nothing_to_roll_back_to(site: Site) -> None:
    bad = write_version(site.sources / "bad", "bad", status=500)
    done = site.deploy(bad, HEALTH_TIMEOUT="2")
    assert done.returncode == 2
    assert "no previous release to roll back to" in done.stderr and "stays current" in done.stderr
    assert site.releases() == [site.current()]


def test_the_copy_before_a_deploy_keeps_the_databases_owner_and_mode(site: Site) -> None:
    """deploy.sh runs as root; the copy and a backups/ it makes stay the service user's, and the
    copy is no more readable than the database (the unit's UMask makes it 0640)."""
    data = site.root / "data"
    db_path = data / "app.db"
    with closing(sqlite3.connect(db_path)) as conn:
        conn.executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
    db_path.chmod(0o640)
    service = (65534, 65534) if os.getuid() == 0 else (os.getuid(), os.getgid())  # nobody, as root
    for path in (data, db_path):
        os.chown(path, *service)
    done = site.deploy(write_version(site.sources / "v1", "v1"), DB=str(db_path), LITH_PYTHON=sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    backups = data / "backups"
    (copy,) = backups.glob("app-before-*.db")
    for path in (backups, copy, Path(f"{copy}.sha256")):
        assert (path.stat().st_uid, path.stat().st_gid) == service, path
        assert path.stat().st_mode & 0o007 == 0, f"{path}: {oct(path.stat().st_mode)}"  # nothing for others
    assert copy.stat().st_mode & 0o777 == 0o640
    assert verify(copy).ok


def test_a_release_whose_python_the_service_cannot_run_is_refused(site: Site, tmp_path: Path) -> None:
    """A venv made with a Python under a home folder (a pyenv in /root) fails under the unit's
    ProtectHome=yes: the install is refused before anything switches."""
    python = str(Path(sys.executable).resolve())
    if not python.startswith(("/root/", "/home/")):
        pytest.skip(f"this Python ({python}) is not under a home folder")
    fake = 'mkdir -p "$RELEASE/.venv/bin" && ln -s "$PYTHON" "$RELEASE/.venv/bin/python"'  # a venv's link
    done = site.deploy(write_version(site.sources / "v1", "v1"), INSTALL_CMD=fake, PYTHON=python)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "under a home folder" in done.stderr and "--python /usr/bin/python3" in done.stderr, done.stderr
    assert not (site.root / "current").exists() and site.releases() == []


def test_usage() -> None:
    done = subprocess.run(["bash", str(DEPLOY / "deploy.sh")], capture_output=True, text=True)
    assert done.returncode == 64 and "deploy/deploy.sh [options] SOURCE" in done.stdout
    env = {k: v for k, v in os.environ.items() if k not in {"NAME", "ROOT", "RESTART_CMD"}}
    done = subprocess.run(["bash", str(DEPLOY / "deploy.sh"), "x.whl"], capture_output=True, text=True, env=env)
    assert done.returncode == 64 and "--name is required" in done.stderr


def test_the_unit_runs_workers_on_one_database_and_restarts_on_failure(tmp_path: Path) -> None:
    unit = (DEPLOY / "lith@.service").read_text()
    assert "--timeout-graceful-shutdown" in unit and "Restart=on-failure" in unit
    exec_start = unit.split("ExecStart=")[1].split("\nKillSignal")[0]
    # Processes on one file share its commits through the change feed (tests/engine/test_workers.py);
    # the env file may set WORKERS, the unit's own default applies otherwise.
    assert "--workers ${WORKERS}" in exec_start
    assert unit.index("Environment=WORKERS=") < unit.index("EnvironmentFile=")
    # uvicorn unless the env file says SERVER=granian (the design card names uvicorn).
    assert "--server ${SERVER} " in exec_start
    assert unit.index("Environment=SERVER=uvicorn\n") < unit.index("EnvironmentFile=")
    assert "\n#SERVER=granian\n" in (DEPLOY / "env.example").read_text()
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # Point the unit at a folder that exists here, so the check can find the executable.
    srv = tmp_path / "srv"
    bin = srv / "lith" / "demo" / "current" / ".venv" / "bin"
    bin.mkdir(parents=True)
    for name in ("uvicorn", "python"):
        (bin / name).write_text("#!/bin/sh\n")
        (bin / name).chmod(0o755)
    (srv / "lith" / "demo" / "data").mkdir()
    units = tmp_path / "units"
    units.mkdir()
    (units / "lith@.service").write_text(unit.replace("/srv/lith/", f"{srv}/lith/"))
    (units / "lith@.socket").write_text((DEPLOY / "lith@.socket").read_text())
    for name in ("lith@demo.service", "lith@demo.socket"):
        done = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(units / name)],
            capture_output=True, text=True, timeout=60, cwd=units,
        )  # fmt: skip
        assert done.returncode == 0 and not done.stderr.strip(), f"{name}: {done.stderr}"


def test_the_service_serves_on_the_socket_systemd_holds_for_it() -> None:
    """A restart keeps the socket (lith@.socket), so the tabs that reconnect meanwhile wait in
    its queue instead of being refused; the server takes it as fd 3, with the socket's backlog."""
    unit = (DEPLOY / "lith@.service").read_text()
    sock = (DEPLOY / "lith@.socket").read_text()
    exec_start = unit.split("ExecStart=")[1].split("\nKillSignal")[0]
    assert "--fd 3 " in exec_start and "--port" not in exec_start and "--host" not in exec_start
    assert "\nRequires=lith@%i.socket\n" in unit and "lith@%i.socket" in unit.split("\nAfter=")[1].split("\n")[0]
    assert "\nListenStream=/run/lith/%i.sock\n" in sock
    backlog = re.search(r"^Backlog=(\d+)$", sock, re.M)
    assert backlog and f"--backlog {backlog.group(1)} " in exec_start  # the server listens again with its own
    # No client address on a unix socket: only then is Caddy's X-Forwarded-Proto believed.
    assert "--forwarded-allow-ips * " in exec_start
    caddyfile = (DEPLOY / "Caddyfile").read_text()
    assert "reverse_proxy unix/{$LITH_SOCKET} {" in caddyfile
    assert "PORT=" not in (DEPLOY / "env.example").read_text()


def test_the_docs_quote_the_unit_line_for_line() -> None:
    page = (REPO / "docs" / "deploying.md").read_text()
    quoted = page.split("\n## The unit\n")[1].split("```ini\n")[1].split("```")[0]
    unit = (DEPLOY / "lith@.service").read_text().splitlines()
    assert [line for line in quoted.splitlines() if line not in unit] == []


def unit_command(key: str, release: Path, app: str, **env: str) -> list[str]:
    """The unit's `key=` command line as systemd would run it for `release` serving `app`: its
    lines joined, `${NAME}` from `env` or else the unit's own `Environment=NAME=`, and the files
    beside the env file (logging.json) from deploy/."""
    unit = (DEPLOY / "lith@.service").read_text()
    assert f"\n{key}=" in unit, key
    line = unit.split(f"\n{key}=")[1].replace("\\\n", " ").split("\n")[0]
    line = line.replace("/srv/lith/%i/current/.venv/bin/python", sys.executable)
    line = line.replace("/srv/lith/%i/logging.json", str(DEPLOY / "logging.json"))
    defaults = dict(re.findall(r"^Environment=(\w+)=(\S*)$", unit, re.M))
    words = line.replace("${APP}", app).split()
    for name in re.findall(r"\$\{(\w+)\}", line):
        words = [w.replace(f"${{{name}}}", env.get(name, defaults.get(name, f"${{{name}}}"))) for w in words]
    assert not [w for w in words if "${" in w or "%i" in w], words
    return words


def test_a_release_that_cannot_import_fails_before_uvicorn_starts_its_workers(tmp_path: Path) -> None:
    """uvicorn --workers 2 respawns a worker that dies at import forever, so the service never
    fails and StartLimitBurst never stops it: the unit's pre-start command must fail instead."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    broken = write_version(tmp_path / "broken", "broken")
    (broken / "app.py").write_text("import nothing_of_the_sort\n" + (broken / "app.py").read_text())
    exits = write_version(tmp_path / "exits", "exits", crash=True)
    for release, why in ((broken, "No module named 'nothing_of_the_sort'"), (exits, "exits cannot start")):
        done = subprocess.run(unit_command("ExecStartPre", release, "app:app"), cwd=release, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"app:app cannot be imported: {why}" in done.stderr
    good = write_version(tmp_path / "good", "good")
    done = subprocess.run(unit_command("ExecStartPre", good, "app:app"), cwd=good, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(unit_command("ExecStartPre", good, "app:nope"), cwd=good, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and 'Attribute "nope" not found' in done.stderr


# Puts the socket it is given (argv[1]) at fd 3, as systemd hands lith@.socket's to the service,
# and becomes the command after it: the same process, so SIGTERM reaches the server itself.
ON_FD_3 = "import os, sys; fd = int(sys.argv[1]); fd == 3 or (os.dup2(fd, 3), os.close(fd)); os.execv(sys.argv[2], sys.argv[2:])"
# A command as Caddy passes it on: over HTTPS to the browser, plain HTTP on the unix socket.
THROUGH_CADDY = {"Host": "app.example.com", "Origin": "https://app.example.com", "Datastar-Request": "true",
                 "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_the_unit_serves_with_the_server_its_env_file_names_on_the_socket_it_holds(
    server: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The unit's own ExecStart with SERVER=uvicorn (its default) or SERVER=granian, two workers,
    on a unix socket passed as fd 3: a stream's frames, a command Caddy passed on (the scheme
    from its X-Forwarded-Proto), logging.json's lines; SIGTERM ends the stream and the process,
    and a connect while none runs waits in the socket's queue for the next one."""
    if server == "granian":
        request.getfixturevalue("granian")
    path = tmp_path / "app.sock"
    held = socket.socket(socket.AF_UNIX)
    held.bind(str(path))
    held.listen(64)
    command = unit_command("ExecStart", REPO, "examples.counter.app:app", SERVER=server)
    log = tmp_path / "app.log"
    starts = 0

    def start() -> subprocess.Popen[bytes]:
        nonlocal starts
        starts += 1
        metrics = tmp_path / f"metrics-{starts}"  # the unit's RuntimeDirectory: empty at each start
        metrics.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO), "COUNTER_DB": str(tmp_path / "c.db"),
               "PROMETHEUS_MULTIPROC_DIR": str(metrics)}  # fmt: skip
        with log.open("ab") as out:
            return subprocess.Popen([sys.executable, "-c", ON_FD_3, str(held.fileno()), *command], cwd=REPO,
                                    env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=(held.fileno(),))  # fmt: skip

    def all_started(proc: subprocess.Popen[bytes]) -> None:
        """Both workers serve: a granian worker still starting does not see a SIGTERM, and serves
        on until the graceful bound kills it (docs/deploying.md)."""
        ready = "Application startup complete." if server == "uvicorn" else "Started worker-"
        deadline = time.monotonic() + 60
        while log.read_text().count(ready) < 2 * starts:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # granian logs a worker's start a moment before the worker watches for the signal: a
        # request answered after both have started puts that moment behind.
        with socket.socket(socket.AF_UNIX) as asking:
            asking.settimeout(60)
            asking.connect(str(path))
            asking.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert b"".join(iter(lambda: asking.recv(65536), b"")).startswith(b"HTTP/1.1 200")

    def exited_cleanly(proc: subprocess.Popen[bytes]) -> None:
        assert proc.wait(60) in (0, -signal.SIGTERM), log.read_text()
        text = log.read_text()
        if server == "granian":
            # Every worker saw the signal and stopped itself; one that had not would serve on
            # until the graceful bound killed it. granian's own "refused to gracefully stop"
            # is no sign of that: on a busy machine it also follows a worker that has exited.
            assert text.count("_granian.serve: Stopping worker-") == 2 * starts, text
        else:
            assert "refused to gracefully stop" not in text, text  # no worker killed at the bound

    stream = "/lith/stream?views=counter&tab=t1"
    headers = {"Accept-Encoding": "identity", "Sec-Fetch-Site": "same-origin"}
    transport = httpx.HTTPTransport(uds=str(path))
    with held, httpx.Client(transport=transport, base_url="http://app.example.com", timeout=60) as client:
        proc = start()
        try:
            with client.stream("GET", stream, headers=headers) as body:
                assert body.status_code == 200, body.read()
                lines = body.iter_lines()
                assert line_with(lines, 'class="count">0</p>')
                add = client.post("/add", json={"n": 1, "tab": "t2", "op": 1}, headers=THROUGH_CADDY)
                assert add.status_code == 204, add.text
                assert line_with(lines, 'class="count">1</p>')
                plain = {k: v for k, v in THROUGH_CADDY.items() if k != "X-Forwarded-Proto"}
                assert client.post("/add", json={"n": 1, "tab": "t2", "op": 2}, headers=plain).status_code == 403
                all_started(proc)
                proc.send_signal(signal.SIGTERM)
                to_the_end(lines)  # the stream ends at the signal
            exited_cleanly(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        output = log.read_text()
        access = "uvicorn.access" if server == "uvicorn" else "granian.access"
        assert re.search(r"^\S+ \S+ INFO fastapi_lith\.writer: c\.db: migrated from version 0 to \d+$", output, re.M)
        assert re.search(rf"^\S+ \S+ INFO {re.escape(access)}: .*POST /add HTTP/1\.1\"? 204", output, re.M), output

        # No process serves: the socket still takes a connect, and the next process answers it.
        assert path.exists()
        waiting = socket.socket(socket.AF_UNIX)
        waiting.connect(str(path))
        waiting.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        proc = start()
        try:
            waiting.settimeout(60)
            with waiting:
                answer = b"".join(iter(lambda: waiting.recv(65536), b""))
            assert answer.startswith(b"HTTP/1.1 200") and b'class="count">1</p>' in answer, answer
            all_started(proc)
            proc.send_signal(signal.SIGTERM)
            exited_cleanly(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
    with closing(sqlite3.connect(tmp_path / "c.db")) as conn:  # the acknowledged command, committed
        assert conn.execute("SELECT count FROM counter").fetchone() == (1,)


def test_the_library_logs_reach_the_output_with_time_level_and_logger(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Without a logging config the library's loggers have no handler: its INFO lines (a
    migration, a backup) vanish. Every way we start a server passes deploy/logging.json."""
    template = REPO / "fastapi_lith" / "template"
    for path in (REPO / "Makefile", template / "Makefile.tmpl"):
        run = path.read_text().split("\nrun:")[1].split("\n\n")[0]
        assert "--log-config deploy/logging.json" in run, path
    exec_start = (DEPLOY / "lith@.service").read_text().split("ExecStart=")[1].split("\nKillSignal")[0]
    assert "--log-config /srv/lith/%i/logging.json" in exec_start
    server = server_factory(
        "examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(tmp_path / "c.db")},
        args=["--log-config", str(DEPLOY / "logging.json")],
    )  # fmt: skip
    line = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO fastapi_lith\.writer: c\.db: migrated from version 0 to \d+$"
    assert re.search(line, server.output, re.MULTILINE), server.output
    assert re.search(r"^\S+ \S+ INFO uvicorn\.error: Application startup complete\.$", server.output, re.MULTILINE)


def test_the_unit_and_the_env_file_pass_the_replica_through() -> None:
    unit = (DEPLOY / "lith@.service").read_text()
    # uvicorn alone gets SIGTERM, and stops Litestream after the writer's last commit
    assert "\nKillMode=mixed\n" in unit and "EnvironmentFile=/srv/lith/%i/env" in unit
    assert "ReadWritePaths=-/srv/lith/%i/replica" in unit
    example = (DEPLOY / "env.example").read_text()
    for name in ("#APP_REPLICA=s3://", "#APP_REPLICA=file://", "#APP_REPLICA_SYNC=", "#AWS_ACCESS_KEY_ID=", "#AWS_SECRET_ACCESS_KEY="):
        assert name in example, name


def test_the_caddyfile_is_valid_and_leaves_the_streams_alone() -> None:
    text = (DEPLOY / "Caddyfile").read_text()
    assert "flush_interval -1" in text and "not path /lith/stream*" in text
    if shutil.which("caddy") is None:
        pytest.skip("caddy is not installed (apt-get install caddy)")
    env = {**os.environ, "LITH_DOMAIN": "app.example.com", "LITH_SOCKET": "/run/lith/myapp.sock"}
    done = subprocess.run(["caddy", "adapt", "--config", str(DEPLOY / "Caddyfile"), "--adapter", "caddyfile"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    routes = config["apps"]["http"]["servers"]["srv0"]["routes"][0]["handle"][0]["routes"]
    encode = next(r for r in routes if r["handle"][0]["handler"] == "encode")
    assert encode["match"] == [{"not": [{"path": ["/lith/stream*"]}]}]
    proxy = next(r for r in routes if r["handle"][0]["handler"] == "reverse_proxy")["handle"][0]
    assert proxy["flush_interval"] == -1 and proxy["upstreams"] == [{"dial": "unix//run/lith/myapp.sock"}]


# -- six windows: HTTP/1.1 runs out of connections, Caddy's HTTP/2 does not ----------------------

CADDY_TEST_CONFIG = """{{
	admin off
	skip_install_trust
	local_certs
	http_port {http_port}
	https_port {https_port}
	storage file_system {storage}
}}
import {caddyfile}
"""
SAME_ORIGIN = {"Datastar-Request": "true", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def caddy(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    """`caddy(app_socket) -> https URL`: deploy/Caddyfile run as is, in front of a unix socket.

    The global options around it only keep the test to itself: free ports, its own certificate
    store, no admin endpoint, no change to the system's trusted certificates.
    """
    if shutil.which("caddy") is None:
        pytest.skip("caddy is not installed (apt-get install caddy)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstream: Path) -> str:
        https_port = free_port()
        config = tmp_path / "Caddyfile"
        config.write_text(CADDY_TEST_CONFIG.format(
            http_port=free_port(), https_port=https_port, storage=tmp_path / "caddy-data",
            caddyfile=DEPLOY / "Caddyfile",
        ))  # fmt: skip
        env = {**os.environ, "LITH_DOMAIN": "127.0.0.1", "LITH_SOCKET": str(upstream), "HOME": str(tmp_path),
               "XDG_DATA_HOME": str(tmp_path / "xdg"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}  # fmt: skip
        log = open(tmp_path / "caddy.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["caddy", "run", "--config", str(config), "--adapter", "caddyfile"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not port_answers("127.0.0.1", https_port):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "caddy.log").read_text()
            time.sleep(0.05)
        return f"https://127.0.0.1:{https_port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def open_counters(context: Any, url: str, count: int) -> list[Any]:
    pages = []
    for _ in range(count):
        page = context.new_page()
        page.goto(url + "/")
        wait_for_datastar(page)
        pages.append(page)
    return pages


def test_over_http1_six_windows_freeze_the_seventh_behind_caddy_http2_they_do_not(
    browser: Any, datastar_js: Path, server_factory: Callable[..., Server], caddy: Callable[[Path], str],
    tmp_path: Path,
) -> None:
    server = server_factory("examples.counter.app:app", cwd=REPO, env={"COUNTER_DB": str(tmp_path / "c.db")})
    add = {"n": 1, "tab": "outside", "op": 1}

    # Straight to uvicorn, HTTP/1.1: six windows of one browser hold its six connections.
    plain = browser.new_context()
    route_datastar(plain, datastar_js)
    windows = open_counters(plain, server.url, 6)
    assert httpx.post(server.url + "/add", json=add, headers=SAME_ORIGIN).status_code == 204
    for page in windows:  # every stream is open: each window got the frame
        expect(page.locator("#counter")).to_have_text("1", timeout=10_000)
    seventh = plain.new_page()
    with pytest.raises(PlaywrightTimeout):  # waits for a connection that never frees up
        seventh.goto(server.url + "/", timeout=3_000)
    plain.close()

    # The same app behind deploy/Caddyfile, on a unix socket as the unit serves it: HTTP/2, one
    # connection carries every window.
    path = tmp_path / "app.sock"
    log = open(tmp_path / "uds.log", "wb")  # noqa: SIM115 - closed with the process
    uds = subprocess.Popen([sys.executable, "-m", "uvicorn", "examples.counter.app:app", "--uds", str(path)],
                           cwd=REPO, env={**os.environ, "COUNTER_DB": str(tmp_path / "c.db")},
                           stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert uds.poll() is None and time.monotonic() < deadline, (tmp_path / "uds.log").read_text()
            time.sleep(0.05)
        assert ask(path).startswith(b"HTTP/1.1 200")
        served_behind_caddy(browser, datastar_js, caddy(path))
    finally:
        uds.terminate()
        uds.wait(30)
        log.close()


def served_behind_caddy(browser: Any, datastar_js: Path, url: str) -> None:
    tls = browser.new_context(ignore_https_errors=True)  # Caddy's own local certificate
    route_datastar(tls, datastar_js)
    windows = open_counters(tls, url, 8)
    assert windows[0].evaluate("performance.getEntriesByType('navigation')[0].nextHopProtocol") == "h2"
    windows[0].get_by_role("button", name="Add").click()  # a POST from the first window lands
    for page in windows:
        expect(page.locator("#counter")).to_have_text("2", timeout=10_000)
    tls.close()
def test_make_run_the_template_and_the_units_serve_with_httptools_and_uvloop() -> None:
    """The fast HTTP parser and loop are dependencies, and every way we start a server names
    them, so a missing one fails at start instead of silently falling back to h11 and asyncio:
    each goes through `python -m fastapi_lith serve`, which passes uvicorn both."""
    import importlib.metadata

    import httptools  # noqa: F401
    import uvloop  # noqa: F401

    from fastapi_lith.serving import Serving, uvicorn_args

    requires = importlib.metadata.requires("fastapi-lith") or []
    assert any(r.startswith("uvicorn[standard]") for r in requires), requires
    root = DEPLOY.parent
    template = root / "fastapi_lith" / "template"
    for path in (root / "Makefile", template / "Makefile.tmpl"):
        run = path.read_text().split("\nrun:")[1].split("\n\n")[0]
        assert "/python -m fastapi_lith serve " in run and "--server $(SERVER)" in run, path
        assert "\nSERVER ?= uvicorn\n" in path.read_text(), path
    for path in (DEPLOY / "lith@.service", template / "deploy" / "lith@.service.tmpl"):
        exec_start = path.read_text().split("ExecStart=")[1].split("\nKillSignal")[0]
        assert "/python -m fastapi_lith serve ${APP} " in exec_start and "--server ${SERVER} " in exec_start, path
    assert " --loop uvloop --http httptools " in " ".join(uvicorn_args(Serving("app:app")))
