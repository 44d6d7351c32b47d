"""Where a process's time goes: py-spy attached for a window, and one summary of its stacks.

    spy = Spy(pid, seconds)          # py-spy record --threads -f raw, for `seconds`
    ... the window ...
    print(spy.summary())             # per thread role, then the library's own functions

The summary needs no rules per scenario: each sample counts for its thread's role (the
library's thread names), for the deepest frame that is the library's or the app's code
(inclusive: everything it called), and for its leaf frame (exclusive).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from .proc import thread_group

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
OWN = ("fastapi_lith/", "examples/")
# Leaves where a thread waits rather than works: py-spy's idle detection does not see these as
# idle on every machine.
WAITS = ("select (selectors.py", "EpollSelector.select", "_worker (concurrent", "wait (threading.py",
         "get (queue.py", "_work (fastapi_lith/engine/threads.py", "run_forever")


def py_spy() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


class Spy:
    """py-spy recording a running process for `seconds` (started now)."""

    def __init__(self, pid: int, seconds: float, *, rate: int = 200, subprocesses: bool = False) -> None:
        self.raw = Path(tempfile.mkstemp(prefix="lith-spy-", suffix=".txt")[1])
        self.rate = rate
        cmd = [py_spy(), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate),
               "--format", "raw", "--threads", "--nonblocking", "--output", str(self.raw)]
        if subprocesses:
            cmd.append("--subprocesses")
        self.command = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def summary(self, top: int = 12) -> str:
        _, err = self.proc.communicate(timeout=120)
        if self.proc.returncode or not self.raw.stat().st_size:
            return f"py-spy recorded nothing ({self.proc.returncode}): {err.strip()[-300:]}"
        return summarise(self.raw.read_text(), top=top)


def summarise(raw: str, top: int = 12) -> str:
    """py-spy's raw `--threads` stacks (`thread (tid): name;frame;...;frame count`) as tables."""
    roles: Counter[str] = Counter()
    own: dict[str, Counter[str]] = defaultdict(Counter)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        head, _, rest = stack.partition(";")
        thread = head.split(": ", 1)[1] if ": " in head else head
        role = "loop" if thread.startswith("MainThread") or not thread else thread_group(thread)
        frames = rest.split(";") if rest else []
        leaf = frames[-1] if frames else "(none)"
        if any(w in leaf for w in WAITS):
            role += ", waiting"
        total += n
        roles[role] += n
        leaves[role][leaf] += n
        mine = [f for f in frames if any(o in f for o in OWN)]
        if mine:
            m = FRAME.match(mine[-1])
            own[role][f"{m['func']} ({m['file']})" if m else mine[-1]] += n
    if not total:
        return "no samples"
    lines = [f"{total} samples.\n", "| thread | share |", "|---|---:|"]
    lines += [f"| {r} | {n / total:.1%} |" for r, n in roles.most_common()]
    for role, n in roles.most_common():
        if role.endswith("waiting"):
            continue
        lines += ["", f"{role}: the library's deepest function in the stack (inclusive) | the leaf (exclusive)", ""]
        for (label, c), (leaf, k) in zip(own[role].most_common(top), leaves[role].most_common(top), strict=False):
            lines.append(f"- {c / n:5.1%} `{label}` | {k / n:5.1%} `{leaf}`")
    return "\n".join(lines)
