"""A benchmark's server leaves nothing behind: one process per `Server`, gone after `close()`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.lib.server import Server, answers


def test_a_started_server_refuses_a_second_start_and_is_gone_after_close(tmp_path: Path) -> None:
    server = Server(
        "examples.counter.app:app",
        env={"COUNTER_DB": str(tmp_path / "counter.db")},
        access_log=False,
        log=tmp_path / "server.log",
    )
    server.start()
    first = server.pid
    try:
        # A second start used to spawn a process that found the port taken and exited, while the
        # readiness check heard the first one, which then outlived close().
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
        assert server.pid == first
    finally:
        server.close()
    assert not answers(server.port, "/")
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
