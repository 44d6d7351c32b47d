"""The kanban example's command and view tests again, on PostgreSQL.

The same test functions as test_kanban.py, collected here with the database fixtures swapped:
`db_path` is a fresh PostgreSQL database's URL, which the app takes as its `KANBAN_DB`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.examples.test_kanban import (  # noqa: F401 - collected here, against PostgreSQL
    APP,
    REPO,
    test_a_command_retried_after_a_lost_answer_applies_once,
    test_add_move_rename_delete_show_in_the_other_page,
    test_bad_titles_show_in_the_acting_page_only,
    test_every_board_is_listed_even_one_seeded_later,
    test_http_surface,
    test_move_to_a_lane_deleted_a_moment_ago,
    two_pages,
)
from tests.support.browser import Server


@pytest.fixture
def db_path(pg_url: str) -> str:
    return pg_url


@pytest.fixture
def server(server_factory: Callable[..., Server], db_path: str) -> Server:
    return server_factory(APP, cwd=REPO, env={"KANBAN_DB": db_path})
