"""Views: the board, its lane picker and who is here (each tab's outcome view is the library's).

The page's first paint and its stream render the same functions. A card's HTML is a cached
fragment keyed by its row and its place, so a board of 200 cards re-renders only the cards
that changed.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections import defaultdict

import htpy as h
from markupsafe import Markup

from fastapi_lith import Db, fragment, send

from . import schema as s
from .commands import PRESENCE_TTL
from .live import lith

Attrs = dict[str, str]


# -- the board ---------------------------------------------------------------------------------

# The board's behaviour, attached once to its root (see board.js): a card's HTML holds data only.
# A list whose rows each send one command needs no script: `delegate(url, "data-card-id")`.
_MOVE = send("/cards/move", card_id="a.card", lane_id="a.lane", position="a.position")
_DELETE = send("/cards/delete", card_id="a.card")
_DROP = send("/cards/move", card_id="$drag", lane_id="d.lane", position="d.position")
BOARD_EVENTS: Attrs = {
    "data-on:click": (
        "const a = kanban.action(evt); if (!a) return; "
        f"if (a.name == 'move') {{ $busy = a.card; {_MOVE} }} "
        f"else if (a.name == 'delete') {{ $busy = a.card; {_DELETE} }} "
        "else if (a.name == 'edit') { $edit = a.card; $edit_title = a.title; "
        "$edit_description = a.description; kanban.focus('edit-title') } "
        "else if (a.name == 'rename') { $rename = a.lane; $rename_title = a.title; kanban.focus('rename-title') }"
    ),
    "data-on:dragstart": "$drag = kanban.dragged(evt)",
    "data-on:dragend": "$drag = 0; kanban.clear()",
    "data-on:dragover": "$drag && kanban.over(evt)",
    "data-on:dragleave": "kanban.leave(evt)",
    "data-on:drop": f"const d = $drag && kanban.drop(evt); if (d) {{ $busy = $drag; {_DROP} }}",
}


@lith.view("board/{board_id}", topics={"board:{board_id}"})
def board_view(db: Db, board_id: int) -> h.Element:
    """Every lane of the board, left to right, with its cards top to bottom."""
    lanes = db.all(s.LANES, {"board_id": board_id})
    cards = cards_by_lane(db.all(s.BOARD_CARDS, {"board_id": board_id}))
    ids = [lane["id"] for lane in lanes]
    neighbours = zip([None, *ids[:-1]], [*ids[1:], None])
    return h.div("#board.lanes", BOARD_EVENTS)[
        (lane_column(lane, cards[lane["id"]], left, right) for lane, (left, right) in zip(lanes, neighbours)),
        not lanes and h.p(".empty-board")["This board has no lanes yet. Add one from the sidebar."],
    ]


def cards_by_lane(rows: list[sqlite3.Row]) -> defaultdict[int, list[sqlite3.Row]]:
    """Cards grouped by lane, in board order (the query already sorts them)."""
    grouped: defaultdict[int, list[sqlite3.Row]] = defaultdict(list)
    for row in rows:
        grouped[row["lane_id"]].append(row)
    return grouped


def lane_column(lane: sqlite3.Row, cards: list[sqlite3.Row], left: int | None, right: int | None) -> h.Element:
    """One lane: its header, and the list of its cards that also takes dropped ones."""
    lane_id = lane["id"]
    return h.section(f"#lane-{lane_id}.lane", aria_labelledby=f"lane-{lane_id}-title")[
        h.header(".lane-head")[
            h.h2(".lane-title", id=f"lane-{lane_id}-title")[lane["title"]],
            h.span(".count", id=f"lane-{lane_id}-count", title=f"{len(cards)} cards")[str(len(cards))],
            h.button(".icon.ghost", name="rename", aria_label=f"Edit lane {lane['title']}")["✎"],
        ],
        # One child, not fifty: htpy checks each child it is given (docs/views.md, Fragments).
        h.ol(".cards")[Markup("").join(card_item(card, left, right) for card in cards)],
    ]


# -- cards -------------------------------------------------------------------------------------


@fragment()
def card_item(row: sqlite3.Row, left: int | None, right: int | None) -> h.Element:
    """One card, cached by its row and its neighbour lanes: an unchanged card is never rendered
    twice, wherever it moves. Its place in the lane is read from the page when a button is
    pressed, so cards below a moved one keep their cached HTML. A card moved to another lane
    renders only its own element: its text and its buttons are fragments of their own, keyed
    by what they show."""
    card_id = row["id"]
    return h.li(
        f"#card-{card_id}.card",
        {"data-class:pending": f"$busy == {card_id} && $op != $done"},
        draggable="true",
    )[card_text(row["title"], row["description"]), card_actions(row["lane_id"], left, right)]


@fragment()
def card_text(title: str, description: str) -> h.Fragment:
    """A card's title and description: the same wherever the card is."""
    return h.fragment[h.h3(".card-title")[title], description and h.p(".card-desc")[description]]


@fragment()
def card_actions(lane_id: int, left: int | None, right: int | None) -> h.Element:
    """A card's buttons, the same for every card of a lane: moves name lanes, not cards."""
    return h.div(".card-actions")[
        move_button("left", "←", left, "same"),
        move_button("up", "↑", lane_id, "up"),
        move_button("down", "↓", lane_id, "down"),
        move_button("right", "→", right, "same"),
        h.button(".icon.edit", name="edit", aria_label="Edit")["✎"],
        h.button(".icon.remove", name="delete", aria_label="Delete")["✕"],
    ]


def move_button(direction: str, symbol: str, lane_id: int | None, where: str) -> h.Element:
    """A keyboard path for a move: to lane `lane_id`, one place up or down or the same place.

    Up on the first card and down on the last are dimmed by CSS and do nothing on the server."""
    if lane_id is None:
        return h.button(".icon", aria_label=f"Move {direction}", disabled=True)[symbol]
    return h.button(
        ".icon", name="move", value=f"{lane_id},{where}", data_dir=direction, aria_label=f"Move {direction}"
    )[symbol]


# -- the lane picker of the new-card form ------------------------------------------------------


@lith.view("board/{board_id}/lanes", topics={"board:{board_id}"})
def lane_picker(db: Db, board_id: int) -> h.Element:
    """The lanes a new card can go to; live, so a lane added or renamed anywhere shows here.

    Not bound to a signal: the form sends what the select shows. Options keep their ids, so a
    morph removes a deleted lane without moving the selection off the one that was picked.
    """
    lanes = db.all(s.LANES, {"board_id": board_id})
    return h.select("#new-card-lane")[
        (h.option(id=f"lane-option-{lane['id']}", value=str(lane["id"]))[lane["title"]] for lane in lanes)
    ]


# -- presence ----------------------------------------------------------------------------------


@lith.view("board/{board_id}/presence", topics={"presence:{board_id}"})
def presence_view(db: Db, board_id: int) -> h.Element:
    """Who has this board open: everyone heard from in the last `PRESENCE_TTL` seconds."""
    viewers = db.all(s.VIEWERS, {"board_id": board_id, "since": time.time() - PRESENCE_TTL})
    label = f"{len(viewers)} viewing" if viewers else "Nobody else here"
    return h.div("#presence.presence", aria_label=label)[
        h.ul(".avatars")[(avatar(row["name"]) for row in viewers)],
        h.span(".presence-count")[label],
    ]


AVATAR_COLOURS = ("#3b5bdb", "#0c8599", "#2b8a3e", "#e8590c", "#c2255c", "#7048e8", "#5c940d", "#1971c2")


def avatar(name: str) -> h.Element:
    """A round badge with initials, its colour fixed by the name."""
    initials = "".join(word[0] for word in name.split()[:2]).upper()
    colour = AVATAR_COLOURS[zlib.crc32(name.encode()) % len(AVATAR_COLOURS)]
    return h.li(".avatar", title=name, style=f"background: {colour}")[initials]


async def first_paint(board_id: int, tab: str) -> dict[str, Markup]:
    """Every view of the page, rendered for its first paint; the stream sends the same ones."""
    return {
        "board": await lith.render(f"board/{board_id}"),
        "lanes": await lith.render(f"board/{board_id}/lanes"),
        "presence": await lith.render(f"board/{board_id}/presence"),
        "outcome": await lith.render(f"outcome/{tab}"),
    }
