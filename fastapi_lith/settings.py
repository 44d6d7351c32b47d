"""Checks for settings, run when `Lith` and `Writer` are built: a typo fails at once, loudly."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .exceptions import SettingError


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
