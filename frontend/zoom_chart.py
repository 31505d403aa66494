"""Charts that zoom like a tracker's: a Plotly chart whose dragged x range comes back to Python, so the
page asks the server for that range at full resolution (GET /runs/{id}/metrics?min_step&max_step&
max_points: the server's min/max buckets get finer as the range narrows, W&B's "full fidelity").

Streamlit does not report Plotly's relayout (zoom) events (streamlit #8655), so a small Components v2
element (inline code, no iframe) listens to the `plotly_relayout` event of the chart that
st.plotly_chart drew beside it (found by its key's `st-key-...` class) and sends the new x range;
a double click (autorange) sends None. The chart itself stays an ordinary st.plotly_chart, drawn with
the plotly.js Streamlit ships: nothing is loaded from anywhere else."""

from __future__ import annotations

import functools
import math
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from frontend import components

_JS = """
function attach(chartKey, setStateValue) {
  // Streamlit's class for a keyed element: st-key- and the key with other characters than [A-Za-z0-9_-] as -
  const host = document.querySelector('.st-key-' + chartKey.trim().replace(/[^a-zA-Z0-9_-]/g, '-'));
  const div = host && host.querySelector('.js-plotly-plot');
  if (!div || typeof div.on !== 'function') return;
  const fresh = div.__aahZoom === undefined;
  div.__aahZoom = setStateValue;  // the newest mount's sender
  if (!fresh) return;
  div.on('plotly_relayout', (ev) => {
    if (ev['xaxis.autorange']) return div.__aahZoom('range', null);
    let lo = ev['xaxis.range[0]'], hi = ev['xaxis.range[1]'];
    if (lo === undefined && Array.isArray(ev['xaxis.range'])) [lo, hi] = ev['xaxis.range'];
    if (lo !== undefined && hi !== undefined) div.__aahZoom('range', [Number(lo), Number(hi)]);
  });
  // a drag before this first attach (the chart drew a moment before the listener found it) zoomed the
  // chart locally with no event heard: report that range now, or the coarse overview would pass for it
  const x = div.layout && div.layout.xaxis;
  if (x && x.autorange === false && Array.isArray(x.range) && x.range.length === 2) {
    div.__aahZoom('range', [Number(x.range[0]), Number(x.range[1])]);
  }
}

export default function ({ data, setStateValue }) {
  // the chart is its own element, drawn after this one or redrawn into a new div by a rerun: look for
  // it now and then (a cheap query) and attach once to each div
  attach(data.chart, setStateValue);
  const timer = setInterval(() => attach(data.chart, setStateValue), 300);
  return () => clearInterval(timer);
}
"""

_COMPONENT = st.components.v2.component("aah_zoom_listener", js=_JS)


def step_range(raw: Any) -> tuple[int, int] | None:
    """A zoomed x range as whole steps (floor, ceil), or None for no (or an unusable) range."""
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        return None
    try:
        lo, hi = float(raw[0]), float(raw[1])
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return None
    return max(0, math.floor(lo)), max(0, math.ceil(hi))


def zoomed(name: str) -> tuple[int, int] | None:
    """The step range the user last dragged on the chart `name` (None: not zoomed, or zoomed out)."""
    return step_range((st.session_state.get(f"{name}.zoom") or {}).get("range"))


def _changed() -> None:
    """Nothing to do: the rerun (of the fragment the chart is in) redraws it for the new range."""


def show(fig: go.Figure, name: str) -> None:
    """st.plotly_chart (components.show_figure) plus the listener that reports its zoom (`zoomed`). The
    figure leaves its x range to Plotly: the listener takes a set range on a chart it finds for a zoom."""
    if fig.layout.xaxis.range is not None:
        raise ValueError(f"{name}: a zoomable chart must not set its x range (it would read as the user's zoom)")
    components.show_figure(fig, name)
    _COMPONENT(key=f"{name}.zoom", data={"chart": name}, height=0, on_range_change=functools.partial(_changed))
