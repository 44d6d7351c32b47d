"""OpenTelemetry spans of a command's path: accepted, queued, committed, first frame out.

Imported only once the app has set a real TracerProvider (lith.py asks the API the app
imported, before importing this): an app that does not trace pays for no span and no import.
Each command the writer takes becomes a trace of its own, or the child of its caller's span
(the request's server span, when FastAPI or opentelemetry-instrumentation-fastapi traces it):

    lith.command <Name>    writer.do accepted it ... the writer answered
      lith.queued          accepted ... taken into a batch
      lith.commit          taken ... the batch's COMMIT (batch size, outcome, idempotency key)
      lith.frame           COMMIT ... a stream took the first frame that shows it (view keys)

The engine records the times (engine/writer.py's `TracedBatch`, the hub's `FrameTracer`
calls); the spans are made here afterwards with those times, so no span is open on the
writer's path. A frame shows a commit when its render began after the COMMIT, on a view that
watches a topic the batch touched.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import context, trace
from opentelemetry.trace import Status, StatusCode, Tracer, TracerProvider

from ..engine.engine import Engine
from ..engine.frames import Frame
from ..engine.hub import Hub, Instance
from ..engine.store import Batch
from ..engine.writer import TracedBatch
from ..exceptions import Rejected

log = logging.getLogger("fastapi_lith.tracing")

# At most this many commands wait for their first frame: past it the oldest are forgotten,
# without one (a view that failed to render, or closed before it did, never shows its commit).
WAITING = 10_000

F = TypeVar("F", bound=Callable[..., None])


@contextmanager
def traced(engine: Engine, provider: TracerProvider) -> Iterator[None]:
    """Trace `engine`'s commands through `provider` while inside (the engine running)."""
    tracing = Tracing(engine.hub, provider.get_tracer("fastapi_lith"))
    engine.writer.trace, engine.hub.trace = tracing.batch, tracing
    try:
        yield
    finally:
        engine.writer.trace = engine.hub.trace = None


@dataclass(eq=False)
class _Commit:
    """A committed batch waiting for its first frame out: the spans its `lith.frame`s are
    children of, and the view instances it made dirty that have not rendered since."""

    committed: int
    topics: frozenset[str]
    parents: list[context.Context]
    views: set[str]
    shown: bool = False  # some new frame shows it: it waits for a stream to take one
    done: bool = False


def _contained(method: F) -> F:
    """A tracer's fault is logged, never raised into the writer or a stream."""

    @functools.wraps(method)
    def call(*args: Any) -> None:
        try:
            method(*args)
        except Exception:  # noqa: BLE001 - tracing must not break what it watches
            log.exception("tracing %s failed", method.__name__)

    return call  # type: ignore[return-value]


class Tracing:
    """The spans of one engine's commands: the writer's tracer and the hub's."""

    def __init__(self, hub: Hub, tracer: Tracer) -> None:
        self._hub = hub
        self._tracer = tracer
        self._waiting: deque[_Commit] = deque()  # in commit order
        self._waiting_commands = 0
        # Per view instance, its newest frame that shows some waiting commit, and those commits.
        self._shown: dict[str, tuple[Frame | None, list[_Commit]]] = {}

    # -- the writer: one batch answered ------------------------------------------------------

    @_contained
    def batch(self, batch: TracedBatch) -> None:
        """Make each traced command's span and its queued and commit children."""
        tracer, outcome = self._tracer, batch.outcome
        answered, failed = (outcome, None) if isinstance(outcome, Batch) else (None, outcome)
        parents: list[context.Context] = []
        size = len(batch.cmds)
        for i, origin in enumerate(batch.origins):
            if origin is None:
                continue
            accepted, caller = origin
            cmd, key = batch.cmds[i], batch.keys[i]
            name = type(cmd).__name__
            span = tracer.start_span(
                f"lith.command {name}", context=caller.run(context.get_current), start_time=accepted,
                attributes={"lith.command": name},
            )
            if not span.is_recording():
                continue  # sampled out: its children would record nothing either
            inside = trace.set_span_in_context(span)
            tracer.start_span("lith.queued", context=inside, start_time=accepted).end(end_time=batch.taken)
            error = failed if answered is None else answered.errors[i]
            outcome_name = _outcome(error, answered is not None)
            facts: dict[str, str | int] = {"lith.batch.size": size, "lith.outcome": outcome_name}
            if key is not None:
                facts["lith.idempotency_key"] = key
            commit = tracer.start_span("lith.commit", context=inside, start_time=batch.taken, attributes=facts)
            if error is not None:
                status = Status(StatusCode.ERROR, str(error) or type(error).__name__)
                if not isinstance(error, Rejected):  # a refusal is an answer, a failure is a fault
                    commit.record_exception(error)
                commit.set_status(status)
                span.set_status(status)
            parents.append(inside)
            commit.end(end_time=batch.committed)
            span.end(end_time=batch.committed)
        if answered is not None and answered.topics and parents:
            # The hub heard of the commit before the tracer: the views it will render are dirty.
            topics = answered.topics
            views = {instance.key for instance in self._hub.dirty if not topics.isdisjoint(instance.topics)}
            if views:  # else no stream watches what it changed: no frame will show it
                self._wait(_Commit(batch.committed, topics, parents, views))

    def _wait(self, commit: _Commit) -> None:
        self._waiting.append(commit)
        self._waiting_commands += len(commit.parents)
        while self._waiting_commands > WAITING:
            self._waiting[0].done = True
            self._forget_done()

    def _forget_done(self) -> None:
        """Drop the finished commits at the head of the queue (behind an unfinished one, they
        count against `WAITING` until it finishes)."""
        waiting = self._waiting
        while waiting and waiting[0].done:
            self._waiting_commands -= len(waiting.popleft().parents)
        if not waiting:
            self._shown.clear()

    # -- the hub: frames made and taken ------------------------------------------------------

    @_contained
    def rendered(self, instance: Instance, started: int, changed: bool) -> None:
        """A render begun after a waiting commit, of a view on its topics: a new frame shows
        it; the same HTML shows nothing of it, and once every view it made dirty rendered so,
        no frame ever will."""
        shown = []
        for commit in self._waiting:
            if commit.committed > started:
                break  # in commit order: the rest landed after this render began
            if commit.done or commit.topics.isdisjoint(instance.topics):
                continue
            commit.views.discard(instance.key)
            if changed:
                commit.shown = True
                shown.append(commit)
            elif not commit.views and not commit.shown:
                commit.done = True
        if shown:
            self._shown[instance.key] = (instance.frame, shown)
        self._forget_done()

    @_contained
    def taken(self, keys: Iterable[str]) -> None:
        """A stream took frames: each commit they show gets its `lith.frame`, once."""
        if not self._shown:
            return
        now = time.time_ns()
        instances = self._hub.instances
        views: dict[_Commit, list[str]] = {}
        for key in keys:
            entry = self._shown.pop(key, None)
            instance = instances.get(key)
            if entry is None or instance is None or instance.frame is not entry[0]:
                continue  # no commit waits on it, or an older frame of the view (a newer one went out)
            for commit in entry[1]:
                if not commit.done:
                    views.setdefault(commit, []).append(key)
        for commit, keys_shown in views.items():
            commit.done = True
            for parent in commit.parents:
                span = self._tracer.start_span(
                    "lith.frame", context=parent, start_time=commit.committed, attributes={"lith.views": keys_shown}
                )
                span.end(end_time=now)
        self._forget_done()


def _outcome(error: BaseException | None, committed: bool) -> str:
    if not committed:
        return "not committed"  # the COMMIT failed: nothing of the batch landed
    if error is None:
        return "applied"
    return "rejected" if isinstance(error, Rejected) else "failed"
