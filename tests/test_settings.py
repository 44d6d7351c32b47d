"""The checks of `fastapi_lith.settings`, called directly: bounds and the words of a refusal."""

from __future__ import annotations

import pytest

from fastapi_lith import SettingError
from fastapi_lith.settings import number, topics


def test_a_number_may_be_either_bound() -> None:
    assert number("zstd_window_log", 10, low=10, high=23, integer=True) == 10
    assert number("zstd_window_log", 23, low=10, high=23, integer=True) == 23
    with pytest.raises(SettingError, match="from 10 to 23, not 24"):
        number("zstd_window_log", 24, low=10, high=23, integer=True)


def test_a_topic_that_is_not_a_string_is_refused_with_the_setting_named() -> None:
    with pytest.raises(SettingError, match=r"^view 'items': topics: a topic is a string, not \('a',\)"):
        topics("view 'items': topics", (("a",),))
