"""View keys, parameters, root ids and the fragment cache."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import htpy as h
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import Markup

from fastapi_lith import Accounts, Db, Lith, SettingError, ViewError, fragment
from fastapi_lith.engine.statements import StatementCache
from fastapi_lith.engine.views import Views, root_id
from fastapi_lith.testing import Tabs


def test_keys_parameters_and_topics() -> None:
    views = Views()

    @views.register("board/{board_id}/lane/{lane}", topics={"board:{board_id}", "lanes"})
    def lane(db: Db, board_id: int, lane: str) -> str:
        return ""

    view, params = views.resolve("board/7/lane/todo")
    assert params == {"board_id": 7, "lane": "todo"}
    assert view.key(params) == "board/7/lane/todo"
    assert view.topics_for(params) == {"board:7", "lanes"}
    assert views.resolve("board/{board_id}/lane/{lane}", {"board_id": "3", "lane": "x"})[1] == {
        "board_id": 3,
        "lane": "x",
    }
    with pytest.raises(ViewError, match="board_id"):
        views.resolve("board/seven/lane/todo")
    with pytest.raises(ViewError, match="no view matches"):
        views.resolve("board/7")


def test_registration_errors() -> None:
    views = Views()
    with pytest.raises(ViewError, match="no parameter 'board_id'"):
        views.register("board/{board_id}")(lambda db: "")
    with pytest.raises(ViewError, match="uses {tab}"):
        views.register("board/{board_id}", topics={"tab:{tab}"})(lambda db, board_id: "")
    views.register("x")(lambda db: "")
    with pytest.raises(ViewError, match="twice"):
        views.register("x")(lambda db: "")


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ('<div id="a">x</div>', "a"),
        ("  <section class='c' id='b-1'>", "b-1"),
        ('<my-el data-x="1" id=c>', "c"),
        ('<div data-id="no">', None),
        ("text <div id=x>", None),
        ('<div><p id="inner">', None),
    ],
)
def test_root_id(html: str, expected: str | None) -> None:
    assert root_id(html) == expected


def test_lith_view_decorator_keeps_the_function() -> None:
    lith = Lith(":memory:")

    @lith.view("hello")
    def hello(db: Db) -> h.Element:
        return h.p(id="hello")["hi"]

    assert str(hello(None)) == '<p id="hello">hi</p>'  # type: ignore[arg-type]


# -- fragments: cached card HTML equals the uncached render, whatever the board went through --

def card_element(row: sqlite3.Row) -> h.Element:
    return h.article(id=f"card-{row['id']}", class_="card", data_lane=row["lane"])[
        h.h3[row["title"]], h.p[row["body"]], h.small[f"#{row['position']}"]
    ]


cached_card = fragment(maxsize=64)(card_element)


def board(db: Db, card: object) -> str:
    lanes = db.all("SELECT DISTINCT lane FROM cards ORDER BY lane")
    return str(
        h.main(id="board")[
            (
                h.section(id=f"lane-{lane['lane']}")[
                    h.h2[lane["lane"]],
                    [card(r) for r in db.all("SELECT * FROM cards WHERE lane = ? ORDER BY position, id", (lane["lane"],))],
                ]
                for lane in lanes
            )
        ]
    )


text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
change = st.one_of(
    st.tuples(st.just("add"), text, text, st.sampled_from(["todo", "doing", "done"])),
    st.tuples(st.just("rename"), st.integers(0, 30), text),
    st.tuples(st.just("move"), st.integers(0, 30), st.sampled_from(["todo", "doing", "done"]), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 30)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(change, min_size=1, max_size=40))
def test_fragment_cache_output_equals_uncached(changes: list[tuple]) -> None:
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.execute("CREATE TABLE cards (id INTEGER PRIMARY KEY, lane TEXT, title TEXT, body TEXT, position INTEGER)")
    db = Db(conn, StatementCache())
    for step in changes:
        ids = [r[0] for r in conn.execute("SELECT id FROM cards ORDER BY id")]
        if step[0] == "add":
            conn.execute("INSERT INTO cards (title, body, lane, position) VALUES (?, ?, ?, 0)", step[1:])
        elif ids and step[0] == "rename":
            conn.execute("UPDATE cards SET title = ? WHERE id = ?", (step[2], ids[step[1] % len(ids)]))
        elif ids and step[0] == "move":
            conn.execute("UPDATE cards SET lane = ?, position = ? WHERE id = ?", (step[2], step[3], ids[step[1] % len(ids)]))
        elif ids and step[0] == "delete":
            conn.execute("DELETE FROM cards WHERE id = ?", (ids[step[1] % len(ids)],))
        assert board(db, cached_card) == board(db, card_element)


def test_integer_parameters_sqlite_cannot_store_are_a_view_error() -> None:
    views = Views()

    @views.register("board/{board_id}")
    def board(db: Db, board_id: int) -> str:
        return ""

    for key in ("board/9223372036854775808", "board/-9223372036854775809"):
        with pytest.raises(ViewError, match="outside SQLite's integers"):
            views.resolve(key)
    with pytest.raises(ViewError, match="board_id"):
        views.resolve("board/{board_id}", {"board_id": 2**64})
    assert views.resolve("board/9223372036854775807")[1] == {"board_id": 2**63 - 1}


# -- topics: a string where a collection is expected is refused, never split into letters ----------


def test_topics_given_as_one_string_are_a_setting_error(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db")
    accounts = Accounts(tmp_path / "accounts")
    for register in (lith.view, accounts.view, lambda key, topics: Views().register(key, topics)):
        with pytest.raises(SettingError, match=r"collection of topics, such as \{'items'\}, not the string 'items'"):
            register("items", topics="items")
        with pytest.raises(SettingError, match="a topic is a string, not 3"):
            register("items", topics={"items", 3})
        with pytest.raises(SettingError, match="collection of topics"):
            register("items", topics=3)
    assert lith.views.get("items") is None  # nothing half-registered: the right call still works
    lith.view("items", topics=["items"])(lambda db: h.p(id="items"))
    assert lith.views.get("items").topics == {"items"}  # type: ignore[union-attr]
    with pytest.raises(SettingError, match=r"^touch_later: a topic is a string, not \['a', 'b'\].*\*topics"):
        lith.touch_later(1, ["a", "b"])  # type: ignore[arg-type]


# -- connect: a key the stream would refuse is refused where the page is rendered -------------------


def test_connect_refuses_a_key_the_stream_would_refuse(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db")

    @lith.view("board/{board_id}", topics={"board:{board_id}"})
    def board(db: Db, board_id: int) -> h.Element:
        return h.p(id="board")

    with pytest.raises(ViewError, match="no view matches 'itemz'"):
        lith.connect("itemz", tab="t1")
    with pytest.raises(ViewError, match="board_id"):
        lith.connect("board/seven", tab="t1")
    with pytest.raises(ViewError, match="'outcome/t2' belongs to another tab"):
        lith.connect("outcome/t2", tab="t1")
    assert "views=board/3,outcome/t1&tab=t1" in lith.connect("board/3", "outcome/{tab}", tab="t1")


# -- one rule for what becomes HTML: text is escaped unless it is markup ----------------------------


async def test_a_views_text_is_escaped_unless_it_is_markup(tmp_path: Path) -> None:
    lith = Lith(tmp_path / "a.db")

    @lith.view("raw")
    def raw(db: Db) -> str:
        return '<p id="raw"><script>alert(1)</script></p>'

    @lith.view("safe")
    def safe(db: Db) -> Markup:
        return Markup('<p id="safe">{}</p>').format("<script>alert(1)</script>")

    async with Tabs(lith) as tabs:
        with pytest.raises(ViewError, match=r"view 'raw' returned a str, which is text.*Markup\("):
            await lith.render("raw")  # the first paint
        tab = await tabs.open("raw", "safe")  # the stream: the str is never sent as HTML
        assert [frame.key for frame in tab.received] == ["safe"]
        assert lith.hub.counters.render_errors == 1
        assert tab.html("safe") == '<p id="safe">&lt;script&gt;alert(1)&lt;/script&gt;</p>'
        assert await lith.render("safe") == tab.html("safe")


def test_a_fragment_follows_the_same_rule() -> None:
    text = fragment()(lambda s: s)
    assert text("<script>") == "&lt;script&gt;" and isinstance(text("x"), Markup)
    assert text(Markup("<b>bold</b>")) == "<b>bold</b>"
    assert text(h.b["<i>"]) == "<b>&lt;i&gt;</b>"


# -- what the mutants of views.py once changed unseen ----------------------------------------------


def test_keys_with_text_after_a_parameter_defaults_and_unannotated_parameters() -> None:
    views = Views()

    @views.register("item/{item_id}/edit")
    def edit(db: Db, item_id):  # type: ignore[no-untyped-def]  # a str, as written in the key
        return ""

    @views.register("page/{n}")
    def page(db: Db, n: int = 1) -> str:
        return ""

    assert views.resolve("item/3/edit")[1] == {"item_id": "3"}
    with pytest.raises(ViewError, match="no view matches"):
        views.resolve("item/3")
    assert views.resolve("page/{n}", {})[1] == {"n": 1}  # a pattern with parameters left to defaults
    with pytest.raises(ViewError, match=r"^view 'item/\{item_id\}/edit': item_id: Field required$"):
        views.resolve("item/{item_id}/edit", {})


def test_view_errors_say_which_view_and_what_is_wrong(tmp_path: Path) -> None:
    views = Views()

    @views.register("cell/{row}/{col}")
    def cell(db: Db, row: int, col: int) -> object:
        return row

    with pytest.raises(ViewError, match=(r"^view 'cell/\{row\}/\{col\}': row: Input should be a valid integer, "
                                         r"unable to parse string as an integer; col: Input should be a valid")):
        views.resolve("cell/a/b")
    view, params = views.resolve("cell/3/4")
    with pytest.raises(ViewError, match=r"^view 'cell/3/4' returned int, not HTML$"):
        view.html(Db(sqlite3.connect(":memory:")), params)
    with pytest.raises(SettingError, match=r"^view 'cells': topics must be a collection"):
        views.register("cells", topics="cells")


def test_a_views_str_is_refused_with_what_to_return_instead(tmp_path: Path) -> None:
    views = Views()
    views.register("text")(lambda db: "plain")
    view, params = views.resolve("text")
    with pytest.raises(ViewError, match=(r"^view 'text' returned a str, which is text and is escaped: return "
                                         r"htpy elements, or Markup\(html\) for HTML you trust \(a Jinja2 "
                                         r"template's render\(\)\)$")):
        view.html(Db(sqlite3.connect(":memory:")), params)


def test_a_fragment_keeps_the_functions_name_and_doc() -> None:
    def card(title: str) -> h.Element:
        """One card."""
        return h.p[title]

    cached = fragment()(card)
    assert (cached.__name__, cached.__doc__, cached.__wrapped__) == ("card", "One card.", card)  # type: ignore[attr-defined]
