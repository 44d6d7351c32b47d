"""The seam between the writer and a database: `Store`, `Batch` and `OutcomeTable`.

The writer (writer.py) owns what every backend shares: the queue, batching, the callers'
futures, the counters, the subscribers, the hop to its one thread, and when to forget old
outcomes. A `Store` owns one write connection and runs a whole batch in one transaction:

    open(feed, statements, forget_before)   connect, migrate, create the library's tables
    run(batch)                              every command of the batch, then COMMIT
    close()

Why a whole batch and not per-command primitives (begin, savepoint, release, commit) that the
writer would call: the two backends run a batch in shapes that share no loop. SQLite runs a
savepoint per command, waiting on each statement, at tens of thousands of commands a second,
where one more Python call per command shows; it runs the batch again after a statement that
ended the transaction. PostgreSQL sends the batch down a pipeline, first without savepoints,
learns only at the end how far the server got, and runs the batch again after a deadlock, a
serialization failure or a dropped connection. Primitives general enough for both would make
SQLite pay PostgreSQL's calls and hide PostgreSQL's retry inside the writer.

What both must do the same is the exactly-once protocol, written once here in `Batch`: before a
keyed command applies, `repeat(i)` asks the store's `OutcomeTable` whether the key has a first
outcome, and answers the command with it if so; after it applied (or rolled back), `record(i)`
writes its outcome in the same transaction. A store says only how a key is found and stored in
its SQL. Unkeyed commands, the common case, pass neither.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import Dialect

from .commands import Command
from .feed import Feed
from .outcomes import dump_outcome, load_outcome
from .statements import StatementCache
from .tx import Topics


class OutcomeTable(Protocol):
    """Where a store keeps each keyed command's first outcome (the table `lith_outcome`)."""

    def claim(self, key: str, now: float, since: float) -> tuple[bool, bytes | None]:
        """`(True, None)` if the key has no outcome since `since`, so its command applies now;
        else `(False, outcome)`, the first outcome as stored (JSON, or NULL: see outcomes.py)."""
        ...

    def record(self, key: str, now: float, outcome: bytes | None) -> None:
        """Store a claimed key's outcome, in the batch's transaction."""
        ...


class Batch:
    """One batch as a store runs it: the commands, their keys, and the answers so far.

    `keys` is None when no command has one. `now` is when the batch runs (a key's outcome is
    stamped with it), `since` the oldest outcome that still answers a repeat, `prune` whether
    the store also forgets outcomes older than that in this batch's transaction.
    """

    __slots__ = (
        "cmds", "errors", "keys", "now", "outcomes", "prune", "repeated_errors", "repeats", "results", "since",
        "topics", "window",
    )

    def __init__(self, cmds: list[Command], keys: list[str | None] | None, window: float, prune: bool) -> None:
        self.cmds = cmds
        self.keys = keys
        self.window = window
        self.prune = prune
        self.topics: Topics = frozenset()
        self.outcomes: OutcomeTable | None = None  # the store's, set before the first keyed command
        self.errors: list[BaseException | None] = [None] * len(cmds)
        self.reset(keep_errors=True)

    def reset(self, keep_errors: bool = False) -> None:
        """Forget every answer before the batch runs again (with `keep_errors`, a command that
        failed keeps its error and does not run again: see `pending`)."""
        n = len(self.cmds)
        self.now = time.time()
        self.since = self.now - self.window
        self.results: list[Any] = [None] * n
        if not keep_errors:
            self.errors = [None] * n
        self.repeats = 0
        self.repeated_errors = 0  # of the repeats, those whose first outcome was an error

    def pending(self) -> list[int]:
        """The commands still to run: those without an error."""
        return [i for i, error in enumerate(self.errors) if error is None]

    # -- exactly once ------------------------------------------------------------------------

    def repeat(self, i: int, key: str) -> bool:
        """True if command `i`'s key has a first outcome: the command is answered with it and
        must not apply. Else the key is the store's to record, in this transaction."""
        table = self.outcomes
        assert table is not None
        fresh, stored = table.claim(key, self.now, self.since)
        if fresh:
            return False
        self.results[i], self.errors[i] = load_outcome(type(self.cmds[i]), stored)
        self.repeats += 1
        if self.errors[i] is not None:
            self.repeated_errors += 1
        return True

    def record(self, i: int, key: str) -> None:
        """Store command `i`'s outcome (its result, or its error after its rollback)."""
        table = self.outcomes
        assert table is not None
        table.record(key, self.now, dump_outcome(type(self.cmds[i]), self.results[i], self.errors[i]))


class Store(Protocol):
    """One backend's write connection, used by the writer's one thread only."""

    @property
    def dialect(self) -> Dialect:
        """What the statement cache compiles commands' statements for."""
        ...

    @property
    def path(self) -> Path | None:
        """The database file, None for a server."""
        ...

    def describe(self) -> str:
        """What the store writes to, for logs and errors (never a password)."""
        ...

    def open(self, feed: Feed, statements: StatementCache, forget_before: float) -> None:
        """Connect, migrate, create the library's tables and the feed's, forget outcomes older
        than `forget_before`."""
        ...

    def run(self, batch: Batch) -> None:
        """Run `batch` in one transaction and commit it, publishing its topics to the feed.

        Each command's answer lands in `batch.results` or `batch.errors`, its topics in
        `batch.topics`. Raises if the batch did not commit: then no command of it applied.
        """
        ...

    def close(self) -> None:
        """Close the write connection."""
        ...
