"""What every scenario's command line does, written once.

A scenario is a module with a `measure(args) -> Result` and this at its end:

    if __name__ == "__main__":
        harness.main(__doc__, measure, arguments=arguments, plot=plot, children=CHILDREN)

and then runs as `python -m bench.NAME` from the repository's root, with these flags beside its
own: `--quick` (shorter windows, for `make bench`), `--smoke` (the smallest setting, about a
second: it proves the scenario runs, its figures mean nothing), `--rounds N`, `--against REV`
(the same scenario over another commit's library, interleaved with ours: same-run ratios and
their spread), `--json FILE`, and `--plot` (the scenario's SVGs, in bench/plots/). It prints
the conditions first, then the scenario's tables, then one `RESULT name: figure=value ...`
line (what the smoke test looks for), then the load average at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import against
from .conditions import conditions_line, load_average
from .stats import median, number


@dataclass
class Result:
    """One run of a scenario: the headline figures (compared by `--against`), the tables it
    prints, and what its plots draw."""

    figures: dict[str, float]
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, raw: dict[str, Any]) -> Result:
        return cls(raw["figures"], raw.get("text", ""), raw.get("data", {}))


Measure = Callable[[argparse.Namespace], Result]
Plot = Callable[[list[Result], list[Result], str, argparse.Namespace], list[Path]]


def parser(doc: str | None, arguments: Callable[[argparse.ArgumentParser], None] | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter windows: the quick pass of `make bench`")
    ap.add_argument("--smoke", action="store_true", help="the smallest setting, about a second: it runs, no more")
    ap.add_argument("--rounds", type=int, default=0, help="runs (default 1; with --against 3, --quick 2)")
    ap.add_argument("--against", default="", metavar="REV",
                    help="also run over REV's library (a temporary checkout), A B A B: same-run ratios")
    ap.add_argument("--json", default="", metavar="FILE", help="write every run's figures and tables here")
    ap.add_argument("--plot", action="store_true", help="write this scenario's plots into bench/plots/")
    ap.add_argument("--once-json", default="", help=argparse.SUPPRESS)  # one side's run, for --against
    ap.add_argument("--child", nargs=2, metavar=("ROLE", "JSON"), help=argparse.SUPPRESS)  # a process of a run
    if arguments is not None:
        arguments(ap)
    return ap


def without_against(argv: list[str]) -> list[str]:
    """The command line a side runs: ours, minus what only the parent does."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--against", "--rounds", "--json"):
            skip = True
            continue
        if arg.startswith(("--against=", "--rounds=", "--json=")) or arg == "--plot":
            continue
        out.append(arg)
    return out


def main(doc: str | None, measure: Measure, *, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
         plot: Plot | None = None, children: dict[str, Callable[..., Any]] | None = None) -> None:
    args = parser(doc, arguments).parse_args()
    module = sys.modules["__main__"].__spec__.name  # type: ignore[union-attr]
    name = module.rsplit(".", 1)[-1]
    if args.child:  # one process of a multi-process run: its answer is its last line
        role, raw = args.child
        answer = children[role](**json.loads(raw)) if children else None
        if asyncio.iscoroutine(answer):
            answer = asyncio.run(answer)
        print(json.dumps(answer, default=str), flush=True)
        return
    if args.once_json:
        import fastapi_lith  # already imported by the scenario: which checkout it came from

        result = measure(args)
        result.data["library"] = str(Path(fastapi_lith.__file__).parent.parent)
        Path(args.once_json).write_text(json.dumps(asdict(result), default=str))
        return
    started = time.perf_counter()
    print(f"# {name}: {(doc or '').strip().splitlines()[0]}")
    print(f"conditions: {conditions_line()}")
    print("$ python -m " + " ".join([module, *sys.argv[1:]]) + "\n", flush=True)
    theirs: list[Result] = []
    rev = ""
    if args.against:
        rounds = args.rounds or (2 if args.quick or args.smoke else 3)
        rev, ours_raw, theirs_raw = against.interleave(module, args.against, without_against(sys.argv[1:]), rounds)
        ours = [Result.load(r) for r in ours_raw]
        theirs = [Result.load(r) for r in theirs_raw]
        print("\n" + ours[-1].text)
        print(f"\nours: {ours[-1].data.get('library')}; {rev}: a temporary checkout ({theirs[-1].data.get('library')})")
        print("\n" + compare(ours, theirs, rev))
    else:
        ours = [measure(args) for _ in range(args.rounds or 1)]
        print(ours[-1].text)
        if len(ours) > 1:
            print("\n" + spread_table(ours))
    figures = {k: median([r.figures[k] for r in ours if k in r.figures]) for k in ours[-1].figures}
    print(f"\nRESULT {name}: " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()))
    if args.plot and plot is not None:
        for path in plot(ours, theirs, rev, args):
            print(f"plot: {path}")
    if args.json:
        Path(args.json).write_text(json.dumps({"conditions": conditions_line(), "argv": sys.argv, "against": rev,
                                               "ours": [asdict(r) for r in ours],
                                               "theirs": [asdict(r) for r in theirs]}, indent=1, default=str))
    print(f"\n{time.perf_counter() - started:.0f} s; load average at the end: {load_average()}")


def spread_table(results: list[Result]) -> str:
    lines = [f"Over {len(results)} rounds:\n", "| figure | median | min | max |", "|---|---:|---:|---:|"]
    for key in results[-1].figures:
        values = [r.figures[key] for r in results if key in r.figures]
        lines.append(f"| {key} | {median(values):.4g} | {min(values):.4g} | {max(values):.4g} |")
    return "\n".join(lines)


def compare(ours: list[Result], theirs: list[Result], rev: str) -> str:
    """Each figure, ours against theirs, and the ratio within each round: median (min–max)."""
    lines = [f"Ours against {rev}, {len(ours)} rounds interleaved (ratio = ours / theirs within a round):\n",
             f"| figure | ours | {rev} | ratio, median | ratio, min–max |", "|---|---:|---:|---:|---:|"]
    for key in ours[-1].figures:
        pairs = [(a.figures[key], b.figures[key]) for a, b in zip(ours, theirs, strict=True)
                 if key in a.figures and key in b.figures]
        ratios = [a / b for a, b in pairs if b and a == a and b == b]
        if not pairs:
            continue
        mid = median([a for a, _ in pairs]), median([b for _, b in pairs])
        span = f"{min(ratios):.3f}–{max(ratios):.3f}" if ratios else "–"
        lines.append(f"| {key} | {mid[0]:.4g} | {mid[1]:.4g} | {number(median(ratios), 3)} | {span} |")
    return "\n".join(lines)


def child(role: str, **kwargs: Any) -> Any:
    """This scenario in a new process over the same library, as one of `children[role]`; its
    stdin and stdout are pipes (a child may say "ready" and read the window's start)."""
    import subprocess

    from .checkout import LIBRARY, child_env, module_argv

    module = sys.modules["__main__"].__spec__.name  # type: ignore[union-attr]
    return subprocess.Popen(module_argv(module, "--child", role, json.dumps(kwargs)), cwd=LIBRARY, env=child_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def answer(proc: Any, timeout: float = 300) -> Any:
    """A child's answer: the JSON of its last line."""
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"a child process failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])
