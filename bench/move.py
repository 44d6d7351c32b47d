"""The kanban example's MoveCard, writer-side CPU per move, for comparing checkouts.

A 200-card board seeded by `examples.kanban.seed`, then 3 x 1,000 random moves (the same
moves every time: fixed seed), each in its own savepoint, 1,000 per transaction, on one
connection in one thread: what the writer thread pays per move, without HTTP or the loop.
Run from a checkout's root with its own interpreter, so that checkout's example is measured:

    .venv/bin/python bench/move.py
    (cd ../old-checkout && .venv/bin/python ../this-checkout/bench/move.py)
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from examples.kanban.commands import MoveCard  # noqa: E402
from examples.kanban.seed import seed  # noqa: E402
from fastapi_lith.backends.sqlite.db import open_sqlite  # noqa: E402
from fastapi_lith.engine.statements import StatementCache  # noqa: E402
from fastapi_lith.engine.tx import Tx  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "move.db"
        board = seed(db, cards=200)
        conn = open_sqlite(db)
        cards = [r[0] for r in conn.execute("SELECT id FROM card")]
        lanes = [r[0] for r in conn.execute("SELECT id FROM lane WHERE board_id = ?", (board,))]
        rng = random.Random(1)
        moves = [
            MoveCard(tab="t", op=i, card_id=rng.choice(cards), lane_id=rng.choice(lanes),
                     position=rng.randrange(0, 60))
            for i in range(3000)
        ]
        tx = Tx(conn, StatementCache())
        runs = []
        for rep in range(3):
            conn.execute("BEGIN IMMEDIATE")
            started = time.process_time()
            for move in moves[rep * 1000 : (rep + 1) * 1000]:
                conn.execute("SAVEPOINT s")
                move.apply(tx)
                conn.execute("RELEASE s")
            runs.append((time.process_time() - started) / 1000 * 1e6)
            conn.execute("COMMIT")
        conn.close()
    print(f"{Path.cwd().name}: MoveCard CPU per move {min(runs):.0f} µs (best of {[round(r) for r in runs]})")


if __name__ == "__main__":
    main()
