"""The page shell: header, sidebar forms and the board, server-rendered, with no OpenAPI.

Live parts come from views (first paint here, updates over the tab's stream); everything
else is static HTML whose behaviour is Datastar attributes. Each form sends one command
with `send(...)`, shows its button pending until the command's op lands, and clears or
closes itself when that op succeeded (`ok_op`, from the tab's outcome view).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import htpy as h
from markupsafe import Markup

from fastapi_lith import new_tab, pending, send

from .commands import TITLE_MAX
from .live import lith

STYLE = Markup((Path(__file__).parent / "style.css").read_text(encoding="utf-8"))

# The board's event helpers (see views.BOARD_EVENTS), inlined like the style.
SCRIPT = Markup((Path(__file__).parent / "board.js").read_text(encoding="utf-8"))

ADJECTIVES = "Amber Blue Brave Calm Coral Swift Jade Lucky Misty Quiet Red Silver Sunny Teal Wise".split()
ANIMALS = "Badger Crane Dolphin Falcon Fox Hare Heron Lynx Otter Owl Panda Robin Seal Tiger Wolf".split()


@dataclass(frozen=True)
class Visit:
    """One page load: the tab's stream id, and who this browser tab is on the board.

    `viewer` and `name` are only suggestions: the page keeps the ones already in its
    sessionStorage, so a reload stays the same person in everyone's presence list.
    """

    board_id: int
    title: str
    tab: str
    viewer: str
    name: str

    @classmethod
    def new(cls, board_id: int, title: str) -> Visit:
        name = f"{secrets.choice(ADJECTIVES)} {secrets.choice(ANIMALS)}"
        return cls(board_id, title, new_tab(), "v" + secrets.token_urlsafe(9), name)


def signals(visit: Visit) -> dict[str, str]:
    """The page's signals: ids, and one draft per form (`*_op` is the op a form last sent)."""
    initial = {
        "tab": visit.tab, "op": 0, "done": 0, "ok_op": 0, "busy": 0, "drag": 0,
        "new_title": "", "new_description": "", "new_op": -1,
        "lane_title": "", "lane_op": -1,
        "edit": 0, "edit_title": "", "edit_description": "", "edit_op": -1,
        "rename": 0, "rename_title": "", "rename_op": -1,
    }  # fmt: skip
    return {
        "data-signals": json.dumps(initial),
        "data-signals:viewer": f"sessionStorage.kanbanViewer ??= {json.dumps(visit.viewer)}",
        "data-signals:name": f"sessionStorage.kanbanName ??= {json.dumps(visit.name)}",
    }


def page(visit: Visit, views: dict[str, Markup]) -> str:
    """The whole page for one tab."""
    board = f"board/{visit.board_id}"
    keys = (board, f"{board}/lanes", f"{board}/presence", "outcome/{tab}")
    return str(
        h.html(lang="en")[
            h.head[
                h.meta(charset="utf-8"),
                h.meta(name="viewport", content="width=device-width, initial-scale=1"),
                h.title[f"{visit.title} · Boards"],
                h.style[STYLE],
                h.script[SCRIPT],
                h.script(type="module", src=lith.datastar_url, onerror=DATASTAR_FAILED),
            ],
            h.body(
                signals(visit),
                {"data-on:keydown__window": "evt.key == 'Escape' && ($edit = 0, $rename = 0)"},
                data_init=lith.connect(*keys, tab=visit.tab),
            )[
                no_datastar(),
                header(visit, views["presence"]),
                h.div(".layout")[
                    sidebar(visit, views),
                    h.main(".board", aria_label="Lanes")[views["board"]],
                ],
            ],
        ]
    )


# Without Datastar nothing on the page works, though it looks complete: a CDN that is blocked
# or a train without network. The notice says so: at once if the script fails to load, after a
# few seconds if it hangs (style.css), and never once Datastar runs (`data-show` hides it).
DATASTAR_FAILED = "document.documentElement.classList.add('datastar-failed')"


def no_datastar() -> h.Element:
    return h.p("#no-datastar.no-datastar", {"data-show": "false"}, role="alert")[
        h.strong["Offline: changes cannot be made or seen."],
        " This page could not load Datastar, the script it runs on. Reload once you are back online.",
    ]


def header(visit: Visit, presence: Markup) -> h.Element:
    """Board name, a saving indicator, who is here, and the heartbeat that keeps us listed."""
    beat = f"@post('/presence/heartbeat', {{payload: {{board_id: {visit.board_id}, viewer: $viewer, name: $name}}}})"
    leave = (
        "navigator.sendBeacon('/presence/leave', "
        f"new URLSearchParams({{board_id: {visit.board_id}, viewer: $viewer}}))"
    )
    return h.header(".topbar")[
        h.a(".brand", href="/", aria_label="All boards")["▦"],
        h.h1[visit.title],
        h.span(".saving", {"data-show": "$op != $done"}, style="display: none", aria_live="polite")["Saving…"],
        h.div(".who")[
            presence,
            h.span(".me")["You are ", h.strong({"data-text": "$name"})[visit.name]],
        ],
        # Its own element: Datastar cancels an element's in-flight request when that element
        # sends another, and the body's request is the stream.
        h.span(
            "#heartbeat",
            {"data-on-interval__duration.10s.leading": beat, "data-on:pagehide__window": leave},
            hidden=True,
        ),
    ]


def sidebar(visit: Visit, views: dict[str, Markup]) -> h.Element:
    """The outcome of this tab's last change, then the forms it is about."""
    return h.aside(".sidebar")[
        views["outcome"],
        edit_card_form(),
        rename_lane_form(),
        new_card_form(views["lanes"]),
        new_lane_form(visit.board_id),
    ]


def field(id_: str, label: str, signal: str, *, limit: int | None = None, multiline: bool = False) -> h.Fragment:
    """A labelled input bound to a signal, with a live character count when there is a limit."""
    control = h.textarea if multiline else h.input
    attrs = {"data-bind": signal}
    if not multiline:
        attrs["type"] = "text"
    return h.fragment[
        h.label(for_=id_)[
            label,
            limit and h.span(".limit", {"data-text": f"${signal}.length + ' / {limit}'"}, aria_hidden="true"),
        ],
        control(f"#{id_}", attrs, rows="3" if multiline else None, autocomplete="off"),
    ]


def submit(label: str, op_signal: str) -> h.Element:
    """A form's main button, pending while the op it sent has not landed."""
    return h.button(".primary", pending(f"{op_signal} == $op"), type="submit")[label]


def new_card_form(lane_picker: Markup) -> h.Element:
    """Add a card; the drafts clear only once the card is in, so a rejected one can be fixed."""
    lane = "document.getElementById('new-card-lane').value"
    add = send("/cards", lane_id=lane, title="$new_title", description="$new_description")
    return h.form(
        "#new-card.panel",
        {
            "data-on:submit": f"$new_op = $op + 1; {add}",
            "data-effect": "$ok_op == $new_op && ($new_title = '', $new_description = '', $new_op = -1)",
        },
        method="dialog",  # without Datastar, Enter must not reload the page and lose the draft
        aria_labelledby="new-card-heading",
    )[
        h.h2("#new-card-heading")["New card"],
        h.label(for_="new-card-lane")["Lane"],
        lane_picker,
        field("new-card-title", "Title", "new_title", limit=TITLE_MAX),
        field("new-card-description", "Description", "new_description", multiline=True),
        h.div(".buttons")[submit("Add card", "$new_op")],
    ]


def new_lane_form(board_id: int) -> h.Element:
    """Add a lane at the right end of the board."""
    add = send("/lanes", board_id=board_id, title="$lane_title")
    return h.form(
        "#new-lane.panel",
        {
            "data-on:submit": f"$lane_op = $op + 1; {add}",
            "data-effect": "$ok_op == $lane_op && ($lane_title = '', $lane_op = -1)",
        },
        method="dialog",
        aria_labelledby="new-lane-heading",
    )[
        h.h2("#new-lane-heading")["New lane"],
        field("new-lane-title", "Name", "lane_title"),
        h.div(".buttons")[submit("Add lane", "$lane_op")],
    ]


def edit_card_form() -> h.Element:
    """Shown while a card is being edited (`$edit`); closes once the save or delete landed."""
    save = send("/cards/edit", card_id="$edit", title="$edit_title", description="$edit_description")
    delete = send("/cards/delete", card_id="$edit")
    return h.form(
        "#edit-card.panel.editing",
        {
            "data-show": "$edit != 0",
            "data-on:submit": f"$edit_op = $op + 1; $busy = $edit; {save}",
            "data-effect": "$ok_op == $edit_op && ($edit = 0, $edit_op = -1)",
        },
        style="display: none",
        method="dialog",
        aria_labelledby="edit-card-heading",
    )[
        h.h2("#edit-card-heading")["Edit card"],
        field("edit-title", "Title", "edit_title", limit=TITLE_MAX),
        field("edit-description", "Description", "edit_description", multiline=True),
        h.div(".buttons")[
            submit("Save", "$edit_op"),
            h.button(".secondary", {"data-on:click": "$edit = 0"}, type="button")["Cancel"],
            h.button(
                ".danger", {"data-on:click": f"$edit_op = $op + 1; $busy = $edit; {delete}"}, type="button"
            )["Delete card"],
        ],
    ]


def rename_lane_form() -> h.Element:
    """Shown while a lane is being edited (`$rename`); closes once the change landed."""
    save = send("/lanes/rename", lane_id="$rename", title="$rename_title")
    delete = send("/lanes/delete", lane_id="$rename")
    return h.form(
        "#rename-lane.panel.editing",
        {
            "data-show": "$rename != 0",
            "data-on:submit": f"$rename_op = $op + 1; {save}",
            "data-effect": "$ok_op == $rename_op && ($rename = 0, $rename_op = -1)",
        },
        style="display: none",
        method="dialog",
        aria_labelledby="rename-lane-heading",
    )[
        h.h2("#rename-lane-heading")["Edit lane"],
        field("rename-title", "Name", "rename_title"),
        h.div(".buttons")[
            submit("Rename", "$rename_op"),
            h.button(".secondary", {"data-on:click": "$rename = 0"}, type="button")["Cancel"],
            h.button(
                ".danger", {"data-on:click": f"$rename_op = $op + 1; {delete}"}, type="button"
            )["Delete lane"],
        ],
    ]


def boards_page(boards: Sequence[Mapping[str, Any]]) -> str:
    """The list of every board: where the board's ▦ button leads."""
    return str(
        h.html(lang="en")[
            h.head[
                h.meta(charset="utf-8"),
                h.meta(name="viewport", content="width=device-width, initial-scale=1"),
                h.title["Boards"],
                h.style[STYLE],
            ],
            h.body[
                h.main(".boards")[
                    h.h1["Boards"],
                    h.ul(".board-list")[
                        (
                            h.li[h.a(href=f"/boards/{b['id']}")[b["title"]], h.span(".count")[f"{b['cards']} cards"]]
                            for b in boards
                        )
                    ],
                    not boards and h.p["No boards yet."],
                ]
            ],
        ]
    )


def not_found(board_id: int) -> str:
    """A plain page for a board id that does not exist, with a way back."""
    return str(
        h.html(lang="en")[
            h.head[h.meta(charset="utf-8"), h.title["Board not found"], h.style[STYLE]],
            h.body[
                h.main(".missing")[
                    h.h1["Board not found"],
                    h.p[f"There is no board {board_id}. ", h.a(href="/")["See every board"], "."],
                ]
            ],
        ]
    )
