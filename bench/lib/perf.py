"""Micro-benchmarks through pyperf: one statement timed in pyperf's own worker processes.

A loop that times one function in process is what pyperf is for: it spawns fresh workers,
calibrates the loop count, throws away warm-ups, and gives a mean and its spread. Every bench
micro-benchmark runs through `timeit`, over the library under test (`--against` too):

    mean, sd = timeit("zstd", ["from bench.encoders import setup", "encoder, events = setup('zstd', 40)"],
                      "encoder.encode(next(events))", mode(args), out)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .checkout import LIBRARY, PRELUDE, child_env

QUICK = ["--processes", "3", "--values", "2"]  # pyperf's --fast, but its least processes: the quick pass's


def mode(args: argparse.Namespace) -> list[str]:
    """pyperf's settings for the pass: one value (--smoke), 3 processes (--quick), else its default."""
    return ["--debug-single-value"] if args.smoke else QUICK if args.quick else []


def describe(flags: list[str]) -> str:
    return f"pyperf timeit {' '.join(flags) or '(default: 20 processes)'}"


def timeit(name: str, setup: list[str], stmt: str, flags: list[str], out: Path) -> tuple[float, float]:
    """Seconds per `stmt` after `setup`: pyperf's mean and standard deviation (0 for one value)."""
    import pyperf

    cmd = [sys.executable, "-m", "pyperf", "timeit", "--quiet", *flags, "--inherit-environ",
           "PYTHONPATH,BENCH_ROOT,BENCH_LIBRARY", "--name", name, "-o", str(out), "-s", PRELUDE,
           *(arg for line in setup for arg in ("-s", line)), stmt]
    subprocess.run(cmd, cwd=LIBRARY, env=child_env(), check=True, stdout=subprocess.DEVNULL)
    bench = pyperf.Benchmark.load(str(out))
    return bench.mean(), bench.stdev() if len(bench.get_values()) > 1 else 0.0
