"""The counter example as the tab benchmarks and tests serve it: `uvicorn bench.lib.tabsapp:app`.

The example itself (its shared `counter` view, `POST /add`), with three things more: a per-tab
view, `mine/{tab}`, rendered for each tab when the counter changes; `status`, the count in a
shared view of about 2 KB, large enough that a zstd stream opens a window for it (a smaller
view's writes go alone, so its streams have no window to hibernate); and `POST /note`, a
command that touches only its own tab's outcome (a request that moves no other tab: what a
server's responsiveness is read by while it broadcasts). `TABS_HIBERNATE_AFTER` and
`TABS_RECONNECT_WITHIN` (seconds) set the two stream settings a herd depends on.
"""

from __future__ import annotations

import os

import htpy as h

from examples.counter.app import COUNT, app, lith
from fastapi_lith import Db, TabCommand, Tx

lith.hibernate_after = float(os.environ.get("TABS_HIBERNATE_AFTER", lith.hibernate_after))
lith.reconnect_within = float(os.environ.get("TABS_RECONNECT_WITHIN", lith.reconnect_within))


@lith.view("mine/{tab}", topics={"counter"})
def mine(db: Db, tab: str) -> h.Element:
    return h.p("#mine")[f"{tab} sees {db.scalar(COUNT)}"]  # the marker bench/lib/tabs.py's MINE reads


@lith.view("status", topics={"counter"})
def status(db: Db) -> h.Element:
    services = (h.li[f"service {i:02d}: up, answering within its bounds"] for i in range(40))
    return h.section("#status")[h.p[h.span(".count")[str(db.scalar(COUNT))], " changes"], h.ul[services]]


class Note(TabCommand):
    """Say something to the tab that asked, and to nobody else."""

    def apply(self, tx: Tx) -> None:
        self.say("Noted.")


lith.command(app, "/note", Note)
