"""`--against REV`: the same scenario over another commit's library, its runs interleaved with ours.

A detached `git worktree` of REV in a temporary folder (the repository's `.venv` linked into
it, for whatever runs from there) is removed afterwards. Each round runs the scenario once on
each side, in its own process, alternating which goes first (A B, B A, ...), so a machine whose
load drifts weighs on both alike; the comparison is the ratio within each round, ours over
theirs, with its spread over the rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from .checkout import ROOT, child_env, module_argv


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


class Checkout:
    """A temporary detached checkout of `rev`, removed on exit."""

    def __init__(self, rev: str) -> None:
        self.rev = git("rev-parse", "--short", f"{rev}^{{commit}}")
        self.folder = Path(tempfile.mkdtemp(prefix=f"lith-against-{self.rev}-"))
        self.path = self.folder / "checkout"

    def __enter__(self) -> Checkout:
        git("worktree", "add", "--detach", "--quiet", str(self.path), self.rev)
        venv = ROOT / ".venv" if (ROOT / ".venv").exists() else Path(sys.prefix)
        (self.path / ".venv").symlink_to(venv)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        (self.path / ".venv").unlink(missing_ok=True)
        try:
            git("worktree", "remove", "--force", str(self.path))
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def run_side(module: str, library: Path, argv: list[str], out: Path) -> dict[str, Any]:
    """One run of the scenario over `library`, in its own process; returns its result."""
    cmd = module_argv(module, *argv, "--once-json", str(out))
    proc = subprocess.run(cmd, cwd=library, env=child_env(library), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        raise SystemExit(f"{module} over {library} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


Runs = list[dict[str, Any]]


def interleave(module: str, rev: str, argv: list[str], rounds: int) -> tuple[str, Runs, Runs]:
    """Rounds of ours and theirs, alternating; returns theirs' commit, our results and theirs."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    with Checkout(rev) as other, tempfile.TemporaryDirectory(prefix="lith-against-runs-") as tmp:
        sides = [("ours", ROOT, ours), (other.rev, other.path, theirs)]
        for r in range(rounds):
            for name, library, into in sides if r % 2 == 0 else sides[::-1]:
                into.append(run_side(module, library, argv, Path(tmp) / f"{name}-{r}.json"))
                print(f"  round {r + 1}/{rounds}: {name} done (load {os.getloadavg()[0]:.2f})", flush=True)
        return other.rev, ours, theirs
