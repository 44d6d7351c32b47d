"""The dashboard's HTML: its two views, their stylesheet, and the plots drawn by pygal.

The numbers view renders at every refresh, the plots view at most once a `POINT_EVERY`; both
render from one `Readings` on a reader thread, like any view. pygal is imported the first time
a plot is drawn, so an app that never shows its dashboard never imports it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import htpy as h
from markupsafe import Markup, escape

from .readings import HISTORY, POINT_EVERY, Point, Readings

NUMBERS, PLOTS = "lith-dashboard/numbers", "lith-dashboard/plots"  # the keys of its views
MISSING = "–"


# -- numbers ------------------------------------------------------------------------------


def count(n: float) -> str:
    return f"{n:,.0f}"


def rate(n: float) -> str:
    return f"{n:,.0f}/s" if n >= 10 or n == 0 else f"{n:.1f}/s"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    if math.isinf(seconds):
        return "over 2.5 s"
    value = seconds * 1000
    return f"{value:.2f} ms" if value < 10 else f"{value:,.0f} ms"


def size(n: float | None) -> str:
    if n is None:
        return MISSING
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


# The numbers render at every refresh of a watched dashboard: written as plain strings, about
# ten times cheaper than elements. Only a view's pattern and a label come from outside the
# dashboard, and `escape` takes them; every other part is its own text or a number.
WARN = ' class="warn"'


def _item(name: str, value: str, metric: str, warn: bool = False) -> str:
    return f'<div{WARN if warn else ""}><dt>{name}</dt><dd id="dash-{metric}">{value}</dd></div>'


def _card(title: str, *parts: str) -> str:
    return f'<section class="card"><h2>{title}</h2>{"".join(parts)}</section>'


def _dl(*items: str) -> str:
    return f"<dl>{''.join(items)}</dl>"


def numbers(readings: Readings) -> Markup:
    """Every number of the dashboard; ids `dash-<metric>` name each value."""
    r = readings
    per_stream = r.open_streams or None
    cards = [
        _card("Writer", _dl(
            _item("commands", rate(r.commands_per_second), "commands-rate"),
            _item("committed", count(r.committed), "committed"),
            _item("failed", count(r.failed), "failed", warn=r.failed > 0),
            _item("repeated", count(r.repeated), "repeated"),
            _item("failed batches", count(r.failed_batches), "failed-batches", warn=r.failed_batches > 0),
            _item("retries", count(r.retries), "retries"),
            _item("queue depth", count(r.queue), "queue"),
            _item("busy", f"{r.busy:.0%}", "busy", warn=r.busy > 0.8),
            _item("batch size", MISSING if r.batch_size is None else f"{r.batch_size:.1f}", "batch-size"),
            _item("commit", ms(r.commit), "commit"),
            _item("idempotency keys", count(r.keys), "keys"),
        )),
        _card("Hub", _dl(
            _item("ticks", rate(r.ticks_per_second), "ticks-rate"),
            _item("tick", ms(r.tick), "tick"),
            _item("late ticks", count(r.late_ticks), "late-ticks", warn=r.late_ticks > 0),
            _item("renders", rate(r.renders_per_second), "renders-rate"),
            _item("unchanged", count(r.unchanged), "unchanged"),
            _item("dirty instances", count(r.dirty), "dirty"),
        )),
        _card("Streams", _streams(r), _dl(
            _item("frames", count(r.frames), "frames"),
            _item("html per frame", size(r.html_per_frame), "html-per-frame"),
            _item("sent per frame", size(r.sent_per_frame), "sent-per-frame"),
            _item("superseded", count(r.superseded), "superseded"),
            _item("send timeouts", count(r.send_timeouts), "send-timeouts", warn=r.send_timeouts > 0),
        )),
        _card("Memory", _dl(
            _item("process", size(r.rss), "rss"),
            _item("process per stream", size(r.rss / per_stream if r.rss and per_stream else None), "rss-per-stream"),
            _item("encoders", size(r.encoder_bytes), "encoder-bytes"),
            _item("encoder per stream", size(r.encoder_bytes / per_stream if per_stream else None),
                  "encoder-per-stream"),
        )),
    ]
    if r.replica_lag is not None or r.replica_restarts is not None:
        cards.append(_card("Replica", _dl(
            _item("lag", ms(r.replica_lag), "replica-lag", warn=(r.replica_lag or 0) > 10),
            _item("restarts", count(r.replica_restarts or 0), "replica-restarts"),
        )))
    if r.accounts_open is not None:
        cards.append(_card("Accounts", _dl(
            _item("open", count(r.accounts_open), "accounts-open"),
            _item("opened", count(r.accounts_opened or 0), "accounts-opened"),
            _item("closed", count(r.accounts_closed or 0), "accounts-closed"),
        )))
    numbers = f'<div id="lith-dashboard-numbers"><div class="cards">{"".join(cards)}</div>'
    return Markup(numbers + _card("Slowest views", _views(r)) + "</div>")


def _row(header: str, *cells: str) -> str:
    tds = "".join(f"<td>{c}</td>" for c in cells)
    return f'<tr><th scope="row">{header}</th>{tds}</tr>'


def _head(*names: str) -> str:
    cells = "".join(f'<th scope="col">{n}</th>' for n in names)
    return f"<thead><tr>{cells}</tr></thead>"


def _streams(r: Readings) -> str:
    states = sorted({state for state, _ in r.streams})
    encodings = sorted({encoding for _, encoding in r.streams})
    rows = "".join(_row(escape(e), *(count(r.streams[state, e]) for state in states)) for e in encodings)
    head = _head("encoding", *(escape(state) for state in states))
    caption = f"<caption>{count(r.open_streams)} open</caption>"
    return f'<table id="dash-streams">{caption}{head}<tbody>{rows}</tbody></table>'


def _views(r: Readings) -> str:
    if not r.views:
        return "<p>No view has rendered yet.</p>"
    rows = "".join(_row(_breakable(v.view), count(v.renders), ms(v.mean), ms(v.most)) for v in r.views[:10])
    return f'<table id="dash-views">{_head("view", "renders", "mean", "max ≤")}<tbody>{rows}</tbody></table>'


def _breakable(pattern: str) -> str:
    """A view's pattern, escaped, that a narrow screen may wrap after each '/'."""
    return "<wbr>/".join(escape(part) for part in pattern.split("/"))


# -- plots --------------------------------------------------------------------------------


def plots(readings: Readings) -> h.Element:
    history = readings.history
    return h.div("#lith-dashboard-plots.plots")[
        _figure("Commit latency, ms", "commit", history, lambda p: (p.commit_mean, p.commit_most)),
        _figure("Tick time, ms", "tick", history, lambda p: (p.tick_mean, p.tick_most)),
    ]


def _figure(
    title: str, name: str, history: Sequence[Point], values: Callable[[Point], tuple[float | None, float | None]]
) -> h.Element:
    minutes = HISTORY * POINT_EVERY / 60
    return h.figure(id=f"dash-plot-{name}", data_points=str(len(history)))[
        h.figcaption[title, h.small[f" one point a second, the last {minutes:.0f} minutes watched"]],
        Markup(_svg(name, history, values)),
    ]


_SCRIPT = re.compile(r"<script\b.*?</script>|<!--.*?-->", re.DOTALL)
_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def _scale(values: Sequence[float]) -> tuple[float, float, list[float]]:
    """A logarithmic axis over `values` (milliseconds): its range and a few round labels, so
    that a mean of a tenth of a millisecond and a worst case of fifty both read."""
    low = max([s for s in _STEPS if s < min(values)] or [_STEPS[0]])
    high = min([s for s in _STEPS if s > max(values)] or [_STEPS[-1]])
    labels = [s for s in _STEPS if low <= s <= high]
    if len(labels) > 5:  # a wide range: from a power of ten to a power of ten, labelled by them
        low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))
        labels = [s for s in _STEPS if low <= s <= high and math.log10(s).is_integer()]
    return low, high, labels


def _svg(
    name: str, history: Sequence[Point], values: Callable[[Point], tuple[float | None, float | None]]
) -> str:
    import pygal  # here: only an app whose dashboard is watched imports it
    from pygal.style import Style

    style = Style(
        background="transparent", plot_background="transparent", foreground="#334155",
        foreground_strong="#0f172a", foreground_subtle="#cbd5e1", colors=("#2563eb", "#f97316"),
        font_family="system-ui, sans-serif", label_font_size=14, major_label_font_size=14,
        legend_font_size=14, opacity="1", opacity_hover="1",
    )
    pairs = [values(p) for p in history]
    means = [None if mean is None else mean * 1000 for mean, _ in pairs]
    worst = [None if most is None or math.isinf(most) else most * 1000 for _, most in pairs]
    seen = [v for v in (*means, *worst) if v is not None and v > 0]
    options = {}
    if seen:
        low, high, labels = _scale(seen)
        # A label right on the range's end is lost to rounding: the range reaches a hair past.
        options = {"logarithmic": True, "range": (low / 1.001, high * 1.001), "y_labels": labels}
    chart = pygal.Line(
        width=400, height=180, style=style, js=[], disable_xml_declaration=True, explicit_size=False,
        show_dots=False, show_x_labels=False, legend_at_bottom=True, legend_at_bottom_columns=2,
        stroke_style={"width": 2}, margin=4, margin_top=12, spacing=6, allow_interruptions=True, truncate_label=-1,
        no_data_text="waiting for a second of data", **options,
    )
    chart.uuid = f"lith-{name}"  # the same id every render: a frame differs by its values only
    if seen:
        chart.add("mean", [v if v is None or v > 0 else None for v in means])
        chart.add("max ≤", worst)
    return _SCRIPT.sub("", chart.render(is_unicode=True))


# -- the page's stylesheet ----------------------------------------------------------------

CSS = """
:root { color-scheme: light; --ink: #0f172a; --muted: #64748b; --line: #e2e8f0; --card: #fff;
  --warn: #b45309; font-family: system-ui, -apple-system, "Segoe UI", sans-serif; }
* { box-sizing: border-box; }
body { margin: 0; padding: 1rem clamp(0.75rem, 3vw, 2rem) 2rem; background: #f1f5f9; color: var(--ink);
  font-size: 15px; line-height: 1.35; }
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 0.25rem 1rem; margin-bottom: 1rem; }
header h1 { font-size: 1.35rem; margin: 0; }
header p { margin: 0; color: var(--muted); overflow-wrap: anywhere; }
.cards, .plots { display: grid; gap: 0.75rem; }
.cards { grid-template-columns: repeat(auto-fit, minmax(min(100%, 15rem), 1fr)); }
#lith-dashboard-numbers { display: grid; gap: 0.75rem; margin-bottom: 0.75rem; }
.plots { grid-template-columns: repeat(auto-fit, minmax(min(100%, 26rem), 1fr)); }
.card, figure { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 0.75rem 1rem;
  margin: 0; min-width: 0; }
h2 { font-size: 0.8rem; text-transform: uppercase; letter-spacing: 0.06em; color: var(--muted); margin: 0 0 0.5rem; }
dl { margin: 0; display: grid; gap: 0.2rem; }
dl div { display: flex; justify-content: space-between; gap: 1rem; border-bottom: 1px dotted var(--line); }
dt { color: var(--muted); }
dd { margin: 0; font-variant-numeric: tabular-nums; font-weight: 600; text-align: right; white-space: nowrap; }
.warn dd { color: var(--warn); }
table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; margin-bottom: 0.5rem; }
caption { text-align: left; color: var(--muted); padding-bottom: 0.25rem; }
th, td { padding: 0.2rem 0.4rem; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th:first-child { text-align: left; font-weight: 500; white-space: normal; overflow-wrap: break-word; }
thead th { color: var(--muted); font-weight: 500; white-space: nowrap; }
figcaption { font-weight: 600; margin-bottom: 0.25rem; }
figcaption small { font-weight: 400; color: var(--muted); }
/* Drawn 400 px wide: its labels read on a phone, and grow no larger than this on a desktop. */
figure svg { display: block; width: 100%; max-width: 32rem; height: auto; margin: 0 auto; }
"""
