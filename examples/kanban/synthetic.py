"""A synthetic kanban board: 200 cards in 4 lanes, about 142 KB of HTML, the same every time.

Not the example's own page (views.py renders that): frames of the size and texture lith
measured (142,067 bytes per frame) for what compresses them, the encoder tests and the encoder
and hub benchmarks, which share it from here. Plain f-strings: the point is the bytes on the
wire, not how they were rendered.
"""

from __future__ import annotations

import random
from html import escape
from typing import Any

LANES = ("todo", "doing", "review", "done")
LANE_TITLES = {"todo": "To do", "doing": "Doing", "review": "In review", "done": "Done"}

_WORDS = [
    "account", "admin", "alert", "api", "archive", "audit", "backup", "badge", "billing", "board",
    "bug", "build", "cache", "calendar", "card", "cart", "chart", "checkout", "client", "cluster",
    "comment", "config", "cookie", "cron", "dashboard", "database", "deploy", "design", "digest",
    "docs", "draft", "email", "error", "export", "feature", "feed", "filter", "form", "gateway",
    "graph", "header", "import", "index", "invoice", "job", "label", "layout", "lint", "login",
    "logout", "mail", "metric", "migration", "mobile", "modal", "monitor", "navbar", "notify",
    "onboarding", "order", "page", "password", "payment", "plan", "policy", "profile", "query", "queue",
    "quota", "release", "report", "request", "retry", "review", "role", "router", "schema", "search",
    "session", "settings", "signup", "sitemap", "sync", "table", "team", "test", "theme", "ticket",
    "timeout", "token", "tooltip", "trace", "upload", "user", "vendor", "webhook", "widget", "worker"
]
_VERBS = [
    "Add", "Fix", "Refactor", "Update", "Remove", "Document", "Test", "Speed", "up", "Migrate",
    "Rename", "Split", "Merge", "Validate", "Cache", "Log", "Translate", "Audit", "Polish", "Redesign",
    "Simplify"
]
_PEOPLE = ("ada", "bob", "chen", "dara", "eve", "farid", "gus", "hana", "ivan", "jo")
_TAGS = ("bug", "feature", "ops", "ux", "docs", "perf", "security", "infra")


def make_cards(n: int = 200, seed: int = 1) -> list[dict[str, Any]]:
    """`n` cards spread evenly over the lanes, the same for the same seed."""
    rng = random.Random(seed)
    cards = []
    for i in range(n):
        words = rng.sample(_WORDS, 2)
        title = f"{rng.choice(_VERBS)} {words[0]} {words[1]}"
        description = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 9)))
        cards.append(
            {
                "id": i + 1,
                "lane": LANES[i % len(LANES)],
                "position": i // len(LANES),
                "title": title,
                "description": description.capitalize() + ".",
                "assignee": rng.choice(_PEOPLE),
                "tags": rng.sample(_TAGS, rng.randint(1, 3)),
                "points": rng.choice((1, 2, 3, 5, 8)),
                "version": 1,
            }
        )
    return cards


def card_html(card: dict[str, Any]) -> str:
    cid = card["id"]
    tags = "".join(f'<li class="tag tag-{t}">{t}</li>' for t in card["tags"])
    moves = "".join(
        f'<button data-on:click="@post(\'/cards/{cid}/move?lane={lane}\')">'
        f"{LANE_TITLES[lane]}</button>"
        for lane in LANES
        if lane != card["lane"]
    )
    return (
        f'<article id="card-{cid}" class="card card-{card["lane"]}" '
        f'data-version="{card["version"]}">'
        f'<header class="card-header"><h3 class="card-title">{escape(card["title"])}</h3>'
        f'<span class="card-points">{card["points"]}</span></header>'
        f'<p class="card-description">{escape(card["description"])}</p>'
        f'<ul class="card-tags">{tags}</ul>'
        f'<footer class="card-footer"><span class="card-assignee">@{card["assignee"]}</span>'
        f'<nav class="card-moves">{moves}</nav></footer>'
        f"</article>\n"
    )


def board_html(cards: list[dict[str, Any]]) -> str:
    """The whole board as one element, `#board`: what a view re-renders when one card changes."""
    lanes = []
    for lane in LANES:
        in_lane = sorted((c for c in cards if c["lane"] == lane), key=lambda c: c["position"])
        body = "".join(card_html(c) for c in in_lane)
        lanes.append(
            f'<section id="lane-{lane}" class="lane lane-{lane}">\n'
            f'<h2 class="lane-title">{LANE_TITLES[lane]} '
            f'<span class="lane-count">{len(in_lane)}</span></h2>\n'
            f'<div class="lane-cards">\n{body}</div>\n</section>\n'
        )
    return f'<main id="board" class="board">\n{"".join(lanes)}</main>'


def change_card(cards: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Step `step` of a deterministic edit sequence: one card changes, the rest stay.

    Even steps rename a card, odd steps move one to the next lane, so frames differ the way
    kanban frames differ: a small edit somewhere in 142 KB. Returns a new list.
    """
    cards = [dict(c) for c in cards]
    i = (step * 37) % len(cards)  # 37 is coprime with 200: every card gets its turn
    card = cards[i]
    if step % 2 == 0:
        card["title"] = f"{_VERBS[step % len(_VERBS)]} {_WORDS[step % len(_WORDS)]} #{step}"
    else:
        card["lane"] = LANES[(LANES.index(card["lane"]) + 1) % len(LANES)]
        card["position"] = -step  # moved cards go to the top of their new lane
    card["version"] += 1
    return cards


if __name__ == "__main__":
    html = board_html(make_cards())
    print(f"{len(html.encode()):,} bytes, {html.count('<article')} cards")
