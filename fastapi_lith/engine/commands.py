"""Commands: `Command`, the per-tab `TabCommand` and `Rejected` (the page's side: web/page.py).

A page names itself with a `tab` id and numbers its clicks with an `op` signal. A `TabCommand`
carries both; once it lands, the tab's outcome view (built in, `"outcome/{tab}"`) shows what
happened and sets the page's `done` signal to that `op`, so the button that sent it stops
pending. `raise Rejected("...")` in `apply` rolls the command back and tells the tab why.
A field marked `FromServer()` is the server's to fill (who sent it), never the client's.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from pydantic_core import PydanticCustomError

from ..exceptions import CommandError, Rejected
from . import db, outcomes
from .tx import Tx

# Tab ids come from the page; they name per-tab views and travel in URLs and commands.
TAB_PATTERN = r"[A-Za-z0-9_-]{1,64}"
TAB_ID = re.compile(TAB_PATTERN)
TabId = Annotated[str, Field(pattern=f"^{TAB_PATTERN}$")]

log = logging.getLogger("fastapi_lith")

# What a tab is told when its command failed for a reason `apply` did not give (a bug).
FAILED = "Something went wrong, so nothing changed. Try again, or reload the page."


class FromServer:
    """A command field the server fills, never the client: `owner: Annotated[str, FromServer()]`.

    `dependency` is the FastAPI dependency whose answer fills it; None means the request's
    principal (`lith.principal`). Only a marker here: the web layer resolves it (web/body.py),
    leaves the field out of what a client may send, and refuses a body that sends it anyway.
    """

    __slots__ = ("dependency",)

    def __init__(self, dependency: Callable[..., Any] | None = None) -> None:
        if dependency is not None and not callable(dependency):
            raise CommandError(f"FromServer takes a FastAPI dependency (a function) or None, not {dependency!r}")
        self.dependency = dependency

    def __repr__(self) -> str:
        name = getattr(self.dependency, "__name__", self.dependency)
        return "FromServer()" if self.dependency is None else f"FromServer({name})"


class Command(BaseModel):
    """A change to the database: validated by Pydantic, applied by the writer.

    `apply` is synchronous on purpose: it runs on the writer's thread inside a savepoint and
    does database work only, nothing that waits on the network. Its return value reaches the
    caller of `writer.do`; an exception it raises rolls back this command alone.
    """

    @field_validator("*")
    @classmethod
    def _fits_sqlite(cls, value: Any) -> Any:
        # Every field of every command: an int SQLite cannot store is a validation error (a 422
        # naming the field), not an OverflowError from deep inside `apply`.
        if db.oversized_int(value) is not None:
            raise PydanticCustomError(
                "sqlite_int", "Input should be an integer from -2**63 to 2**63 - 1 (SQLite's range)"
            )
        return value

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The writer calls `apply` on its thread and never awaits it: an `async def apply`
        # would answer 204 and write nothing, so it is refused where it is written.
        super().__init_subclass__(**kwargs)
        apply = cls.__dict__.get("apply")
        if inspect.iscoroutinefunction(apply) or inspect.isasyncgenfunction(apply):
            raise CommandError(
                f"{cls.__qualname__}.apply is async def, but the writer runs it on its thread inside a "
                "transaction and cannot await it: write a plain def apply(self, tx), and do awaited "
                "work in the route before writer.do"
            )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Pydantic calls this once the fields are built: a misplaced `FromServer` is refused
        # where the command is written, not at its first request.
        super().__pydantic_init_subclass__(**kwargs)
        server_fields(cls)

    def apply(self, tx: Tx) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.apply(tx)")

    def idempotency_key(self) -> str | None:
        """The key a repeat of this command is known by, or None: then every send applies.

        A command with a `tab` (str) and a positive `op` (int) field, as a page's actions carry,
        is keyed by its class, tab and op: a retried POST of the same action finds its first
        outcome instead of applying again. Its `FromServer` fields (who sent it) are part of the
        key: another principal naming the same tab and op neither reads the first outcome nor
        stops the command applying. Override to key a command by something else.
        """
        fields = self.__dict__
        op = fields.get("op")
        if type(op) is int and op > 0:
            tab = fields.get("tab")
            if type(tab) is str:
                key = f"{type(self).__name__}:{tab}:{op}"
                server = server_fields(type(self))
                return key + "".join(f":{fields[name]!r}" for name in server) if server else key
        return None

    def _settled(self, tx: Tx, error: BaseException | None) -> None:
        """Called by the writer after `apply`, in the same transaction: inside the savepoint on
        success, after its rollback on an error. Nothing to do for a plain command."""


@cache
def server_fields(command: type[Command]) -> dict[str, FromServer]:
    """The fields of `command` the server fills, by name, each with its `FromServer`.

    A tab command's `tab` and `op` are the page's: they say which tab to tell, even of a refusal.
    A server field's validation alias must be a plain name, the one key the server fills it by.
    """
    found: dict[str, FromServer] = {}
    for name, field in command.model_fields.items():
        markers = [m for m in field.metadata if isinstance(m, FromServer)]
        if not markers:
            continue
        if len(markers) > 1:
            raise CommandError(f"{command.__qualname__}.{name} has {len(markers)} FromServer markers: give it one")
        if issubclass(command, TabCommand) and name in ("tab", "op"):
            raise CommandError(f"{command.__qualname__}.{name} is the page's own field, so it cannot be FromServer")
        if field.validation_alias is not None and not isinstance(field.validation_alias, str):
            raise CommandError(f"{command.__qualname__}.{name} is FromServer: its validation alias must be a str")
        found[name] = markers[0]
    return found


def run_apply(cmd: Command, tx: Tx) -> Any:
    """`cmd.apply(tx)`, as both writers call it: a result the caller could only await is an
    error, so the command rolls back instead of committing what it did before a forgotten
    `await`. A function, not a method: a second attribute lookup on a model costs more."""
    result = cmd.apply(tx)
    if result is not None and hasattr(result, "__await__"):
        what = "a coroutine" if inspect.iscoroutine(result) else "an awaitable"
        if inspect.iscoroutine(result):
            result.close()  # it never runs: no "was never awaited" warning as the only trace
        raise CommandError(
            f"{type(cmd).__name__}.apply returned {what}, which the writer cannot await: "
            "apply must do its work itself, synchronously"
        )
    return result


def settle(cmd: Command, tx: Tx, error: BaseException | None) -> None:
    """`cmd._settled(tx, error)`, as both writers call it once `apply` is done."""
    cmd._settled(tx, error)  # noqa: SLF001 - the writer's hook, kept out of a model's public names


class TabCommand(Command):
    """A command a person makes from a page: `tab` says who, `op` which of their clicks.

    Declare only the command's own fields. In `apply`, `self.say("...")` sets the message the
    tab's outcome view shows once the command commits. Each op starts a fresh outcome: the view
    shows the newest op's message (none if it did not `say()`) or its error. An `op` of 0, the
    page's value before its first `send()`, is no click: the command applies, unkeyed, and the
    tab's outcome is left as it was (`lith.command` answers its `Rejected` with 409 instead).
    """

    model_config = ConfigDict(str_strip_whitespace=True)

    tab: TabId
    op: int = Field(0, ge=0)
    _message: str | None = PrivateAttr(None)

    def say(self, message: str) -> None:
        """What the tab's outcome view shows once this command commits."""
        self._message = message

    def _settled(self, tx: Tx, error: BaseException | None) -> None:
        if self.op == 0:  # no click to answer: `done` cannot move back to 0, so nothing is recorded
            if error is None and self._message is not None:
                log.warning("%s said %r with op 0, so no tab is told: a page's send() numbers its "
                            "clicks from 1", type(self).__name__, self._message)
            return
        if error is None:
            ok, message = True, self._message
        else:
            ok, message = False, str(error) if isinstance(error, Rejected) else FAILED
        row = {"tab": self.tab, "op": self.op, "ok": int(ok), "message": message, "at": time.time()}
        tx.execute(outcomes.RECORD_TAB, row)
        tx.touch(f"tab:{self.tab}")


class _Touch(Command):
    """Mark topics changed and nothing else: `Lith.touch_later`, through the writer so that every
    process's hub hears of it."""

    topics: list[str]

    def apply(self, tx: Tx) -> None:
        tx.touch(*self.topics)
