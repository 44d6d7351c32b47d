"""Every change to a board is a command: validated by Pydantic, applied by the one writer.

Commands a person makes carry the page's `tab` and `op` signals. Each touches its board's topic
(every tab's board re-renders) and its tab's topic (that tab's outcome view says what happened
and which `op` landed, so the button that sent it stops pending).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Annotated

from pydantic import ConfigDict, Field

from fastapi_lith import Command, Db, Tx

from . import schema as s
from .seed import insert_demo

TAB_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
TITLE_MAX = 120

Title = Annotated[str, Field(min_length=1, max_length=TITLE_MAX)]
LaneTitle = Annotated[str, Field(min_length=1, max_length=60)]
Description = Annotated[str, Field(max_length=2000)]
Position = Annotated[int, Field(ge=0, le=100_000)]
RowId = Annotated[int, Field(ge=1)]

PRESENCE_TTL = 15.0  # seconds one heartbeat keeps a viewer listed (the page beats every 10 s)
LEAVE_GRACE = 3.0  # a viewer who left stays listed this long, so a reload never flickers
OUTCOME_TTL = 7 * 24 * 3600.0  # outcomes of long-gone tabs are forgotten at startup


class CommandError(ValueError):
    """The board changed under the tab, so this command cannot apply.

    Raised inside `apply`, it rolls back that command alone (the writer's savepoint); the route
    then tells the tab why, see `app.run`.
    """


class TabCommand(Command):
    """A command a person makes from a page: `tab` says who, `op` which of their requests."""

    model_config = ConfigDict(str_strip_whitespace=True)

    tab: str = Field(pattern=TAB_PATTERN)
    op: int = Field(0, ge=0)

    def landed(self, tx: Tx, board_id: int, message: str) -> None:
        """Record the tab's outcome and re-render the board for every tab watching it."""
        record(tx, self.tab, self.op, message, ok=True)
        tx.touch(f"board:{board_id}", f"tab:{self.tab}")


def record(tx: Tx, tab: str, op: int, message: str, *, ok: bool) -> None:
    """The tab's latest outcome: one row per tab, replaced by each of its commands."""
    tx.execute(s.RECORD_OUTCOME, {"tab": tab, "op": op, "message": message, "ok": ok, "at": time.time()})


def find_lane(db: Db, lane_id: int) -> sqlite3.Row:
    """The lane, or the error a person sees when someone else deleted it a moment ago."""
    row = db.first(s.LANE, {"lane_id": lane_id})
    if row is None:
        raise CommandError("That lane was deleted a moment ago by someone else, so nothing changed.")
    return row


def find_card(db: Db, card_id: int) -> sqlite3.Row:
    """The card with its board, or the error for a card someone else deleted a moment ago."""
    row = db.first(s.CARD, {"card_id": card_id})
    if row is None:
        raise CommandError("That card was deleted a moment ago by someone else, so nothing changed.")
    return row


# -- cards -------------------------------------------------------------------------------------


class AddCard(TabCommand):
    """Add a card at the bottom of a lane."""

    lane_id: RowId
    title: Title
    description: Description = ""

    def apply(self, tx: Tx) -> None:
        lane = find_lane(tx, self.lane_id)
        position = tx.scalar(s.NEXT_CARD_POSITION, {"lane_id": self.lane_id})
        tx.execute(
            s.INSERT_CARD,
            {
                "to_lane": self.lane_id,
                "new_title": self.title,
                "new_description": self.description,
                "new_position": position,
            },
        )
        self.landed(tx, lane["board_id"], f"Added “{self.title}” to {lane['title']}.")


class EditCard(TabCommand):
    """Change a card's title and description."""

    card_id: RowId
    title: Title
    description: Description = ""

    def apply(self, tx: Tx) -> None:
        card = find_card(tx, self.card_id)
        tx.execute(
            s.EDIT_CARD,
            {"card_id": self.card_id, "new_title": self.title, "new_description": self.description},
        )
        self.landed(tx, card["board_id"], f"Saved “{self.title}”.")


class MoveCard(TabCommand):
    """Put a card at `position` (0 is the top) in a lane of its board, its own lane or another."""

    card_id: RowId
    lane_id: RowId
    position: Position

    def apply(self, tx: Tx) -> None:
        card = find_card(tx, self.card_id)
        lane = find_lane(tx, self.lane_id)
        if lane["board_id"] != card["board_id"]:
            raise CommandError("That lane is on another board.")
        # The card takes the place of the one now at `position` (the lane's end if none), which
        # moves down with every card below it: one UPDATE, not one per card of the lane.
        where = {"lane_id": self.lane_id, "card_id": self.card_id}
        slot = tx.scalar(s.CARD_POSITION_AT, {**where, "index": self.position})
        if slot is None:
            slot = tx.scalar(s.END_OF_LANE, where)
        else:
            tx.execute(s.MAKE_ROOM, {"in_lane": self.lane_id, "moving": self.card_id, "slot": slot})
        tx.execute(s.PLACE_CARD, {"card_id": self.card_id, "to_lane": self.lane_id, "new_position": slot})
        self.landed(tx, card["board_id"], f"Moved “{card['title']}” to {lane['title']}.")


class DeleteCard(TabCommand):
    """Delete a card."""

    card_id: RowId

    def apply(self, tx: Tx) -> None:
        card = find_card(tx, self.card_id)
        tx.execute(s.DELETE_CARD, {"card_id": self.card_id})
        self.landed(tx, card["board_id"], f"Deleted “{card['title']}”.")


# -- lanes -------------------------------------------------------------------------------------


class AddLane(TabCommand):
    """Add a lane at the right end of a board."""

    board_id: RowId
    title: LaneTitle

    def apply(self, tx: Tx) -> None:
        if tx.scalar(s.BOARD_TITLE, {"board_id": self.board_id}) is None:
            raise CommandError("That board no longer exists.")
        position = tx.scalar(s.NEXT_LANE_POSITION, {"board_id": self.board_id})
        tx.execute(
            s.INSERT_LANE, {"on_board": self.board_id, "new_title": self.title, "new_position": position}
        )
        self.landed(tx, self.board_id, f"Added the lane {self.title}.")


class RenameLane(TabCommand):
    """Rename a lane."""

    lane_id: RowId
    title: LaneTitle

    def apply(self, tx: Tx) -> None:
        lane = find_lane(tx, self.lane_id)
        tx.execute(s.RENAME_LANE, {"lane_id": self.lane_id, "new_title": self.title})
        self.landed(tx, lane["board_id"], f"Renamed {lane['title']} to {self.title}.")


class DeleteLane(TabCommand):
    """Delete a lane and the cards in it."""

    lane_id: RowId

    def apply(self, tx: Tx) -> None:
        lane = find_lane(tx, self.lane_id)
        cards = len(tx.all(s.LANE_CARD_IDS, {"lane_id": self.lane_id}))
        tx.execute(s.DELETE_LANE, {"lane_id": self.lane_id})
        plural = "card" if cards == 1 else "cards"
        self.landed(tx, lane["board_id"], f"Deleted the lane {lane['title']} and its {cards} {plural}.")


class Rejected(TabCommand):
    """Tell a tab why its command could not apply: the failed command wrote nothing, not even
    its outcome (its savepoint rolled back), so this records the reason on its own."""

    message: str = Field(max_length=500)

    def apply(self, tx: Tx) -> None:
        record(tx, self.tab, self.op, self.message, ok=False)
        tx.touch(f"tab:{self.tab}")


# -- presence ----------------------------------------------------------------------------------


class Heartbeat(Command):
    """A page saying "still here" every few seconds; it also drops viewers who went quiet."""

    model_config = ConfigDict(str_strip_whitespace=True)

    board_id: RowId
    viewer: str = Field(pattern=TAB_PATTERN)
    name: str = Field(min_length=1, max_length=40)

    def apply(self, tx: Tx) -> None:
        if tx.scalar(s.BOARD_TITLE, {"board_id": self.board_id}) is None:
            raise CommandError("That board no longer exists.")
        now = time.time()
        params = {"board_id": self.board_id, "viewer": self.viewer, "name": self.name, "seen_at": now}
        tx.execute(s.SEEN, params)
        tx.execute(s.EXPIRE, {"board_id": self.board_id, "before": now - PRESENCE_TTL})
        # Every heartbeat re-renders the list, which is how a viewer who vanished without a
        # goodbye drops off; an unchanged list is not sent again.
        tx.touch(f"presence:{self.board_id}")


class Leave(Command):
    """A page going away: list the viewer a few seconds more, in case it is a reload."""

    board_id: RowId
    viewer: str = Field(pattern=TAB_PATTERN)

    def apply(self, tx: Tx) -> None:
        expire_at = time.time() - PRESENCE_TTL + LEAVE_GRACE
        tx.execute(s.LEAVING, {"on_board": self.board_id, "for_viewer": self.viewer, "expire_at": expire_at})


class Sweep(Command):
    """Drop viewers whose time is up and re-render the list (sent when a grace period ends)."""

    board_id: RowId

    def apply(self, tx: Tx) -> None:
        tx.execute(s.EXPIRE, {"board_id": self.board_id, "before": time.time() - PRESENCE_TTL})
        tx.touch(f"presence:{self.board_id}")


# -- startup -----------------------------------------------------------------------------------


class Startup(Command):
    """Seed a small demo board into an empty database, and forget stale presence and outcomes."""

    demo_cards: int = Field(12, ge=0)

    def apply(self, tx: Tx) -> None:
        now = time.time()
        tx.execute(s.EXPIRE_ALL, {"before": now - PRESENCE_TTL})
        tx.execute(s.FORGET_OUTCOMES, {"before": now - OUTCOME_TTL})
        if tx.scalar(s.FIRST_BOARD) is None:
            insert_demo(tx, self.demo_cards)
