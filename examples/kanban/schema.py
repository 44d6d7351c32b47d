"""Tables and statements, built once at import.

The writer and the readers compile each statement once and keep the prepared statement, so
nothing here is rebuilt per request. Bind parameter names differ from column names on purpose:
SQLAlchemy reserves a column's own name for the VALUES/SET clause of an insert or update.
"""

from __future__ import annotations

import sqlalchemy as sa

board = sa.table("board", sa.column("id"), sa.column("title"))
lane = sa.table("lane", sa.column("id"), sa.column("board_id"), sa.column("title"), sa.column("position"))
card = sa.table(
    "card",
    sa.column("id"),
    sa.column("lane_id"),
    sa.column("title"),
    sa.column("description"),
    sa.column("position"),
)
presence = sa.table(
    "presence", sa.column("board_id"), sa.column("viewer"), sa.column("name"), sa.column("seen_at")
)

# -- boards ------------------------------------------------------------------------------------

FIRST_BOARD = sa.select(sa.func.min(board.c.id))
BOARD_TITLE = sa.select(board.c.title).where(board.c.id == sa.bindparam("board_id"))
BOARDS = (
    sa.select(board.c.id, board.c.title, sa.func.count(card.c.id).label("cards"))
    .select_from(board.outerjoin(lane, lane.c.board_id == board.c.id).outerjoin(card, card.c.lane_id == lane.c.id))
    .group_by(board.c.id)
    .order_by(board.c.id)
)
# RETURNING, not the cursor's lastrowid: PostgreSQL has no lastrowid.
INSERT_BOARD = board.insert().values(title=sa.bindparam("new_title")).returning(board.c.id)

# -- lanes -------------------------------------------------------------------------------------

LANES = (
    sa.select(lane.c.id, lane.c.title)
    .where(lane.c.board_id == sa.bindparam("board_id"))
    .order_by(lane.c.position, lane.c.id)
)
LANE = sa.select(lane.c.id, lane.c.board_id, lane.c.title).where(lane.c.id == sa.bindparam("lane_id"))
NEXT_LANE_POSITION = sa.select(sa.func.coalesce(sa.func.max(lane.c.position), -1) + 1).where(
    lane.c.board_id == sa.bindparam("board_id")
)
INSERT_LANE = lane.insert().values(
    board_id=sa.bindparam("on_board"), title=sa.bindparam("new_title"), position=sa.bindparam("new_position")
)
NEW_LANE = INSERT_LANE.returning(lane.c.id)
RENAME_LANE = lane.update().where(lane.c.id == sa.bindparam("lane_id")).values(title=sa.bindparam("new_title"))
DELETE_LANE = lane.delete().where(lane.c.id == sa.bindparam("lane_id"))  # its cards cascade

# -- cards -------------------------------------------------------------------------------------

# Everything a card's HTML depends on, and nothing else (not its stored position, which a move
# changes): the row is the key of the card's cached fragment.
BOARD_CARDS = (
    sa.select(card.c.id, card.c.lane_id, card.c.title, card.c.description)
    .select_from(card.join(lane, lane.c.id == card.c.lane_id))
    .where(lane.c.board_id == sa.bindparam("board_id"))
    .order_by(card.c.lane_id, card.c.position, card.c.id)
)
CARD = (
    sa.select(card.c.id, card.c.lane_id, card.c.title, lane.c.board_id)
    .select_from(card.join(lane, lane.c.id == card.c.lane_id))
    .where(card.c.id == sa.bindparam("card_id"))
)
LANE_CARD_IDS = (
    sa.select(card.c.id).where(card.c.lane_id == sa.bindparam("lane_id")).order_by(card.c.position, card.c.id)
)
NEXT_CARD_POSITION = sa.select(sa.func.coalesce(sa.func.max(card.c.position), -1) + 1).where(
    card.c.lane_id == sa.bindparam("lane_id")
)
INSERT_CARD = card.insert().values(
    lane_id=sa.bindparam("to_lane"),
    title=sa.bindparam("new_title"),
    description=sa.bindparam("new_description"),
    position=sa.bindparam("new_position"),
)
EDIT_CARD = (
    card.update()
    .where(card.c.id == sa.bindparam("card_id"))
    .values(title=sa.bindparam("new_title"), description=sa.bindparam("new_description"))
)
PLACE_CARD = (
    card.update()
    .where(card.c.id == sa.bindparam("card_id"))
    .values(lane_id=sa.bindparam("to_lane"), position=sa.bindparam("new_position"))
)
# A move makes room with one UPDATE instead of renumbering the lane: positions stay distinct
# within a lane and keep their order, gaps and all.
CARD_POSITION_AT = (
    sa.select(card.c.position)
    .where(card.c.lane_id == sa.bindparam("lane_id"), card.c.id != sa.bindparam("card_id"))
    .order_by(card.c.position, card.c.id)
    .limit(1)
    .offset(sa.bindparam("index"))
)
END_OF_LANE = sa.select(sa.func.coalesce(sa.func.max(card.c.position), -1) + 1).where(
    card.c.lane_id == sa.bindparam("lane_id"), card.c.id != sa.bindparam("card_id")
)
MAKE_ROOM = (
    card.update()
    .where(
        card.c.lane_id == sa.bindparam("in_lane"),
        card.c.position >= sa.bindparam("slot"),
        card.c.id != sa.bindparam("moving"),
    )
    .values(position=card.c.position + 1)
)
DELETE_CARD = card.delete().where(card.c.id == sa.bindparam("card_id"))

# -- presence ----------------------------------------------------------------------------------

SEEN = sa.text(
    "INSERT INTO presence (board_id, viewer, name, seen_at) VALUES (:board_id, :viewer, :name, :seen_at)"
    " ON CONFLICT (board_id, viewer) DO UPDATE SET name = excluded.name, seen_at = excluded.seen_at"
)
LEAVING = (
    presence.update()
    .where(presence.c.board_id == sa.bindparam("on_board"), presence.c.viewer == sa.bindparam("for_viewer"))
    # The smaller of the two, in words both databases know (SQLite's min(a, b) is PostgreSQL's least).
    .values(seen_at=sa.case((presence.c.seen_at < sa.bindparam("expire_at"), presence.c.seen_at), else_=sa.bindparam("expire_at")))
)
EXPIRE = presence.delete().where(
    presence.c.board_id == sa.bindparam("board_id"), presence.c.seen_at < sa.bindparam("before")
)
EXPIRE_ALL = presence.delete().where(presence.c.seen_at < sa.bindparam("before"))
VIEWERS = (
    sa.select(presence.c.viewer, presence.c.name)
    .where(presence.c.board_id == sa.bindparam("board_id"), presence.c.seen_at >= sa.bindparam("since"))
    .order_by(presence.c.name, presence.c.viewer)  # stable: a heartbeat alone changes no HTML
)
