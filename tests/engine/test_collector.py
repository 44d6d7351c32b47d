"""The collector's schedule a serving hub sets: full collections spaced, an app's own left."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastapi_lith import Lith
from fastapi_lith.engine.collector import FULL_AFTER


@pytest.fixture
def schedule() -> Iterator[None]:
    """The process's own schedule, back after each test: it is one per interpreter."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()


def lith_at(tmp_path: Path) -> Lith:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_init.sql").write_text("CREATE TABLE t (id INTEGER PRIMARY KEY);")
    return Lith(tmp_path / "app.db", migrations=tmp_path / "migrations")


@pytest.mark.parametrize("young", [700, 2000])  # 3.11 and 3.12, then 3.13
async def test_a_serving_hub_runs_full_collections_a_hundred_times_less_often(tmp_path: Path, schedule: None, young: int) -> None:
    gc.set_threshold(young, 10, 10)
    lith = lith_at(tmp_path)
    async with lith.lifespan():
        assert gc.get_threshold() == (young, 10, FULL_AFTER) == (young, 10, 1000)
    assert gc.get_threshold() == (young, 10, 1000)  # one schedule a process: a later start finds it set


async def test_a_hub_without_ticks_leaves_the_schedule(tmp_path: Path, schedule: None) -> None:
    gc.set_threshold(700, 10, 10)
    async with lith_at(tmp_path).lifespan(ticks=False):  # the virtual tabs' way: nothing served
        assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("threshold", [(5000, 10, 10), (700, 20, 10), (700, 10, 40), (0, 10, 10)])
async def test_an_app_with_its_own_schedule_keeps_it(tmp_path: Path, schedule: None, threshold: tuple[int, int, int]) -> None:
    gc.set_threshold(*threshold)
    async with lith_at(tmp_path).lifespan():
        assert gc.get_threshold() == threshold


async def test_a_collector_turned_off_stays_off_with_its_thresholds(tmp_path: Path, schedule: None) -> None:
    gc.set_threshold(700, 10, 10)
    gc.disable()
    async with lith_at(tmp_path).lifespan():
        assert not gc.isenabled()
        assert gc.get_threshold() == (700, 10, 10)


async def test_only_the_first_start_in_a_process_freezes_and_a_stopped_app_is_collected(tmp_path: Path) -> None:
    """A frozen object is never collected: a process that starts engines as it goes (one per
    account) must not freeze, at each start, the cycles of those it stopped."""
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    async with lith_at(tmp_path / "first").lifespan(ticks=False):
        pass
    frozen = gc.get_freeze_count()
    assert frozen > 0
    second = lith_at(tmp_path / "second")
    async with second.lifespan(ticks=False):
        assert gc.get_freeze_count() == frozen
    stopped = weakref.ref(second)
    del second
    gc.collect()
    assert stopped() is None
