"""CPython's cyclic garbage collector, scheduled for a process that holds thousands of streams.

Every open stream keeps hundreds of objects the collector tracks (the server's protocol and
task, the request, its generators, the encoder), and they live as long as the tab. A full
collection walks all of them, on the event loop, with every tick and every send waiting, and at
ten thousand tabs it is a good part of a broadcast. On the interpreter's schedule (a full one
at least every tenth middle one, and at every quarter of growth) there are many while tabs
open, and some in every broadcast (bench/RESULTS.md). The runtime's own objects
form no cycles, so those walks find nothing: reference counting frees them.

A serving hub therefore asks for a full collection a hundred times less often. Young and middle
collections, which find the short cycles an app makes (an exception and its traceback), keep
their schedule. An app that set its own thresholds, or turned the collector off, is left as it is.

Start-up leaves many long-lived objects (fastapi, SQLAlchemy, pydantic): frozen, the collector
stops walking them (bench/RESULTS.md, Writer). Once in a process: a frozen object is never
collected, and a process that starts engines as it goes (one per account) would freeze, at each
start, the cycles of the engines it had stopped, and keep them for good.
"""

from __future__ import annotations

import gc

__all__ = ["FULL_AFTER", "freeze_startup", "space_full_collections"]

# gc.get_threshold() as the interpreter starts: 3.11 and 3.12, then 3.13. Any other is an app's
# own choice (or an interpreter this module does not know), and stays.
INTERPRETER_SCHEDULES = {(700, 10, 10), (2000, 10, 10)}
# The third threshold: middle collections before a full one is considered (the interpreter's: 10).
FULL_AFTER = 1000


def space_full_collections() -> None:
    """Run full collections a hundred times less often, unless the process has a schedule of its own."""
    young, middle, full = gc.get_threshold()
    if gc.isenabled() and (young, middle, full) in INTERPRETER_SCHEDULES:
        gc.set_threshold(young, middle, FULL_AFTER)


_frozen = False


def freeze_startup() -> None:
    """Freeze what the process holds at its first start, and never again."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
