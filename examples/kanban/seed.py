"""Demo boards: a small one for a first start, a 200-card one for the benchmarks.

    python -m examples.kanban.seed kanban.db --cards 200
    python -m examples.kanban.seed postgresql+psycopg://app@db/kanban --cards 200

The content is deterministic, so two seeds of the same size render the same HTML (about
156 KB for 200 cards; `tests/test_kanban.py` checks the figure).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from fastapi_lith import Db
from fastapi_lith.backends.sqlite.db import migrate, open_sqlite

from . import schema as s

MIGRATIONS = Path(__file__).parent / "migrations"
BOARD_TITLE = "Product launch"
LANES = ("Backlog", "In progress", "Review", "Done")

# Hand-written cards first, so a small board reads like a real one.
CARDS = (
    ("Pricing page copy", "Three tiers, yearly toggle, FAQ below the fold."),
    ("Invite teammates by email", "Magic link, expires after 48 hours."),
    ("Dark mode", "Follow the system setting; remember an override per account."),
    ("Fix double charge on retry", "Idempotency key on the payment request."),
    ("Onboarding checklist", "Five steps, dismissible, progress saved."),
    ("Export board as CSV", ""),
    ("Keyboard shortcuts help", "Press ? to open; list every shortcut."),
    ("Slow search on large boards", "Add an index on card title; measure p95."),
    ("Audit log for admins", "Who changed what and when, 90 days."),
    ("Launch blog post", "Draft with screenshots; review by Friday."),
    ("Mobile layout for lanes", "One lane per screen, swipe between them."),
    ("Status page", "Public page with uptime and incidents."),
)
# Generated titles read like tasks: a verb, what it is about, and which part of it.
_VERBS = ("Add", "Fix", "Refactor", "Update", "Remove", "Document", "Test", "Speed up", "Migrate",
          "Rename", "Split", "Validate")  # fmt: skip
_SUBJECTS = (
    "account alert archive audit backup billing cache calendar checkout comment config dashboard "
    "deploy digest docs email export feed filter gateway import invoice label layout login metric "
    "mobile notify onboarding order payment profile query queue release report search session "
    "settings signup sync team theme ticket token upload webhook widget worker"
).split()
_PARTS = ("page", "form", "API", "job", "tests", "emails", "limits", "flow", "logs", "cache")


def demo_cards(count: int) -> list[tuple[str, str]]:
    """`count` (title, description) pairs: the hand-written ones, then generated ones."""
    rng = random.Random(count)
    cards = list(CARDS[:count])
    while len(cards) < count:
        title = f"{rng.choice(_VERBS)} {rng.choice(_SUBJECTS)} {rng.choice(_PARTS)}"
        description = " ".join(rng.choice(_SUBJECTS) for _ in range(rng.randint(5, 9))).capitalize() + "."
        cards.append((title, description))
    return cards


def insert_demo(db: Db, cards: int) -> int:
    """Insert a demo board with four lanes and `cards` cards dealt over them; returns its id.

    Runs inside the caller's transaction: the app's startup command, or `seed` below.
    """
    board_id = db.scalar(s.INSERT_BOARD, {"new_title": BOARD_TITLE})
    lane_ids = [
        db.scalar(s.NEW_LANE, {"on_board": board_id, "new_title": title, "new_position": i})
        for i, title in enumerate(LANES)
    ]
    for i, (title, description) in enumerate(demo_cards(cards)):
        lane_id, position = lane_ids[i % len(lane_ids)], i // len(lane_ids)
        db.execute(
            s.INSERT_CARD,
            {"to_lane": lane_id, "new_title": title, "new_description": description, "new_position": position},
        )
    return int(board_id)


def seed(path: str | Path, cards: int = 200) -> int:
    """Migrate the database at `path` (a SQLite file or a PostgreSQL URL) and add a demo board
    of `cards` cards; returns its id."""
    if isinstance(path, str) and "://" in path:
        return _seed_postgres(path, cards)
    conn = open_sqlite(path)
    try:
        migrate(conn, MIGRATIONS)
        conn.execute("BEGIN IMMEDIATE")
        board_id = insert_demo(Db(conn), cards)
        conn.execute("COMMIT")
        return board_id
    finally:
        conn.close()


def _seed_postgres(url: str, cards: int) -> int:
    """The same board on PostgreSQL: its own migrations folder, migrated under the lock the
    app's processes take, so a seed beside a starting app does not migrate twice."""
    from fastapi_lith.backends.postgres.db import (
        DIALECT,
        MIGRATION_LOCK,
        PgDb,
        find_folder,
        open_postgres,
    )
    from fastapi_lith.backends.postgres.db import migrate as pg_migrate
    from fastapi_lith.engine.statements import StatementCache

    conn = open_postgres(url)
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            pg_migrate(conn, find_folder(MIGRATIONS))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        with conn.transaction():
            return insert_demo(PgDb(conn, StatementCache(dialect=DIALECT)), cards)  # type: ignore[arg-type]
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> None:
    """The command line: `python -m examples.kanban.seed DB --cards 200`."""
    parser = argparse.ArgumentParser(description="Add a demo board to a kanban database.")
    parser.add_argument("db", help="the SQLite file (created if needed) or a postgresql+psycopg:// URL; migrated if needed")
    parser.add_argument("--cards", type=int, default=200, help="how many cards (default 200)")
    args = parser.parse_args(argv)
    board_id = seed(args.db, args.cards)
    print(f"{args.db}: board {board_id} with {args.cards} cards")


if __name__ == "__main__":
    main()
