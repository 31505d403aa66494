"""Number badges (label, big value, coloured delta) drawn as one Markdown block, in place of st.metric.

Why not st.metric: Streamlit loads each element type's code on its first use, and st.metric's (Metric,
numbro, the theme and Vega loaders: seven files from the Python server) was what a new session's loss
waited for. Markdown's code is in Streamlit's entry bundle, so the badges draw with the first run:
cold open -> first loss 0.89 s -> 0.55 s after the WebSocket opens (median of 5 traced opens each,
alternating; bench/ui.py measures it). The HTML is built here from our own numbers only, escaped."""

from __future__ import annotations

import html
from dataclasses import dataclass

import streamlit as st

# Streamlit's own delta colours (light and dark themes alike)
GOOD, BAD = "#09ab3b", "#ff2b2b"


@dataclass(frozen=True)
class Badge:
    label: str
    value: str
    delta: str | None = None  # e.g. "+0.12 %"; its sign picks the arrow
    lower_is_better: bool = False  # st.metric's delta_color="inverse": a rise is drawn red
    help: str | None = None  # shown on hovering the label


def _delta_html(b: Badge) -> str:
    """The delta's line, always there (empty without a delta), so a delta that appears moves nothing."""
    if not b.delta:
        return '<div class="aah-delta" style="height:1.3rem"></div>'
    rising = not b.delta.lstrip().startswith("-")
    colour = BAD if rising == b.lower_is_better else GOOD
    arrow = "▲" if rising else "▼"
    return f'<div class="aah-delta" style="color:{colour};font-size:0.875rem;height:1.3rem">{arrow} {html.escape(b.delta)}</div>'


def badge_html(b: Badge) -> str:
    """One badge: the label (its help as a tooltip), the value, and the delta if any."""
    tip = f' title="{html.escape(b.help)}" style="text-decoration:underline dotted"' if b.help else ""
    return (f'<div class="aah-badge" data-label="{html.escape(b.label)}" style="flex:1;min-width:0">'
            f'<div style="font-size:0.875rem"><span{tip}>{html.escape(b.label)}</span></div>'
            f'<div class="aah-value" style="font-size:2.25rem;line-height:1.25">{html.escape(b.value)}</div>'
            f'{_delta_html(b)}</div>')


def row_html(badges: list[Badge]) -> str:
    """The badges side by side, in equal columns (as st.columns + st.metric laid them out)."""
    cells = "".join(badge_html(b) for b in badges)
    return f'<div class="aah-badges" style="display:flex;gap:1rem">{cells}</div>'


def show(badges: list[Badge]) -> None:
    st.markdown(row_html(badges), unsafe_allow_html=True)  # our numbers and labels only, escaped
