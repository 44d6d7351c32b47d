"""Every change to a board is a command: validated by Pydantic, applied by the one writer.

Commands a person makes are `TabCommand`s: they carry the page's `tab` and `op` signals, and the
library's outcome view tells that tab what happened (`self.say`) or why nothing did (`Rejected`).
Each touches its board's topic, so every tab's board re-renders.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Annotated

from pydantic import ConfigDict, Field

from fastapi_lith import Command, Db, Rejected, TabCommand, TabId, Tx

from . import schema as s
from .seed import insert_demo

TITLE_MAX = 120

Title = Annotated[str, Field(min_length=1, max_length=TITLE_MAX)]
LaneTitle = Annotated[str, Field(min_length=1, max_length=60)]
Description = Annotated[str, Field(max_length=2000)]
Position = Annotated[int, Field(ge=0, le=100_000)]
RowId = Annotated[int, Field(ge=1)]

PRESENCE_TTL = 15.0  # seconds one heartbeat keeps a viewer listed (the page beats every 10 s)
LEAVE_GRACE = 3.0  # a viewer who left stays listed this long, so a reload never flickers


class BoardCommand(TabCommand):
    """A change a person makes to a board from a page."""

    def landed(self, tx: Tx, board_id: int, message: str) -> None:
        """Re-render the board for every tab watching it, and tell this tab what happened."""
        tx.touch(f"board:{board_id}")
        self.say(message)


def find_lane(db: Db, lane_id: int) -> sqlite3.Row:
    """The lane, or the error a person sees when someone else deleted it a moment ago."""
    row = db.first(s.LANE, {"lane_id": lane_id})
    if row is None:
        raise Rejected("That lane was deleted a moment ago by someone else, so nothing changed.")
    return row


def find_card(db: Db, card_id: int) -> sqlite3.Row:
    """The card with its board, or the error for a card someone else deleted a moment ago."""
    row = db.first(s.CARD, {"card_id": card_id})
    if row is None:
        raise Rejected("That card was deleted a moment ago by someone else, so nothing changed.")
    return row


# -- cards -------------------------------------------------------------------------------------


class AddCard(BoardCommand):
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


class EditCard(BoardCommand):
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


class MoveCard(BoardCommand):
    """Put a card at `position` (0 is the top) in a lane of its board, its own lane or another."""

    card_id: RowId
    lane_id: RowId
    position: Position

    def apply(self, tx: Tx) -> None:
        card = find_card(tx, self.card_id)
        lane = find_lane(tx, self.lane_id)
        if lane["board_id"] != card["board_id"]:
            raise Rejected("That lane is on another board.")
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


class DeleteCard(BoardCommand):
    """Delete a card."""

    card_id: RowId

    def apply(self, tx: Tx) -> None:
        card = find_card(tx, self.card_id)
        tx.execute(s.DELETE_CARD, {"card_id": self.card_id})
        self.landed(tx, card["board_id"], f"Deleted “{card['title']}”.")


# -- lanes -------------------------------------------------------------------------------------


class AddLane(BoardCommand):
    """Add a lane at the right end of a board."""

    board_id: RowId
    title: LaneTitle

    def apply(self, tx: Tx) -> None:
        if tx.scalar(s.BOARD_TITLE, {"board_id": self.board_id}) is None:
            raise Rejected("That board no longer exists.")
        position = tx.scalar(s.NEXT_LANE_POSITION, {"board_id": self.board_id})
        tx.execute(
            s.INSERT_LANE, {"on_board": self.board_id, "new_title": self.title, "new_position": position}
        )
        self.landed(tx, self.board_id, f"Added the lane {self.title}.")


class RenameLane(BoardCommand):
    """Rename a lane."""

    lane_id: RowId
    title: LaneTitle

    def apply(self, tx: Tx) -> None:
        lane = find_lane(tx, self.lane_id)
        tx.execute(s.RENAME_LANE, {"lane_id": self.lane_id, "new_title": self.title})
        self.landed(tx, lane["board_id"], f"Renamed {lane['title']} to {self.title}.")


class DeleteLane(BoardCommand):
    """Delete a lane and the cards in it."""

    lane_id: RowId

    def apply(self, tx: Tx) -> None:
        lane = find_lane(tx, self.lane_id)
        cards = len(tx.all(s.LANE_CARD_IDS, {"lane_id": self.lane_id}))
        tx.execute(s.DELETE_LANE, {"lane_id": self.lane_id})
        plural = "card" if cards == 1 else "cards"
        self.landed(tx, lane["board_id"], f"Deleted the lane {lane['title']} and its {cards} {plural}.")


# -- presence ----------------------------------------------------------------------------------


class Heartbeat(Command):
    """A page saying "still here" every few seconds; it also drops viewers who went quiet."""

    model_config = ConfigDict(str_strip_whitespace=True)

    board_id: RowId
    viewer: TabId
    name: str = Field(min_length=1, max_length=40)

    def apply(self, tx: Tx) -> None:
        if tx.scalar(s.BOARD_TITLE, {"board_id": self.board_id}) is None:
            raise Rejected("That board no longer exists.")
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
    viewer: TabId

    def apply(self, tx: Tx) -> None:
        expire_at = time.time() - PRESENCE_TTL + LEAVE_GRACE
        tx.execute(s.LEAVING, {"on_board": self.board_id, "for_viewer": self.viewer, "expire_at": expire_at})


# -- startup -----------------------------------------------------------------------------------


class Startup(Command):
    """Seed a small demo board into an empty database, and forget stale presence."""

    demo_cards: int = Field(12, ge=0)

    def apply(self, tx: Tx) -> None:
        tx.execute(s.EXPIRE_ALL, {"before": time.time() - PRESENCE_TTL})
        if tx.scalar(s.FIRST_BOARD) is None:
            insert_demo(tx, self.demo_cards)
