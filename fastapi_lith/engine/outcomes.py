"""Exactly once: idempotency keys, and the first outcome of each keyed command.

Datastar retries a POST after a network error, so a command whose transaction committed but
whose answer was lost would apply twice. A keyed command's outcome is written in the same
transaction as the command; a repeat within the window finds it and is not applied again.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import htpy as h
from htpy import Element
from sqlalchemy import text

from ..exceptions import OutcomeLost
from .db import Db

# What an `Idempotency-Key` header may hold (web/dependency.py).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")

# The library's own table: each keyed command's first outcome, written in the command's own
# transaction, so a repeat that finds no row knows the first never committed. A rowid table:
# rows append in time order and only the small key index takes scattered inserts (keyed by
# the key text, WITHOUT ROWID, each insert split pages all over the tree and cost far more).
OUTCOMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_outcome (key TEXT NOT NULL UNIQUE, at REAL NOT NULL, outcome BLOB);
CREATE INDEX IF NOT EXISTS lith_outcome_at ON lith_outcome (at);
"""
FIND_OUTCOME = "SELECT outcome FROM lith_outcome WHERE key = ? AND at >= ?"
RECORD_OUTCOME = "INSERT OR REPLACE INTO lith_outcome (key, at, outcome) VALUES (?, ?, ?)"
PRUNE_OUTCOMES = "DELETE FROM lith_outcome WHERE at < ?"

# Each tab's latest outcome, for its outcome view: one row per tab, written by the writer after
# each `TabCommand` in the command's own transaction. An older op arriving late (a retry) does
# not overwrite a newer one, so `done` never moves back and a newer button never hangs.
TABS_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_tab (
    tab TEXT PRIMARY KEY, op INTEGER NOT NULL, ok INTEGER NOT NULL, message TEXT, at REAL NOT NULL
);
"""
# `text`: the statement cache binds them for SQLite and for PostgreSQL alike.
RECORD_TAB = text(
    "INSERT INTO lith_tab (tab, op, ok, message, at) VALUES (:tab, :op, :ok, :message, :at) "
    "ON CONFLICT (tab) DO UPDATE SET op = excluded.op, ok = excluded.ok, "
    "message = excluded.message, at = excluded.at WHERE excluded.op >= lith_tab.op"
)
LAST_TAB = text("SELECT op, ok, message FROM lith_tab WHERE tab = :tab")
# A tab's outcome outlives the repeat window: a page left open for days still shows its last one.
TAB_KEEP = 7 * 24 * 3600.0
PRUNE_TABS = "DELETE FROM lith_tab WHERE at < ?"


def dump_outcome(ok: bool, value: Any) -> bytes | None:
    """The outcome as stored: NULL for the common `None` result, else a pickle."""
    if ok and value is None:
        return None
    try:
        return pickle.dumps((ok, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result must not fail the command
        lost = OutcomeLost(f"the command was applied once; its {'result' if ok else 'error'} "
                           f"({type(value).__name__}) could not be stored: {exc}")
        return pickle.dumps((False, lost), protocol=pickle.HIGHEST_PROTOCOL)


def load_outcome(blob: bytes | None) -> tuple[bool, Any]:
    if blob is None:
        return True, None
    try:
        ok, value = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - e.g. the result's class was renamed since
        return False, OutcomeLost(f"the command was applied once; its outcome cannot be read back: {exc}")
    return ok, value


def outcome_view(db: Db, tab: str, *, hint: str = "") -> Element:
    """The built-in `"outcome/{tab}"` view: the outcome of the tab's newest op, and `done` set to it.

    A new op starts a fresh outcome. The message belongs to one op and shows only while `done` is
    that op (`data-show`), so a refused request's error, pushed into `#lith-error` with `done` set
    to its own op, replaces the message of the op before rather than sitting under it. A command
    that succeeds without `say()` shows no message. `ok_op` is set when it succeeded, so a page
    can clear or close the form that sent it.
    """
    last = db.first(LAST_TAB, {"tab": tab})
    if last is None:
        return h.div("#outcome.outcome", {"data-signals:done": "0"}, role="status")[
            hint and h.p(".message.hint", {"data-show": "$done == 0"})[hint], h.div("#lith-error")
        ]
    op = str(last["op"])
    signals = {"data-signals:done": op}
    if last["ok"]:
        signals["data-signals:ok_op"] = op
    kind, role = (".ok", None) if last["ok"] else (".failed", "alert")
    mine = {"data-show": f"$done == {op}"}
    return h.div("#outcome.outcome", signals, role="status")[
        last["message"] and h.p(f".message{kind}", mine, role=role)[last["message"]], h.div("#lith-error")
    ]
