"""Which checkout is measured, and how a child process (a server, a worker) runs its code.

The scenarios are this repository's; the library they measure may be another commit's
(`--against REV` runs the same scenario over a temporary checkout of REV). `LIBRARY` is the
checkout whose `fastapi_lith` and `examples` this process imports, and every process a
scenario starts gets the same through `child_env()`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
"""This folder, bench/: the scenarios, their plots and RESULTS.md."""
ROOT = BENCH.parent
"""The repository the scenarios come from."""
LIBRARY = Path(os.environ.get("BENCH_LIBRARY", ROOT)).resolve()
"""The checkout under test: ROOT, or the other commit's temporary checkout."""


def child_env(library: Path = LIBRARY, **extra: str) -> dict[str, str]:
    """The environment of a process that runs the library under test (a server, a worker)."""
    paths = [str(library), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONUNBUFFERED": "1",
            "BENCH_ROOT": str(ROOT), "BENCH_LIBRARY": str(library), **extra}


# This repository's `bench` is imported first, then the library under test goes first on the
# path: another commit's checkout has a bench/ of its own, and its scenarios are not the ones run.
PRELUDE = ("import os, sys; sys.path.insert(0, os.environ['BENCH_ROOT']); import bench; "
           "sys.path.insert(0, os.environ['BENCH_LIBRARY'])")
"""Python that makes `bench` this repository's and `fastapi_lith` the library under test's."""
LAUNCH = (PRELUDE + "; import runpy; module = sys.argv.pop(1); sys.argv[0] = module; "
          "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def module_argv(module: str, *args: str) -> list[str]:
    """The command that runs `python -m module args` of this bench over the library under test
    (with `child_env()`)."""
    return [sys.executable, "-c", LAUNCH, module, *args]
