"""The benchmarks observe the library as an app does: through its public names and its metrics.

A benchmark that reads the engine's internals measures a library no app runs, and breaks on
every refactoring of them. So no bench/ file imports a `fastapi_lith` module outside the public
API (`fastapi_lith`'s `__all__`, `fastapi_lith.testing`, `fastapi_lith.ops`'s `__all__`), touches
a `._private` attribute, or reads the engine's own counters that `lith.metrics` shows. One
module is allowed the private imports, and says why: bench/lib/layers.py, the send path's
layers below the stream route.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fastapi_lith
import fastapi_lith.ops
import fastapi_lith.testing
from tests.support import REPO

PUBLIC = {
    "fastapi_lith": set(fastapi_lith.__all__) | {"__version__"},
    "fastapi_lith.testing": {n for n in vars(fastapi_lith.testing) if not n.startswith("_")},
    "fastapi_lith.ops": set(fastapi_lith.ops.__all__),
}
LAYERS = Path("bench/lib/layers.py")  # the one file allowed private imports
# The engine's counters behind the metrics (hub.counters, hub.instances, hub.dirty,
# Instance.rendering, writer.commands, writer.batches ...): read through `lith.metrics`.
ENGINE_COUNTERS = {"counters", "instances", "dirty", "rendering", "commands", "batches", "busy_seconds",
                   "observed", "commit_seconds", "tick_seconds", "renders_by_view"}
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make"}  # the standard library's public methods


def reaches(source: str, *, private_imports: bool = False) -> list[str]:
    """Where `source` reaches past the public API, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fastapi_lith.") and alias.name not in PUBLIC and not private_imports:
                    found.append(f"{line}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            module = node.module
            if module != "fastapi_lith" and not module.startswith("fastapi_lith."):
                continue
            if module not in PUBLIC:
                if not private_imports:
                    found.append(f"{line}: from {module} import ...")
                continue
            found += [f"{line}: from {module} import {a.name}" for a in node.names if a.name not in PUBLIC[module]]
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and name not in NAMEDTUPLE:
                found.append(f"{line}: .{name}")
            elif name in ENGINE_COUNTERS:
                found.append(f"{line}: .{name} (an engine counter: read lith.metrics)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            named = node.args[1] if len(node.args) > 1 else None
            if isinstance(named, ast.Constant) and isinstance(named.value, str) and named.value.startswith("_") \
                    and not named.value.startswith("__"):
                found.append(f"{line}: {node.func.id}(..., {named.value!r})")
    return found


def test_no_benchmark_reaches_past_the_public_api() -> None:
    files = sorted((REPO / "bench").rglob("*.py"))
    assert len(files) > 10
    found = []
    for path in files:
        relative = path.relative_to(REPO)
        found += [f"{relative}:{where}" for where in reaches(path.read_text(), private_imports=relative == LAYERS)]
    assert not found, "bench/ reaches into the library's privates:\n" + "\n".join(found)


def test_the_check_sees_what_the_benchmarks_used_to_do() -> None:
    """The lines the benchmarks had before they read the metrics are each caught."""
    before = """
from fastapi_lith import Command, Lith, Stream
from fastapi_lith import Subscription
from fastapi_lith.engine.frames import sse_event
import fastapi_lith.web.sse
from fastapi_lith.ops import Replica, litestream
ticks = hub.counters.ticks
board = hub.instances.get("board/1")
waiting = board in hub.dirty or board.rendering
per_tx = writer.commands / writer.batches
event = frame._sse
cached = getattr(frame, "_sse")
url = urlsplit(url)._replace(path="/x")
"""
    lines = sorted(int(f.split(":")[0]) for f in reaches(before))
    assert lines == [3, 4, 5, 6, 7, 8, 9, 9, 10, 10, 11, 12]  # not 2 (public names) nor 13 (namedtuple's)
    assert reaches("from fastapi_lith.engine.frames import sse_event\n", private_imports=True) == []
