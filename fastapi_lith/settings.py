"""Checks for settings, run when `Lith` and `Writer` are built: a typo fails at once, loudly."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from .exceptions import SettingError

P = ParamSpec("P")
R = TypeVar("R")


def choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """`value` if it is one of `allowed` (any case), in the case `allowed` spells it."""
    options = tuple(allowed)
    if isinstance(value, str):
        for option in options:
            if value.upper() == option.upper():
                return option
    raise SettingError(f"{name} must be one of {', '.join(map(repr, options))}, not {value!r}")


def number(name: str, value: Any, *, low: float, high: float | None = None, integer: bool = False) -> Any:
    """`value` if it is a number (an int when `integer`) from `low` to `high`."""
    kinds = (int,) if integer else (int, float)
    what = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise SettingError(f"{name} must be {what}, not {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise SettingError(f"{name} must be {what} {bounds}, not {value!r}")
    return value


def flag(name: str, value: Any) -> bool:
    """`value` if it is True or False (not a truthy string: `"false"` would read as on)."""
    if not isinstance(value, bool):
        raise SettingError(f"{name} must be True or False, not {value!r}")
    return value


def topics(name: str, value: Any) -> frozenset[str]:
    """`value` as a set of topics: a collection of strings, never one string.

    A string is a collection of its letters: `topics="items"` would watch `"i"`, `"t"`, ...
    and the view would never render again, so it is refused.
    """
    if isinstance(value, str):
        raise SettingError(f"{name} must be a collection of topics, such as {{{value!r}}}, not the string {value!r}")
    try:
        found = frozenset(value)
    except TypeError:
        raise SettingError(f"{name} must be a collection of topics (strings), not {value!r}") from None
    topic_names(name, found)
    return found


def topic_names(name: str, values: Iterable[Any]) -> None:
    """Refuse a topic that is not a string: a list passed where `*topics` are expected."""
    for value in values:
        if not isinstance(value, str):
            raise SettingError(f"{name}: a topic is a string, not {value!r} (unpack a collection: *topics)")


def checked(*, forward: Callable[..., Any] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a constructor so that a keyword it does not take is a `SettingError` naming the
    setting that was probably meant, instead of Python's bare `TypeError`.

    The signature stays explicit (IDEs and type checkers read it). `forward` is the constructor
    that a `**settings` parameter passes its keywords on to: its names are settings too.
    """

    def decorator(init: Callable[P, R]) -> Callable[P, R]:
        valid = _keywords(init) | (_keywords(forward) if forward is not None else set())
        owner = init.__qualname__.split(".")[0]

        @functools.wraps(init)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            for key in kwargs:
                if key not in valid:
                    raise SettingError(_unknown(owner, key, valid))
            return init(*args, **kwargs)

        return wrapper

    return decorator


def _unknown(owner: str, key: str, valid: Iterable[str]) -> str:
    """The message for a setting `owner` does not have: the closest valid name, if one is close."""
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"its settings are {', '.join(sorted(valid))}"
    return f"{owner}() has no setting {key!r}: {hint}"


def _keywords(fn: Callable[..., Any]) -> set[str]:
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n for n, p in inspect.signature(fn).parameters.items() if p.kind in keyword and n != "self"}
