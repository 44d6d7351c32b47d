"""The scenarios' plots: SVG files in bench/plots/, drawn by the script that measured them.

    fig, ax = figure("Writer throughput against producers", "producers", "commands/s")
    ax.plot(...)
    paths.append(save(fig, "writer-producers", caption))

Each plot carries its conditions in a caption line, as each table in RESULTS.md does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkout import BENCH

PLOTS = BENCH / "plots"


def figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    # Text stays text (a third of the size, searchable); ids are stable from run to run.
    plt.rcParams.update({"svg.hashsalt": "lith-bench", "svg.fonttype": "none", "font.size": 9, "axes.grid": True,
                         "grid.alpha": 0.3})
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def save(fig: Any, name: str, caption: str) -> Path:
    """Write `name`.svg with `caption` (the command and conditions) under the axes."""
    import matplotlib.pyplot as plt

    fig.text(0.01, 0.01, caption, fontsize=6, color="0.35", ha="left", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.1, 1, 0.9))
    PLOTS.mkdir(exist_ok=True)
    path = PLOTS / f"{name}.svg"
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path
