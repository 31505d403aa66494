"""Offline exports: one self-contained HTML file for a view or a deck (plotly.js inlined once, no CDN,
no MathJax), and PNG/SVG for single figures through Kaleido where a local Chromium allows it."""

from __future__ import annotations

import html
import logging
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone

import plotly.graph_objects as go

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
section.slide{min-height:80vh} h2{margin-top:0} ul{margin:4px 0 12px}
"""


def html_document(title: str, sections: list[Section], *, slides: bool = False, source: str = "") -> str:
    """The whole export as one HTML string. plotly.js is embedded in the first figure only."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
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
        for fig in sec.figures.values():
            parts.append(fig.to_html(full_html=False, include_plotlyjs=True if first else False,
                                     include_mathjax=False, config={"displaylogo": False}))
            first = False
        parts.append("</section>")
    parts.append("</body></html>")
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


def figure_image(fig: go.Figure, fmt: str = "png", scale: float = 2.0) -> bytes:
    """Render one figure to PNG or SVG bytes with Kaleido, or raise ExportUnavailable with the reason."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"format {fmt!r} is not supported; use 'png' or 'svg'")
    ok, reason = image_export_status()
    if not ok:
        raise ExportUnavailable(reason)
    try:
        return fig.to_image(format=fmt, scale=scale if fmt == "png" else 1)
    except Exception as exc:  # Kaleido/Chromium failures come in many types; report them as one
        logger.warning("image export failed: %s", exc)
        raise ExportUnavailable(f"Kaleido could not render the figure here: {exc}") from exc
