"""The encoders: bytes, CPU and memory per stream on a 142 KB kanban board.

Frames are Datastar `datastar-patch-elements` events of the whole board (examples/kanban/synthetic.py,
200 cards, about 144 KB each), one card changed per frame: even steps rename a card, odd steps
move one to another lane. Each configuration encodes the same frames in one stream, through
the library's encoders.

  bytes   per frame after the first: median, mean (what a link carries), p90
  CPU     one `encode` of the next frame, timed by pyperf (`python -m pyperf timeit`: its own
          worker processes, calibrated loops, warm-ups; mean ± standard deviation)
  memory  RSS per live encoder over 200 of them, each having sent 10 frames (enough to fill a
          2^20 window), in a fresh process per configuration; for zstd also after all
          hibernated

    python -m bench.encoders                 # about 2 minutes
    python -m bench.encoders --quick --plot  # bench/plots/encoders-window.svg, encoders-memory.svg
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datastar_py.sse import ServerSentEventGenerator

from examples.kanban.synthetic import board_html, change_card, make_cards
from fastapi_lith import BrotliEncoder, Encoder, GzipEncoder, IdentityEncoder, ZstdEncoder

from .lib import conditions, harness, perf, plot
from .lib.proc import rss
from .lib.stats import number

MiB = 2**20
CONFIGS: dict[str, Callable[[], Encoder]] = {
    "zstd sized (default)": ZstdEncoder,
    "zstd 2^17": lambda: ZstdEncoder(window_log=17),
    "zstd 2^18": lambda: ZstdEncoder(window_log=18),
    "zstd 2^19": lambda: ZstdEncoder(window_log=19),
    "zstd 2^20": lambda: ZstdEncoder(window_log=20),
    "zstd 2^21": lambda: ZstdEncoder(window_log=21),
    "zstd low_memory": ZstdEncoder.low_memory,
    "brotli q4 (default)": BrotliEncoder,
    "brotli q3": lambda: BrotliEncoder(quality=3),
    "gzip L6 (default)": GzipEncoder,
    "identity": IdentityEncoder,
}
TIMED = ("zstd sized (default)", "brotli q4 (default)", "gzip L6 (default)")
MEMORY = ("zstd sized (default)", "zstd 2^19", "zstd low_memory", "brotli q4 (default)", "gzip L6 (default)")
# lith (Go) on its 142,067-byte board: bytes per one-card frame by zstd window (DESIGN.md),
# and MiB per stream.
LITH_BYTES = {17: 10_831, 18: 2_703, 19: 1_471, 20: 794}
LITH_MIB = {"zstd": 1.65, "brotli": 9.9, "zstd hibernated": 0.106}
# Our earlier Python on a 148 KB board (DESIGN.md): bytes, µs, MiB
EARLIER = {"zstd 2^19": (1_375, 27, 0.74), "gzip L6 (default)": (8_500, 661, None)}


def frames(n: int, cards: int = 200) -> list[bytes]:
    board = make_cards(cards, seed=1)
    out = []
    for step in range(n):
        out.append(ServerSentEventGenerator.patch_elements(board_html(board)).encode())
        board = change_card(board, step)
    return out


def sizes(name: str, events: list[bytes]) -> dict[str, float]:
    encoder = CONFIGS[name]()
    sent = [len(encoder.encode(e)) for e in events]
    encoder.close()
    rest = sorted(sent[1:])
    return {"first": sent[0], "median": statistics.median(rest), "mean": statistics.fmean(rest),
            "p90": rest[int(0.9 * (len(rest) - 1))]}


def setup(name: str, n: int) -> tuple[Encoder, Any]:
    """For pyperf's workers: an encoder past its first frame, and the frames to cycle through."""
    encoder = CONFIGS[name]()
    events = frames(n)
    encoder.encode(events[0])
    return encoder, itertools.cycle(events[1:])


def timed(name: str, n: int, mode: list[str], out: Path) -> dict[str, float]:
    """µs per encode from `pyperf timeit` over the library under test."""
    mean, sd = perf.timeit(name, [f"from bench.encoders import setup; encoder, events = setup({name!r}, {n})"],
                           "encoder.encode(next(events))", mode, out)
    return {"us": mean * 1e6, "us_sd": sd * 1e6}


def memory_child(name: str, streams: int, sent: int) -> dict[str, float]:
    """A fresh process: RSS per live encoder (and hibernated, where it can)."""
    events = frames(sent)
    gc.collect()
    before = rss()
    encoders = []
    for _ in range(streams):
        encoder = CONFIGS[name]()
        for e in events:
            encoder.encode(e)
        encoders.append(encoder)
    gc.collect()
    out = {"live": (rss() - before) / streams}
    if encoders[0].can_hibernate:
        for encoder in encoders:
            encoder.hibernate()
        gc.collect()
        out["hibernated"] = (rss() - before) / streams
    return out


def measure(args: argparse.Namespace) -> harness.Result:
    n, streams = (8, 10) if args.smoke else (40, 50) if args.quick else (200, 200)
    mode = perf.mode(args)
    events = frames(n)
    results = {name: sizes(name, events) for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="lith-bench-encoders-") as tmp:
        for name in TIMED[:1] if args.smoke else TIMED:
            results[name].update(timed(name, min(n, 40), mode, Path(tmp) / f"{len(results)}-{TIMED.index(name)}.json"))
    for name in MEMORY if not args.smoke else MEMORY[:1]:
        results[name].update(harness.answer(harness.child("memory", name=name, streams=streams, sent=min(n, 10))))
    figures = {"zstd_default_mean_bytes": results["zstd sized (default)"]["mean"],
               "brotli_default_median_bytes": results["brotli q4 (default)"]["median"]}
    defaults = (("zstd sized (default)", "zstd"), ("brotli q4 (default)", "brotli"), ("gzip L6 (default)", "gzip"))
    for name, key in defaults:
        if "us" in results[name]:
            figures[f"{key}_us_per_frame"] = results[name]["us"]
        if "live" in results[name]:
            figures[f"{key}_mib_per_stream"] = results[name]["live"] / MiB
    if "hibernated" in results["zstd sized (default)"]:
        figures["zstd_hibernated_mib"] = results["zstd sized (default)"]["hibernated"] / MiB
    return harness.Result(figures, table(results, n, streams, mode), {"results": results})


def table(results: dict[str, dict[str, float]], n: int, streams: int, mode: list[str]) -> str:
    lines = [f"{n} frames; CPU: {perf.describe(mode)}; memory: {streams} "
             "encoders × 10 frames.\n",
             "| config | first B | median B | mean B | p90 B | µs per frame (± sd) | MiB per stream (hibernated) "
             "| lith B |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        us = f"{r['us']:.0f} ± {r['us_sd']:.0f}" if "us" in r else ""
        mib = f"{r['live'] / MiB:.3f}" if "live" in r else ""
        if "hibernated" in r:
            mib += f" ({r['hibernated'] / MiB:.3f})"
        window = int(name.split("^")[1]) if "^" in name else None
        lith = f"{LITH_BYTES[window]:,}" if window in LITH_BYTES else ""
        lines.append(f"| {name} | {r['first']:,} | {number(r['median'])} | {number(r['mean'])} | {r['p90']:,} | {us} "
                     f"| {mib} | {lith} |")
    lines.append(f"\nlith (Go): MiB per stream zstd {LITH_MIB['zstd']}, brotli {LITH_MIB['brotli']}, zstd hibernated "
                 f"{LITH_MIB['zstd hibernated']}. Our earlier Python (148 KB board): "
                 + "; ".join(f"{k} {b:,} B, {us} µs" for k, (b, us, _) in EARLIER.items()) + ".")
    return "\n".join(lines)


def draw(ours: list[harness.Result], theirs: list[harness.Result], rev: str, args: argparse.Namespace) -> list[Path]:
    results = ours[-1].data["results"]
    caption = conditions.caption(f"python -m bench.encoders{' --quick' if args.quick else ''} --plot")
    fig, ax = plot.figure("zstd: bytes per one-card frame of a 142 KB board", "window (log2 bytes)",
                          "bytes per frame")
    for stat, style in (("mean", "o-"), ("median", "o:")):
        points = sorted((int(k.split("^")[1]), r[stat]) for k, r in results.items() if k.startswith("zstd 2^"))
        ax.plot(*zip(*points, strict=True), style, color="tab:blue", label=f"ours, zstd level 1, {stat}")
    ax.set_xticks(range(17, 22))
    ax.axhline(results["zstd sized (default)"]["mean"], color="tab:green", ls="--", lw=1,
               label="ours, default (sized to the first write), mean")
    ax.plot(list(LITH_BYTES), list(LITH_BYTES.values()), "x--", color="tab:red", label="lith (Go), as published")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    paths = [plot.save(fig, "encoders-window", caption)]
    fig, ax = plot.figure("Memory per stream by encoding, awake and hibernated", "", "MiB per stream (RSS)")
    names = [k for k in MEMORY if "live" in results[k]]
    ax.bar(range(len(names)), [results[k]["live"] / MiB for k in names], label="awake")
    hib = [(i, results[k]["hibernated"] / MiB) for i, k in enumerate(names) if "hibernated" in results[k]]
    if hib:
        ax.bar([i for i, _ in hib], [v for _, v in hib], width=0.4, label="hibernated")
        for i, v in hib:
            ax.annotate(f"hibernated {v:.3f}", (i, v), textcoords="offset points", xytext=(0, 4), ha="center",
                        fontsize=6)
    ax.set_xticks(range(len(names)), names, rotation=15, fontsize=7)
    ax.axhline(LITH_MIB["zstd"], color="tab:red", ls="--", lw=1, label="lith (Go), zstd 2^19")
    ax.legend(fontsize=7)
    paths.append(plot.save(fig, "encoders-memory", caption))
    return paths


if __name__ == "__main__":
    harness.main(__doc__, measure, plot=draw, children={"memory": memory_child})
