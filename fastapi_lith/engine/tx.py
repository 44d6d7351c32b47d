"""`Tx`: what a command's `apply` sees, on any backend.

Its own module so that commands.py can name it at import time: the writer imports the
commands, never the other way round.
"""

from __future__ import annotations

from typing import Any

from .. import settings
from .db import Db
from .statements import StatementCache

Topics = frozenset[str]


class Tx(Db):
    """What a command sees: the write connection inside its savepoint, and the topics it touches."""

    __slots__ = ("_touched",)

    def __init__(self, conn: Any, cache: StatementCache) -> None:
        super().__init__(conn, cache)
        # One list for the whole batch: a rolled-back command's topics are cut off at its mark.
        self._touched: list[str] = []

    def touch(self, *topics: str) -> None:
        """Mark topics changed: views that watch them render in the next tick, if this commits."""
        for topic in topics:
            if type(topic) is not str:  # a list here would fail the whole batch's commit
                settings.topic_names("tx.touch", topics)
        self._touched.extend(topics)

    def mark(self) -> int:
        """Where the next command's topics begin, for `forget_since` if it rolls back."""
        return len(self._touched)

    def forget_since(self, mark: int) -> None:
        """Drop the topics touched since `mark` (0: all): their command rolled back."""
        del self._touched[mark:]

    def touched_topics(self) -> Topics:
        """The topics the batch's commands touched: what its commit publishes."""
        return frozenset(self._touched)
