"""Patches: what changed between two renders of a view, as Datastar patches by element id.

A view renders whole (`view = f(state)`), and a tab that shows the previous render needs only
what changed: on a 200-card board where one card moved, one `remove` and one insert instead of
the whole board, which every tab's compressor would otherwise read again at every tick.

Elements with an id are the keys. Two renders are compared from the root down: an element
whose HTML is the same is left alone; one whose own markup changed (its attributes, its text,
anything but its keyed children) is sent whole and Datastar morphs it by id; one whose keyed
children only came, went or moved keeps its place, and its children are patched one by one
(`remove`, then `before`/`after` a child that stayed). Anything this cannot say exactly, such
as HTML it does not parse, duplicate ids or a root that changed its id, returns None: the tab
gets the whole render, as before.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

from datastar_py.consts import ElementPatchMode
from datastar_py.sse import ServerSentEventGenerator

__all__ = ["Index", "index", "patch_events", "root_id"]

# A tag, its attributes read quote-aware (a quoted value may hold `>`), or a comment.
_TAG = re.compile(r"""<(?:(/?)([a-zA-Z][^\s/>]*+)((?:[^>"']++|"[^"]*+"|'[^']*+')*+)>|!--.*?-->)""", re.S)
_ID = re.compile(r"""(?:^|\s)id\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+))""")
_FIRST_TAG = re.compile(r"\s*" + _TAG.pattern, re.S)
# Ids a CSS selector can name as `#id` without escaping: the others are content, never keys.
_PLAIN_ID = re.compile(r"[A-Za-z_][\w-]*\Z")
# Tag names as htpy writes them; one written otherwise only fails to nest, and is sent whole.
_VOID = frozenset(
    ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr")
)
_RAW_TEXT = frozenset(("script", "style", "textarea", "title"))
# Inside these an id is content, never a key: a patch's elements are parsed as HTML (an SVG
# `<g>` inserted alone would not be SVG), and a template's are not in the page. In the first
# two, as in a browser, `<x/>` closes itself; elsewhere only a void element does.
_FOREIGN = frozenset(("svg", "math"))
_OPAQUE = _FOREIGN | {"template"}


def root_id(html: str) -> str | None:
    """The id of the first element of `html`, the element Datastar morphs by id."""
    m = _FIRST_TAG.match(html)
    return None if m is None or m.group(2) is None or m.group(1) else _id_of(m.group(3))


def _id_of(attrs: str) -> str | None:
    """The value of the `id` among a start tag's attributes, if any."""
    found = _ID.search(attrs) if "id" in attrs else None
    return None if found is None else next(g for g in found.groups() if g is not None)


@dataclass(eq=False, slots=True, weakref_slot=True)
class Index:
    """The keyed elements of one render, in document order: where each starts and ends in
    `html`, and its nearest keyed descendants. Element 0 is the root."""

    html: str
    ids: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    where: dict[str, int] = field(default_factory=dict)

    def outer(self, i: int) -> str:
        return self.html[self.starts[i] : self.ends[i]]

    def descendants(self, i: int) -> range:
        """The keyed elements inside element `i` (document order keeps them contiguous)."""
        end, j = self.ends[i], i + 1
        while j < len(self.ids) and self.starts[j] < end:
            j += 1
        return range(i + 1, j)

    def skeleton(self, i: int) -> tuple[str, list[list[int]]]:
        """Element `i`'s own markup, each run of adjacent keyed children standing as one `\\0`,
        and those runs: two renders with the same skeleton differ only inside their runs."""
        html, starts, ends = self.html, self.starts, self.ends
        parts: list[str] = []
        runs: list[list[int]] = []
        pos = starts[i]
        for child in self.children[i]:
            gap = html[pos : starts[child]]
            if runs and not gap:
                runs[-1].append(child)
            else:
                parts.append(gap)
                runs.append([child])
            pos = ends[child]
        parts.append(html[pos : ends[i]])
        return "\0".join(parts), runs


def index(html: str, like: Index | None = None) -> Index | None:
    """The keyed elements of `html`, or None where patches could not be exact: HTML that does not
    nest as written, an id twice, or anything beside the root element.

    `like`, the index of the view's previous render, is read instead of the HTML wherever an
    element is still its text to the character: a view of cached fragments repeats most of it,
    and parsing costs a Python step per tag where a comparison costs one per element.
    """
    if "data-ignore-morph" in html:  # a part the page keeps as it is: only a morph knows it
        return None
    found = Index(html)
    ids, starts, ends, children, where = found.ids, found.starts, found.ends, found.children, found.where
    open_tags: list[tuple[str, int]] = []  # tag name, and its keyed element or -1
    keyed: list[int] = []  # the keyed elements open, innermost last
    opaque = foreign = 0  # how deep inside an svg, a math or a template; inside the first two
    tags = _TAG.finditer(html)
    while True:
        for m in tags:
            end_tag, name, attrs = m.groups()
            if name is None:  # a comment
                continue
            if end_tag:
                if not open_tags or open_tags[-1][0] != name:
                    return None
                k = open_tags.pop()[1]
                if k >= 0:
                    ends[k] = m.end()
                    keyed.pop()
                if name in _OPAQUE:
                    opaque -= 1
                    foreign -= name in _FOREIGN
                continue
            k = -1
            if "id" in attrs and not opaque and (value := _id_of(attrs)) is not None and _PLAIN_ID.match(value):
                if value in where:
                    return None
                k = where[value] = len(ids)
                ids.append(value)
                starts.append(m.start())
                ends.append(m.end())
                children.append([])
                if keyed:
                    children[keyed[-1]].append(k)
                elif k:  # a second element at the top
                    return None
                if like is not None and (end := _copy(found, k, like, m.start())) is not None:
                    if end < 0:
                        return None
                    tags = _TAG.finditer(html, end)
                    break
            if name in _VOID or (attrs.endswith("/") and (foreign or name in _FOREIGN)):
                continue
            open_tags.append((name, k))
            if k >= 0:
                keyed.append(k)
            if name in _OPAQUE:
                opaque += 1
                foreign += name in _FOREIGN
            if name in _RAW_TEXT:  # its text is not markup: read on from its end tag
                text_end = html.find(f"</{name}", m.end())
                if text_end < 0:
                    return None
                tags = _TAG.finditer(html, text_end)
                break
        else:
            break
    if open_tags or not ids or starts[0] != len(html) - len(html.lstrip()) or html[ends[0] :].strip():
        return None
    return found


def _copy(found: Index, k: int, like: Index, at: int) -> int | None:
    """Element `k` of `found`, starting at `at`, read off `like` when it is an element of `like`
    character for character: its keyed descendants copied, moved to where they are now. Where
    it ends; None when it is not the same; -1 when a copied id is already in `found`.

    Same text means the same elements: a key is found only outside svg, math and templates,
    where the parse of an element depends on nothing before it.
    """
    i = like.where.get(found.ids[k])
    if i is None:
        return None
    start, end = like.starts[i], like.ends[i]
    if not found.html.startswith(like.html[start:end], at):
        return None
    shift, offset = k - i, at - start
    ids, starts, ends, children, where = found.ids, found.starts, found.ends, found.children, found.where
    ends[k] = end + offset
    children[k] = [c + shift for c in like.children[i]]
    for d in like.descendants(i):
        key = like.ids[d]
        if key in where:
            return -1
        where[key] = d + shift
        ids.append(key)
        starts.append(like.starts[d] + offset)
        ends.append(like.ends[d] + offset)
        children.append([c + shift for c in like.children[d]])
    return ends[k]


class _Patches:
    """What the comparison found: ids to remove, children to insert, elements to morph."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.inserted: list[tuple[ElementPatchMode, str, list[int]]] = []  # mode, anchor id, new elements
        self.morphed: list[int] = []

    def compare(self, old: Index, i: int, new: Index, j: int) -> None:
        """Patches that turn old element `i` into new element `j` (the same id)."""
        if old.outer(i) == new.outer(j):
            return
        old_skeleton, old_runs = old.skeleton(i)
        new_skeleton, new_runs = new.skeleton(j)
        if old_skeleton != new_skeleton:
            self.morphed.append(j)
            return
        plans = []
        for was, now in zip(old_runs, new_runs, strict=True):
            kept = _kept(old, was, new, now)
            if not kept:  # nothing to insert beside: the element is sent whole
                self.morphed.append(j)
                return
            plans.append((was, now, kept))
        for was, now, kept in plans:
            self.removed.extend(old.ids[c] for c in was if old.ids[c] not in kept)
            anchor: str | None = None
            waiting: list[int] = []
            for c in now:
                child = new.ids[c]
                if child not in kept:
                    waiting.append(c)
                    continue
                if waiting:
                    mode, at = (ElementPatchMode.BEFORE, child) if anchor is None else (ElementPatchMode.AFTER, anchor)
                    self.inserted.append((mode, at, waiting))
                    waiting = []
                anchor = child
                self.compare(old, old.where[child], new, c)
            if waiting and anchor is not None:  # `kept` is not empty: an anchor was met
                self.inserted.append((ElementPatchMode.AFTER, anchor, waiting))

    def moved_in(self, old: Index, new: Index) -> Iterable[str]:
        """Ids that an insert or a morph brings from elsewhere in the page: removed first, so
        no id is in the page twice while the patches apply."""
        for _, _, elements in self.inserted:
            for c in elements:
                for d in (c, *new.descendants(c)):
                    if new.ids[d] in old.where:
                        yield new.ids[d]
        for j in self.morphed:
            i = old.where[new.ids[j]]
            inside = old.descendants(i)
            for d in new.descendants(j):
                was = old.where.get(new.ids[d])
                if was is not None and was not in inside:
                    yield new.ids[d]


def _kept(old: Index, was: list[int], new: Index, now: list[int]) -> set[str]:
    """The ids of `now` that stay where they are: the longest run of children in the old order
    (the rest are removed and inserted again)."""
    place = {old.ids[c]: p for p, c in enumerate(was)}
    order = [(place[new.ids[c]], new.ids[c]) for c in now if new.ids[c] in place]
    # Longest increasing subsequence by old place, with patience sorting.
    tails: list[int] = []
    tail_at: list[int] = []
    before: list[int] = [-1] * len(order)
    for n, (p, _) in enumerate(order):
        k = bisect_left(tails, p)
        if k == len(tails):
            tails.append(p)
            tail_at.append(n)
        else:
            tails[k] = p
            tail_at[k] = n
        before[n] = tail_at[k - 1] if k else -1
    kept: set[str] = set()
    n = tail_at[-1] if tail_at else -1
    while n >= 0:
        kept.add(order[n][1])
        n = before[n]
    return kept


def patch_events(old: Index, new: Index) -> str | None:
    """The Datastar events that turn a page showing `old` into `new`, or None where they could
    not be exact (the root itself changed, or its id). An empty string: nothing changed."""
    if old.ids[0] != new.ids[0]:
        return None
    found = _Patches()
    found.compare(old, 0, new, 0)
    if 0 in found.morphed:
        return None
    removed = list(dict.fromkeys([*found.removed, *found.moved_in(old, new)]))
    events: list[str] = []
    if removed:
        events.append(ServerSentEventGenerator.remove_elements(", ".join(f"#{i}" for i in removed)))
    for mode, anchor, elements in found.inserted:
        html = "".join(new.outer(c) for c in elements)
        events.append(ServerSentEventGenerator.patch_elements(html, selector=f"#{anchor}", mode=mode))
    if found.morphed:
        events.append(ServerSentEventGenerator.patch_elements("".join(new.outer(j) for j in found.morphed)))
    return "".join(map(str, events))
