"""Patches between two renders, applied as Datastar applies them, give the second render.

The page here is a small DOM of our own, built by the standard library's HTML parser (not the
scanner under test) and patched the way Datastar 1.0's `datastar-patch-elements` does: `remove`
every element a selector names, insert `before`/`after` the element a selector names, and morph
each top-level element of an outer patch into the element with its id (a perfect morph: the
element becomes the new one). The browser does the same in tests/examples/test_kanban.py.
"""

from __future__ import annotations

import gc
import random
import weakref
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from fastapi_lith.engine.frames import Frame, sse_event
from fastapi_lith.engine.patches import Index, index, patch_events

VOID = {"br", "input", "img", "hr"}


class Node:
    def __init__(self, tag: str, start: str, attrs: dict[str, str | None]) -> None:
        self.tag, self.start, self.id = tag, start, attrs.get("id")
        self.children: list[Node | str] = []
        self.parent: Node | None = None

    def html(self) -> str:
        if self.tag in VOID:
            return self.start
        inner = "".join(c if isinstance(c, str) else c.html() for c in self.children)
        return f"{self.start}{inner}</{self.tag}>"

    def ids(self) -> list[str]:
        found = [self.id] if self.id else []
        for c in self.children:
            if isinstance(c, Node):
                found.extend(c.ids())
        return found

    def find(self, id_: str) -> Node | None:
        if self.id == id_:
            return self
        for c in self.children:
            if isinstance(c, Node) and (found := c.find(id_)) is not None:
                return found
        return None


class Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.top = Node("#fragment", "", {})
        self.open = [self.top]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, self.get_starttag_text() or "", dict(attrs))
        node.parent = self.open[-1]
        self.open[-1].children.append(node)
        if tag not in VOID:
            self.open.append(node)

    def handle_endtag(self, tag: str) -> None:
        assert self.open[-1].tag == tag
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.open[-1].children.append(data)

    def handle_entityref(self, name: str) -> None:
        self.open[-1].children.append(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.open[-1].children.append(f"&#{name};")

    def handle_comment(self, data: str) -> None:
        self.open[-1].children.append(f"<!--{data}-->")


def parse(html: str) -> list[Node]:
    builder = Builder()
    builder.feed(html)
    builder.close()
    nodes = [c for c in builder.top.children if isinstance(c, Node)]
    for node in nodes:
        node.parent = None
    return nodes


def events(text: str) -> list[dict[str, str]]:
    """Each event's data lines, as Datastar reads them: `mode`, `selector`, `elements`."""
    out = []
    for block in filter(None, text.strip("\n").split("\n\n")):
        lines = block.split("\n")
        assert lines[0] == "event: datastar-patch-elements"
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.removeprefix("data: ").partition(" ")
            fields[name] = fields[name] + "\n" + value if name in fields else value
        out.append(fields)
    return out


def apply(page: Node, text: str) -> None:
    """Apply each event, and check that no id is ever in the page twice: a morph or an insert
    that meets an element with its id elsewhere in the page is not exact in Datastar."""
    for event in events(text):
        ids = page.ids()
        assert len(ids) == len(set(ids)), f"an id twice before {event}"
        mode, selector = event.get("mode", "outer"), event.get("selector")
        if mode == "remove":
            found = [page.find(one.removeprefix("#")) for one in selector.split(", ")]  # querySelectorAll
            for node in found:
                assert node is not None and node.parent is not None, selector
                node.parent.children.remove(node)
            continue
        new = parse(event["elements"])
        if mode == "outer":
            assert selector is None
            for node in new:  # one morph after another: none may meet an id twice either
                old = page.find(node.id)
                assert old is not None and old.parent is not None, node.id
                siblings = old.parent.children
                node.parent = old.parent
                siblings[siblings.index(old)] = node
                ids = page.ids()
                assert len(ids) == len(set(ids)), f"an id twice after the morph of {node.id}"
            continue
        target = page.find(selector.removeprefix("#"))
        assert target is not None and target.parent is not None, selector
        siblings = target.parent.children
        at = siblings.index(target) + (mode == "after")
        for node in new:
            node.parent = target.parent
        siblings[at:at] = new
    ids = page.ids()
    assert len(ids) == len(set(ids)), "an id twice after the last event"


def patched(old: str, new: str) -> str | None:
    """The page of `old` after the patches to `new`; None when the whole render is sent."""
    before, after = index(old), index(new)
    assert before is not None and after is not None
    text = patch_events(before, after)
    if text is None:
        return None
    holder = Node("body", "<body>", {})
    (page,) = parse(old)
    page.parent = holder
    holder.children = [page]
    apply(holder, text)
    return holder.children[0].html()


# -- a board as an app would render it ----------------------------------------------------------


def card(n: int, title: str | None = None) -> str:
    return f'<li id="card-{n}" class="card"><h3>{title or f"Card {n}"}</h3><button name="move" value="{n}">&rarr;</button></li>'


def board(lanes: dict[int, list[int]], titles: dict[int, str] | None = None) -> str:
    titles = titles or {}
    return '<main id="board">' + "".join(
        f'<section id="lane-{lane}"><header><h2>Lane {lane}</h2><span id="lane-{lane}-count">{len(cards)}</span></header>'
        f'<ol class="cards">{"".join(card(c, titles.get(c)) for c in cards)}</ol></section>'
        for lane, cards in lanes.items()
    ) + "</main>"


def test_a_card_moved_to_another_lane_is_one_remove_and_one_insert() -> None:
    old = board({1: [1, 2, 3], 2: [4, 5]})
    new = board({1: [1, 3], 2: [4, 2, 5]})
    text = patch_events(index(old), index(new))  # type: ignore[arg-type]
    assert [(e.get("mode", "outer"), e.get("selector")) for e in events(text or "")] == [
        ("remove", "#card-2"),
        ("after", "#card-4"),
        ("outer", None),  # the two lanes' counts, in one event
    ]
    assert events(text or "")[-1]["elements"] == '<span id="lane-1-count">2</span><span id="lane-2-count">3</span>'
    assert patched(old, new) == new


def test_a_changed_card_is_morphed_alone_and_nothing_changed_is_no_event() -> None:
    old = board({1: [1, 2, 3]})
    new = board({1: [1, 2, 3]}, {2: "Renamed <b>bold</b> &amp; more"})
    text = patch_events(index(old), index(new))  # type: ignore[arg-type]
    assert events(text or "") == [{"elements": card(2, "Renamed <b>bold</b> &amp; more")}]
    assert patch_events(index(new), index(new)) == ""  # type: ignore[arg-type]


def test_the_first_card_of_a_lane_goes_before_the_one_that_stays_and_an_emptied_lane_is_morphed() -> None:
    old = board({1: [1, 2], 2: [3]})
    assert patched(old, board({1: [3, 1, 2], 2: []})) == board({1: [3, 1, 2], 2: []})
    text = patch_events(index(old), index(board({1: [1], 2: [2, 3]})))  # type: ignore[arg-type]
    assert ("before", "#card-3") in [(e.get("mode"), e.get("selector")) for e in events(text or "")]


def test_what_patches_cannot_say_exactly_is_sent_whole() -> None:
    old = board({1: [1, 2]})
    assert patch_events(index(old), index(old.replace('id="board"', 'id="other"'))) is None  # type: ignore[arg-type]
    assert patch_events(index(old), index(old.replace("<main", '<main class="dark"'))) is None  # type: ignore[arg-type]
    assert index(old.replace("</h2>", "")) is None  # does not nest as written
    assert index(old.replace("card-2", "card-1")) is None  # an id twice
    assert index(old + "<p>after</p>") is None  # beside the root
    assert index("<p>no id</p>") is None


def test_two_cards_moved_together_go_in_one_insert_and_a_part_moved_inside_another_goes_first() -> None:
    old = board({1: [1, 2, 3, 4], 2: [5]})
    new = board({1: [1, 4], 2: [5, 2, 3]})
    text = patch_events(index(old), index(new))  # type: ignore[arg-type]
    inserts = [e for e in events(text or "") if e.get("mode") == "after"]
    assert inserts == [{"mode": "after", "selector": "#card-5", "elements": card(2) + card(3)}]
    assert patched(old, new) == new
    # A badge with an id moves from card 1 into card 3, which moves lanes; and from card 5 into
    # card 4, which is morphed before card 5 is: each is removed from where it was first.
    badge = '<b id="badge-{}">!</b>'
    old = board({1: [1, 2, 3, 4], 2: [5]}).replace("Card 1<", f"Card 1{badge.format(1)}<")
    old = old.replace("Card 5<", f"Card 5{badge.format(2)}<")
    new = board({1: [1, 2, 4], 2: [3, 5]}).replace("Card 3<", f"Card 3{badge.format(1)}<")
    new = new.replace("Card 4<", f"Card 4 edited{badge.format(2)}<")
    text = patch_events(index(old), index(new)) or ""  # type: ignore[arg-type]
    assert events(text)[0] == {"mode": "remove", "selector": "#card-3, #badge-1, #badge-2"}
    assert patched(old, new) == new


def test_script_text_comments_and_void_elements_are_not_markup_to_the_index() -> None:
    old = board({1: [1, 2]}).replace(
        "</main>", '<script>if (a <b) x("</div>")</script><!-- <p id="x"> --><br><img id="pic" src="a.png"></main>'
    )
    found = index(old)
    assert found is not None and "pic" in found.ids and "x" not in found.ids
    new = old.replace("Card 2", "Card two")
    assert patched(old, new) == new
    assert index(old.replace("</script>", "")) is None  # a script that never ends
    two = old.replace("<br>", '<i id="between"></i><script>"<p>"</script><br/><input id="field" />')
    assert index(two) is not None and {"pic", "field", "between"} <= set(index(two).ids)  # type: ignore[union-attr]
    # `<x/>` closes itself in SVG, as in a browser; in HTML a `<div/>` is opened, as in a browser.
    svg = old.replace("<br>", '<svg id="icon"><circle r="1"/><path d="M0"/></svg><svg id="empty"/>')
    assert index(svg) is not None and {"icon", "empty"} <= set(index(svg).ids)  # type: ignore[union-attr]
    assert index(old.replace("<br>", '<div id="open"/>')) is None  # never closed
    # ... and only while inside one: after an SVG, as inside a template within one.
    assert index(old.replace("<br>", '<svg><circle r="1"/></svg><div/>')) is None
    assert index(old.replace("<br>", '<svg><template></template><circle r="1"/></svg>')) is not None
    assert index('<main id="board"><p>x</span></main>') is None  # an end tag of another element


def test_ids_inside_svg_and_templates_are_content_and_a_part_the_page_keeps_sends_the_whole() -> None:
    chart = '<svg id="chart"><g id="bar-1"><rect width="3"></rect></g><g id="bar-2"></g></svg>'
    template = '<template id="t"><svg></svg><li id="card-9"></li></template>'
    old = board({1: [1, 2]}).replace("</main>", chart + template + "</main>")
    found = index(old)
    assert found is not None
    assert {"chart", "t"} <= set(found.ids) and not {"bar-1", "bar-2", "card-9"} & set(found.ids)
    new = old.replace('width="3"', 'width="4"')
    assert events(patch_events(found, index(new)) or "") == [{"elements": chart.replace('width="3"', 'width="4"')}]
    assert patched(old, new) == new
    assert index(old.replace('<li id="card-1"', '<li data-ignore-morph id="card-1"')) is None


def test_a_long_frame_is_sent_as_patches_to_a_tab_that_shows_the_one_before_and_whole_otherwise() -> None:
    lanes = {lane: list(range(lane * 20, lane * 20 + 20)) for lane in range(4)}
    first = Frame.rendered("board", board(lanes))
    lanes[1].insert(3, lanes[0].pop(5))
    second = Frame.rendered("board", board(lanes))
    assert first.index is not None and second.index is not None
    patch = second.since(first)
    assert patch is second.since(first)  # made once for every tab that shows `first`
    event = sse_event(patch).decode()
    assert event.startswith("event: datastar-patch-elements\ndata: mode remove\ndata: selector #card-5\n")
    assert len(event) < 3_000 < len(second.html)
    assert second.since(second) is second and patch.key == "board"
    # From another render, other patches; a frame keeps those of its last four.
    others = [Frame.rendered("board", board({lane: cards[n:] for lane, cards in lanes.items()})) for n in range(5)]
    made = [second.since(other) for other in others]
    assert len({sse_event(p) for p in made}) == 5 and sse_event(made[0]) != event.encode()
    assert second.since(others[4]) is made[4] and second.since(others[0]) is not made[0]
    small = Frame.rendered("count", '<p id="count">1</p>')
    assert small.index is None and small.since(Frame.rendered("count", '<p id="count">0</p>')) is small
    # Patches longer than the whole render: sent whole.
    lanes = {lane: [c + 1000 for c in cards] for lane, cards in lanes.items()}
    third = Frame.rendered("board", board(lanes))
    assert sse_event(third.since(second)) == sse_event(third)


def test_a_frame_of_patches_keeps_no_earlier_render_once_its_bytes_are_made() -> None:
    """A view that stays unchanged for hours keeps its frame, and the patches cached on it: they
    must not keep the renders they were made from (158 KB each on a board)."""
    lanes = {lane: list(range(lane * 20, lane * 20 + 20)) for lane in range(4)}
    first = Frame.rendered("board", board(lanes))
    lanes[2].reverse()
    second = Frame.rendered("board", board(lanes))
    patch = second.since(first)
    first_index = weakref.ref(first.index)  # type: ignore[arg-type]
    del first
    gc.collect()
    assert first_index() is not None  # wanted until the patches are made
    assert b"mode before" in sse_event(patch) or b"mode after" in sse_event(patch)
    gc.collect()
    assert first_index() is None


# -- any two renders ------------------------------------------------------------------------------

TAGS = ["div", "section", "ul", "li", "span", "p"]


def render(node: dict) -> str:
    attrs = "".join(f' {k}="{v}"' for k, v in node["attrs"].items())
    if node["tag"] == "br":
        return f"<br{attrs}>"
    inner = "".join(c if isinstance(c, str) else render(c) for c in node["children"])
    return f"<{node['tag']}{attrs}>{inner}</{node['tag']}>"


def grow(rnd: random.Random, depth: int, ids: list[int]) -> dict:
    keyed = rnd.random() < 0.6
    attrs = {"id": f"k{ids.pop()}"} if keyed and ids else {}
    if rnd.random() < 0.2:
        attrs["class"] = rnd.choice(["a", "b"])
    if depth == 0 or rnd.random() < 0.2:
        if rnd.random() < 0.1:
            return {"tag": "br", "attrs": attrs, "children": []}
        return {"tag": rnd.choice(TAGS), "attrs": attrs, "children": [rnd.choice(["x", "y &amp; z", ""])]}
    children: list = [grow(rnd, depth - 1, ids) for _ in range(rnd.randint(0, 4))]
    if rnd.random() < 0.3:
        children.insert(rnd.randint(0, len(children)), rnd.choice(["text", "<!-- c -->"]))
    return {"tag": rnd.choice(TAGS), "attrs": attrs, "children": children}


def elements(node: dict) -> list[dict]:
    found = [node]
    for c in node["children"]:
        if isinstance(c, dict):
            found.extend(elements(c))
    return found


def mutate(rnd: random.Random, root: dict, ids: list[int]) -> None:
    nodes = elements(root)
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.choice(["move", "move", "insert", "delete", "text", "attr"])
        target = rnd.choice(nodes)
        if kind == "text":
            target["children"].append("changed")
        elif kind == "attr" and target is not root:
            target["attrs"]["class"] = "changed"
        elif kind == "insert" and target["tag"] != "br":
            target["children"].insert(rnd.randint(0, len(target["children"])), grow(rnd, 1, ids))
        elif kind in ("move", "delete") and target is not root:
            parent = next(n for n in elements(root) if any(c is target for c in n["children"]))
            parent["children"] = [c for c in parent["children"] if c is not target]
            if kind == "move":
                inside = {id(n) for n in elements(target)}
                homes = [n for n in elements(root) if id(n) not in inside and n["tag"] != "br"]
                home = rnd.choice(homes)
                home["children"].insert(rnd.randint(0, len(home["children"])), target)
        nodes = elements(root)


def successive_renders(rnd: random.Random, edits: int) -> list[str]:
    """A random document's render, then one more after each of `edits` rounds of random edits."""
    ids = list(range(200, 0, -1))
    root = grow(rnd, 4, ids)
    root["tag"], root["attrs"]["id"] = "div", "root"
    renders = [render(root)]
    for _ in range(edits):
        mutate(rnd, root, ids)
        renders.append(render(root))
    return renders


@settings(max_examples=400, deadline=None)
@given(st.randoms(use_true_random=False))
def test_patches_turn_any_render_into_the_next(rnd: random.Random) -> None:
    old, new = successive_renders(rnd, 1)
    assert patched(old, new) in (new, None)


@settings(max_examples=200, deadline=None)
@given(st.randoms(use_true_random=False))
def test_boards_after_any_moves_are_patched_not_sent_whole(rnd: random.Random) -> None:
    lanes = {lane: list(range(lane * 10, lane * 10 + rnd.randint(2, 10))) for lane in range(4)}
    old = board(lanes)
    for _ in range(rnd.randint(1, 5)):
        source = rnd.choice([lane for lane, cards in lanes.items() if len(cards) > 1])
        moved = lanes[source].pop(rnd.randrange(len(lanes[source])))
        into = lanes[rnd.choice(list(lanes))]
        into.insert(rnd.randint(0, len(into)), moved)
    titles = {c: "Edited" for c in rnd.sample(sorted(c for cards in lanes.values() for c in cards), 2)}
    new = board(lanes, titles)
    assert patched(old, new) == new


# -- an index read off the previous render ----------------------------------------------------


def same(a: Index | None, b: Index | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.ids, a.starts, a.ends, a.children, a.where) == (b.ids, b.starts, b.ends, b.children, b.where)


@settings(max_examples=400, deadline=None)
@given(st.randoms(use_true_random=False))
def test_an_index_read_off_the_previous_render_is_the_one_read_afresh(rnd: random.Random) -> None:
    renders = successive_renders(rnd, 3)
    for old, new in zip(renders, renders[1:], strict=False):
        assert same(index(new, index(old)), index(new))


class Reads(str):
    """HTML that counts the elements compared with the previous render's, and those found the same."""

    compared = same_text = 0

    def startswith(self, prefix: object, *args: object) -> bool:
        Reads.compared += 1
        found = super().startswith(prefix, *args)  # type: ignore[arg-type]
        Reads.same_text += found
        return found


def test_the_previous_render_is_read_where_an_element_is_its_text_and_nowhere_its_text_means_otherwise() -> None:
    card = '<li id="card-1" class="card"><b id="title-1">A</b><button>&rarr;</button></li>'
    old = f'<main id="board"><ol id="todo">{card}<li id="card-2"></li></ol></main>'
    like = index(old)
    assert like is not None
    Reads.compared = Reads.same_text = 0
    moved = Reads(f'<main id="board"><ol id="todo"><li id="card-2"></li>{card}</ol></main>')
    assert same(index(moved, like), index(str(moved)))
    # board and todo changed; card-2 and card-1 (with title-1 inside) are read off `like`
    assert (Reads.compared, Reads.same_text) == (4, 2)
    cases = [
        old,  # nothing changed: the root is read off whole
        f'<main id="board"><svg>{card}</svg><ol id="todo"></ol></main>',  # in SVG its ids are content
        f'<main id="board"><template>{card}</template><ol id="todo"></ol></main>',
        f'<main id="board"><script>"{card}"</script><ol id="todo"></ol></main>',
        f'<main id="board"><b id="title-1"></b><ol id="todo">{card}</ol></main>',  # an id twice
        f'<main id="board"><ol id="todo">{card}</ol><b id="title-1"></b></main>',
        f'<main id="board"><ol id="todo">{card}</ol></main><p>beside the root</p>',
        f'<main id="board"><ol id="todo">{card}</main>',  # an element never closed
        card,  # what was inside is the root now
        f'<main id="board"><ol id="todo">{card}<li id="card-2"></li></ol><hr id="end"></main>',
    ]
    for new in cases:
        assert same(index(new, like), index(new)), new
    assert index(cases[4], like) is None and index(cases[5], like) is None
