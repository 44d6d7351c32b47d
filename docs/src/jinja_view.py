"""A view rendered by a Jinja2 template instead of htpy: its output is marked as HTML."""

from pathlib import Path

import jinja2
from markupsafe import Markup

from fastapi_lith import Db, Lith

lith = Lith("board.db", migrations=Path(__file__).parent / "board" / "migrations")

# --8<-- [start:view]
templates = jinja2.Environment(autoescape=True)  # every {{ value }} is escaped
LANE = templates.from_string(
    '<ul id="lane-{{ lane }}">{% for card in cards %}<li>{{ card.title }}</li>{% endfor %}</ul>'
)


@lith.view("lane/{lane}", topics={"cards"})
def lane(db: Db, lane: str) -> Markup:
    cards = db.all("SELECT title FROM card WHERE lane = :lane ORDER BY id", {"lane": lane})
    # render() returns a str, which would be escaped as text: the template escaped the
    # data, so its output is HTML, and Markup says so.
    return Markup(LANE.render(lane=lane, cards=cards))
# --8<-- [end:view]
