"""Offline exports: one self-contained HTML file for a view or a deck (plotly.js inlined once, no CDN,
no MathJax), and PNG/SVG for single figures through Kaleido where a local Chromium allows it."""

from __future__ import annotations

import html
import logging
import shutil
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

import plotly.graph_objects as go

from frontend.figures import exportable

logger = logging.getLogger(__name__)


@dataclass
class Section:
    """One slide or view: a title, optional lines of text (metrics, provenance) and figures."""

    title: str
    figures: dict[str, go.Figure] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;background:#fafafa;color:#222}
header{padding:16px 32px;background:#1f3a5f;color:#fff} header small{opacity:.8}
section{background:#fff;margin:24px 32px;padding:16px 24px;border-radius:8px;box-shadow:0 1px 3px #0002}
h2{margin-top:0} ul{margin:4px 0 12px}
html.deck{scroll-snap-type:y mandatory} html.deck header{display:none}
section.slide{height:100vh;box-sizing:border-box;margin:0;border-radius:0;box-shadow:none;overflow:hidden;
  scroll-snap-align:start;display:flex;flex-direction:column;page-break-after:always;break-after:page}
section.slide .figs{flex:1;min-height:0;display:grid;gap:8px} section.slide .figs>div{height:100%;min-height:0}
"""
# A deck: arrow keys, PageUp/PageDown and space move one slide (one screen) at a time. Inline, no src.
_DECK_JS = """<script>
document.addEventListener('keydown', function (e) {
  var fwd = ['ArrowRight', 'ArrowDown', 'PageDown', ' '], back = ['ArrowLeft', 'ArrowUp', 'PageUp'];
  if (fwd.indexOf(e.key) < 0 && back.indexOf(e.key) < 0) return;
  var slides = Array.prototype.slice.call(document.querySelectorAll('section.slide'));
  var now = Math.round(window.scrollY / window.innerHeight);
  var next = Math.max(0, Math.min(slides.length - 1, now + (fwd.indexOf(e.key) >= 0 ? 1 : -1)));
  slides[next].scrollIntoView(); e.preventDefault();
});
</script>"""


def slide_columns(n: int) -> int:
    """The figures a row of a slide holds (Present and the deck lay them out alike)."""
    return _slide_grid(n)[0]


def _slide_grid(n: int) -> tuple[int, int]:
    """(columns, rows) that put n figures on one screen: up to 4 two a row, more three a row."""
    cols = 1 if n <= 1 else 2 if n <= 4 else 3
    return cols, max(1, -(-n // cols))


SCREEN_PX = 1100  # the screen a slide must fit (issue 23)
SLIDE_CHROME_PX = 330  # room for Present's title, slide buttons and header (an allowance, not measured)
LINE_PX = 34  # one line of text under the slide's header


def slide_figure_height(n_figures: int, n_lines: int) -> int:
    """Each figure's height on Present so that the slide's figures (`slide_columns` a row) and lines fit
    SCREEN_PX."""
    _, rows = _slide_grid(n_figures)
    return max(180, (SCREEN_PX - SLIDE_CHROME_PX - LINE_PX * n_lines) // rows - 16)


TABLE_ROW_PX = 35  # a slide table's rows, as Present passes them to st.dataframe (its default row height)


def slide_table_height(rows: int, height: int) -> int | str:
    """A slide table's height for st.dataframe: its own rows' ("content": no empty grid rows below a short
    table), or the slide's `height` (scrolling inside) when its header, rows and border would not fit."""
    return "content" if (rows + 1) * TABLE_ROW_PX + 3 <= height else height


def html_document(title: str, sections: list[Section], *, slides: bool = False, source: str = "") -> str:
    """The whole export as one HTML string. plotly.js is embedded in the first figure only."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<!DOCTYPE html><html{' class=deck' if slides else ''}><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1><small>AAH Studio export, {stamp}"
        f"{' · ' + html.escape(source) if source else ''} · opens offline</small></header>",
    ]
    first = True
    for i, sec in enumerate(sections):
        parts.append(f"<section class='{'slide' if slides else 'view'}' id='s{i + 1}'>")
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.lines:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in sec.lines) + "</ul>")
        cols, rows = _slide_grid(len(sec.figures))
        if slides:  # every figure sized to its share of the screen, so a slide is one screen
            parts.append(f"<div class='figs' style='grid-template-columns:repeat({cols},1fr);"
                         f"grid-template-rows:repeat({rows},1fr)'>")
        for fig in sec.figures.values():
            fig = exportable(fig)
            if slides:
                fig = go.Figure(fig).update_layout(height=None, width=None, autosize=True)
            parts.append(fig.to_html(full_html=False, include_plotlyjs=True if first else False,
                                     include_mathjax=False, config={"displaylogo": False, "responsive": True}))
            first = False
        if slides:
            parts.append("</div>")
        parts.append("</section>")
    parts.append((_DECK_JS if slides else "") + "</body></html>")
    return "\n".join(parts)


def image_export_status() -> tuple[bool, str]:
    """Whether PNG/SVG export can work here, and why not if it cannot."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False, "PNG/SVG export needs the 'kaleido' package, which is not installed here"
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "chrome")):
        return False, "PNG/SVG export needs a local Chromium or Chrome (Kaleido drives it); none was found"
    return True, "ok"


class ExportUnavailable(RuntimeError):
    """PNG/SVG export cannot run in this environment; the message says why."""


# Kaleido bounds the drawing itself (90 s), not its Chromium's start, its tab or its close: under load a
# render was seen waiting in one of those for good (a test stopped by its 600 s timeout), and the page with it.
RENDER_DEADLINE_S = 120.0


def figure_image(fig: go.Figure, fmt: str = "png", scale: float = 2.0) -> bytes:
    """Render one figure to PNG or SVG bytes with Kaleido, or raise ExportUnavailable with the reason (also
    when no image came within RENDER_DEADLINE_S)."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"format {fmt!r} is not supported; use 'png' or 'svg'")
    ok, reason = image_export_status()
    if not ok:
        raise ExportUnavailable(reason)
    images: list[bytes] = []
    errors: list[Exception] = []

    def render() -> None:
        try:
            images.append(fig.to_image(format=fmt, scale=scale if fmt == "png" else 1))
        except Exception as exc:  # Kaleido/Chromium failures come in many types; report them as one
            errors.append(exc)

    # a daemon thread: one that never returns is left behind instead of holding the page
    worker = threading.Thread(target=render, name="aah-image-export", daemon=True)
    worker.start()
    worker.join(RENDER_DEADLINE_S)
    if images:
        return images[0]
    if not errors:
        logger.warning("image export gave no image within %.0f s", RENDER_DEADLINE_S)
        raise ExportUnavailable(f"Kaleido gave no image within {RENDER_DEADLINE_S:.0f} s (its Chromium did not "
                                "answer; the machine may be busy). Try again, or use the HTML export.")
    logger.warning("image export failed: %s", errors[0])
    raise ExportUnavailable(f"Kaleido could not render the figure here: {errors[0]}") from errors[0]
