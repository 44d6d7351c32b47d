"""The write connection in pipeline mode: statements go out without waiting for the server.

A batch's SAVEPOINTs and statements are sent back to back (psycopg's pipeline mode), so a batch
costs a few round trips instead of several per command. What a command reads still arrives in
time: reading a cursor's rows, `rowcount` or status waits for it. What it cannot see in time is
its own error, nor another command's: `Replay` says so, and the writer runs the command whose
statement failed again, waiting on each statement (see pgwriter.py).

psycopg has no public hook for these, so this module reads a few of its attributes: the
connection's `_pipeline` and its `result_queue`, the cursor's `_rowcount`, the connection's
`_prepared` statements (cleared after a pipeline the server aborted). tests/backends/test_pgwriter.py
fails if they change meaning.
"""

from __future__ import annotations

from typing import Any

import psycopg


class Replay(BaseException):
    """A statement sent ahead in the pipeline failed. A BaseException, so that no `except
    Exception` in a command's apply() takes it for its own error: the writer finds whose
    statement it was and runs that command again, waiting on each statement (see `PgWriter`)."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


class WriterConnection(psycopg.Connection[Any]):
    """The write connection: it counts the statements sent, so that the writer knows whether a
    failing command wrote anything that it must roll back."""

    sent = 0

    @property
    def open_pipeline(self) -> psycopg.Pipeline | None:
        """The pipeline in progress, if any: psycopg keeps it private."""
        return self._pipeline


class WriterCursor(psycopg.Cursor[Any]):
    """The write connection's cursor. In pipeline mode a result (rows, `rowcount`, the status)
    is waited for when read, and an error of any statement sent ahead leaves apply() as
    `Replay`; outside it (a command run again) it is psycopg's own cursor."""

    _conn: WriterConnection

    def _wait(self) -> None:
        pipeline = self._conn.open_pipeline
        if pipeline is not None and pipeline.result_queue:
            try:
                pipeline.sync()
            except psycopg.Error as exc:
                raise Replay(exc) from exc
            deallocate_owed(self._conn)

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        self._conn.sent += 1
        try:
            return super().execute(query, params, prepare=prepare, binary=binary)
        except psycopg.Error as exc:
            if self._conn.open_pipeline is None:
                raise
            raise Replay(exc) from exc

    def executemany(self, query: Any, params_seq: Any, *, returning: bool = False) -> None:
        self._conn.sent += 1
        try:
            super().executemany(query, params_seq, returning=returning)
        except psycopg.Error as exc:
            if self._conn.open_pipeline is None:
                raise
            raise Replay(exc) from exc

    def fetchone(self) -> Any:
        if self.pgresult is None:
            self._wait()
        return super().fetchone()

    def fetchmany(self, size: int = 0) -> Any:
        if self.pgresult is None:
            self._wait()
        return super().fetchmany(size)

    def fetchall(self) -> Any:
        if self.pgresult is None:
            self._wait()
        return super().fetchall()

    def __next__(self) -> Any:
        if self.pgresult is None:
            self._wait()
        return super().__next__()

    @property
    def rowcount(self) -> int:
        self._wait()  # executemany's count grows as its results arrive: wait for them all
        return self._rowcount

    @property
    def statusmessage(self) -> str | None:
        if self.pgresult is None:
            self._wait()
        return super().statusmessage

    @property
    def description(self) -> Any:
        if self.pgresult is None:  # set before psycopg makes rows, when lith_row reads this
            self._wait()
        return super().description


def deallocate_owed(conn: psycopg.Connection[Any]) -> None:
    """Send now the DEALLOCATE ALL that psycopg owes, if any. psycopg forgets its prepared
    statements when the result of a ROLLBACK (to a savepoint too) or of DDL comes in, and
    deallocates them on the server at the end of the statement it is running. A result that
    came in with a Sync, no statement running, leaves that owed until the end of the next one,
    which may be a statement psycopg prepares anew, dropped by the late DEALLOCATE ALL while
    psycopg still counts on it: the next use would fail."""
    prepared = conn._prepared  # noqa: SLF001 - psycopg has no public way to ask
    if prepared._to_flush:  # noqa: SLF001
        with conn.lock:
            conn.wait(prepared.maintain_gen(conn))


def forget_prepared(conn: psycopg.Connection[Any]) -> None:
    """Forget every prepared statement after a pipeline the server aborted at a failing statement.

    psycopg counts a statement as prepared when it sends its PREPARE, if it has run it before
    unprepared (`prepare_threshold` times: the writer's own RELEASE soon is), and checks no
    result: sent behind the failure, skipped by the server, it would next run by a name the
    server never had, and fail the batch. psycopg forgets them all on a ROLLBACK only when that
    statement's text is new to it; this has it do so after every such pipeline. The DEALLOCATE ALL goes out
    after the rollback that follows (see `deallocate_owed`)."""
    conn._prepared.clear()  # noqa: SLF001 - psycopg has no public way to ask
