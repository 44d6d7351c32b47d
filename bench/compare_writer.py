"""Old and new writer side by side, in one run: `bench/writer.py` of two checkouts, interleaved.

Each round runs the old checkout's benchmark (`ours`), then this one's (`ours` and `keyed`:
commands carrying `tab` and `op`, so each is looked up and its outcome recorded), alternating
which goes first, each in its own process with its own virtualenv. The medians over all rounds
are printed with the ratios new / old.

    python bench/compare_writer.py --old ../fastapi-lith-old      # a checkout with `make install` done
    python bench/compare_writer.py --old ../fastapi-lith-old --rounds 5 --producers 1,50,200
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


def run(checkout: Path, variants: str, args: argparse.Namespace, out: Path) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), str(checkout / "bench" / "writer.py"), "--only", variants, "--reps", "1",
           "--producers", args.producers, "--sync", args.sync, "--json", str(out)]
    if args.quick:
        cmd.append("--quick")
    subprocess.run(cmd, check=True, cwd=checkout, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["runs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="the other checkout (with .venv installed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--producers", default="1,200")
    ap.add_argument("--sync", default="NORMAL,FULL")
    ap.add_argument("--quick", action="store_true", help="shorter windows (noisier)")
    args = ap.parse_args()
    new = HERE.parent
    found = print_conditions(loop="asyncio", tmpdir=Path(tempfile.gettempdir()), sources=("fastapi_lith/engine/writer.py", "fastapi_lith/backends/sqlite/writer.py"))
    old_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.old, capture_output=True, text=True).stdout.strip()
    new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=new, capture_output=True, text=True).stdout.strip()
    print(f"old {old_rev}, new {new_rev} (+ uncommitted changes, if any); {args.rounds} rounds, "
          f"producers {args.producers}, sync {args.sync}{', quick windows' if args.quick else ''}\n", flush=True)
    pooled: dict[str, list[dict]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("old", args.old, "ours,keyed"), ("new", new, "ours,keyed,tab")]
            for side, checkout, variants in order if r % 2 == 0 else order[::-1]:
                runs = run(checkout, variants, args, Path(tmp) / f"{side}{r}.json")
                for key, values in runs.items():
                    variant, sync, p = key.split("|")
                    pooled[f"{side} {variant}|{sync}|{p}"].extend(values)
                print(f"  round {r + 1}: {side} done", flush=True)

    def med(key: str, field: str) -> float:
        return statistics.median(run[field] for run in pooled[key])

    print("\n| sync | producers | variant | old cmd/s | new cmd/s | new / old | p50 ms old / new "
          "| CPU µs/cmd old / new | new / old CPU | others' cores |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for sync in args.sync.split(","):
        for p in args.producers.split(","):
            # `tab` (a TabCommand, new only) is set against the old `keyed`: it also writes its
            # tab's outcome row, which an app used to write by hand in `apply`.
            for variant, old_variant in (("ours", "ours"), ("keyed", "keyed"), ("tab", "keyed")):
                o, n = f"old {old_variant}|{sync.upper()}|{p}", f"new {variant}|{sync.upper()}|{p}"
                ro, rn = med(o, "rate"), med(n, "rate")
                print(f"| {sync.upper()} | {p} | {variant} | {ro:,.0f} | {rn:,.0f} | {rn / ro:.2f} "
                      f"| {med(o, 'p50_ms'):.3f} / {med(n, 'p50_ms'):.3f} "
                      f"| {med(o, 'cpu_us'):.1f} / {med(n, 'cpu_us'):.1f} "
                      f"| {med(n, 'cpu_us') / med(o, 'cpu_us'):.2f} | {med(o, 'other_cores'):.2f} |")
    print(f"\nmedians of {args.rounds} runs per cell; {one_line(found)}")


if __name__ == "__main__":
    main()
