"""Old and new hub side by side, in one run: `bench/hub.py` of two checkouts, interleaved.

Each round runs the old checkout's benchmark, then this one's (alternating which goes first),
each in its own process with its own virtualenv, on the scenarios asked for. The medians over
all rounds are printed with the ratios new / old.

    python bench/compare_hub.py --old ../fastapi-lith-old      # a checkout with `make install` done
    python bench/compare_hub.py --old ../fastapi-lith-old --rounds 3 --seconds 8 --only normal
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conditions import one_line, print_conditions  # noqa: E402

# (field, label, higher is better)
FIELDS = (
    ("ticks_per_s", "ticks/s", True),
    ("renders_per_s", "renders/s", True),
    ("frames_per_s", "frames/s", True),
    ("commands_per_s", "Moves/s", True),
    ("tick_p50", "tick p50 ms", False),
    ("tick_p95", "tick p95 ms", False),
    ("commit_p50", "commit p50 ms", False),
    ("cores", "cores", False),
    ("cores_loop", "loop cores", False),
    ("cores_readers", "reader cores", False),
)


def run(checkout: Path, args: argparse.Namespace, out: Path) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), str(checkout / "bench" / "hub.py"), "--only", args.only, "--seconds", str(args.seconds),
           "--warmup", "1", "--json", str(out)]
    subprocess.run(cmd, check=True, cwd=checkout, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["results"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="the other checkout (with .venv installed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured window per scenario")
    ap.add_argument("--only", default="normal", help="scenarios of bench/hub.py")
    args = ap.parse_args()
    new = HERE.parent
    found = print_conditions(loop="asyncio", tmpdir=Path(tempfile.gettempdir()), sources=("fastapi_lith/engine/hub.py",))
    revs = [subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=c, capture_output=True, text=True).stdout.strip()
            for c in (args.old, new)]
    print(f"old {revs[0]}, new {revs[1]} (+ uncommitted changes, if any); {args.rounds} rounds of "
          f"{args.seconds:g} s windows, scenarios {args.only}\n", flush=True)
    pooled: dict[tuple[str, str], list[dict]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("old", args.old), ("new", new)]
            for side, checkout in order if r % 2 == 0 else order[::-1]:
                for scenario, result in run(checkout, args, Path(tmp) / f"{side}{r}.json").items():
                    pooled[(side, scenario)].append(result)
                print(f"  round {r + 1}: {side} done", flush=True)
    for scenario in args.only.split(","):
        print(f"\n{scenario}:\n\n| measure | old | new | new / old |\n| --- | ---: | ---: | ---: |")
        for field, label, _ in FIELDS:
            old = statistics.median(x[field] for x in pooled[("old", scenario)])
            now = statistics.median(x[field] for x in pooled[("new", scenario)])
            print(f"| {label} | {old:,.3f} | {now:,.3f} | {now / old if old else float('nan'):.2f} |")
    print(f"\nmedians of {args.rounds} runs per cell; {one_line(found)}")


if __name__ == "__main__":
    main()
