"""Every benchmark still runs: each scenario as a subprocess in its smallest setting (`--smoke`).

A benchmark nothing runs rots (one once called names the library no longer had). This starts
every scenario at once, as `python -m bench.NAME --smoke` from the checkout's root, and checks
each exits cleanly with its `RESULT` line. Their figures mean nothing here and are not read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

SCENARIOS = ("writer", "hub", "encoders", "send", "kanban", "workers", "postgres", "accounts", "replica", "restart",
             "connects", "dashboard", "tabs", "memory")


def postgres_missing() -> str | None:
    if os.environ.get("LITH_PG_URL") or sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        return None
    return "PostgreSQL's cluster tools are not installed"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Every scenario started together (they mostly wait on their child processes), then awaited."""
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = {}
    for name in SCENARIOS:
        if name == "postgres" and postgres_missing():
            continue
        log = (out / f"{name}.log").open("w")
        started[name] = (subprocess.Popen([sys.executable, "-m", f"bench.{name}", "--smoke"], cwd=REPO, env=env,
                                          stdout=log, stderr=subprocess.STDOUT), log)
    done = {}
    for name, (proc, log) in started.items():
        proc.wait(timeout=600)
        log.close()
        done[name] = (proc.returncode, (out / f"{name}.log").read_text())
    return done


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_scenario_runs_and_prints_its_result_line(name: str, runs: dict[str, tuple[int, str]]) -> None:
    if name == "postgres" and (why := postgres_missing()):
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required on CI: {why}")
        pytest.skip(why)
    code, output = runs[name]
    assert code == 0, output[-4000:]
    assert f"\nRESULT {name}: " in output, output[-4000:]


def test_py_spy_is_there_for_the_profiles() -> None:
    """`--profile` attaches py-spy, which the dev extras install beside the interpreter."""
    assert shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()
