"""Pure Plotly figure builders: data in, `go.Figure` out. No Streamlit, no HTTP.

Conventions (shared/reference/dashboard_anchors.md §4): differences on a diverging scale centred at 0;
every axis that shows a coverage says which metric it is. Token x token attention maps are built in
`frontend/attention_figures.py`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from frontend import user_text
from frontend.plans import FULL, Plan, Window, parse_window, window_label, window_order

DIFF_SCALE = "RdBu"
GRID_SCALE = "Viridis"
COVERAGE_LABELS = {
    "acr": "acr (mean w / T)",
    "causal_coverage": "causal_coverage (pairs kept)",
    "tile_coverage": "tile_coverage (tiles touched)",
    "kv_bytes": "KV cache at context T (bytes, one sequence)",
}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def coverage_label(metric: str) -> str:
    return COVERAGE_LABELS.get(metric, metric)


# Legends go below the plot, in rows that wrap: a vertical legend at the right took a 1400 px Compare
# chart down to a 64 px plot (issue 23). Plotly grows the bottom margin to fit it.
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0)


# Every figure names its own template: with streamlit imported, Plotly's default template is
# Streamlit's, whose colourway is placeholders (#000001, ...) that only the dashboard's browser code
# replaces, so an exported deck drew them as near-black/grey (issue 23). Page and deck now draw the
# same colours. Only the trace types the dashboard draws keep plotly_white's trace defaults: Plotly
# validates a figure's whole template each time one is built, and the other 20 types' defaults took
# about a fifth of the time to build the editor's two figures on every click (32.6 -> 25.5 ms).
# Draw a new trace type only after adding it here (tests/frontend/test_figures.py checks).
TRACE_TYPES = ("bar", "heatmap", "scatter", "table")
TEMPLATE = go.layout.Template(layout=pio.templates["plotly_white"].layout,
                              data={t: pio.templates["plotly_white"].data[t] for t in TRACE_TYPES})
TEMPLATE.layout.colorway = PALETTE


def exportable(fig: go.Figure) -> go.Figure:
    """`fig` with TEMPLATE when it still carries Streamlit's placeholder colourway (a figure built
    outside `layout`), so it draws the same colours outside the dashboard."""
    colorway = fig.layout.template.layout.colorway or ()
    if colorway and str(colorway[0]).lower() == "#000001":
        fig = go.Figure(fig).update_layout(template=TEMPLATE)
    return fig


def layout(fig: go.Figure, title: str | None, height: int | None = None, left: int = 50, **kw) -> go.Figure:
    fig.update_layout(title=title, margin=dict(l=left, r=20, t=50 if title else 20, b=40), template=TEMPLATE,
                      uirevision="keep", height=height, legend=LEGEND_BELOW)
    fig.update_layout(**kw)
    return fig


# One window colour scale for every map: log2 of the window on a fixed range, so a colour means the
# same window everywhere (16 is never yellow because it happens to be the widest window of one map).
WINDOW_LOG2_MAX = 14  # windows from 1 to 16384 keys; wider integer windows take the 16384 colour
FULL_Z = WINDOW_LOG2_MAX + 1  # full causal attention: the top colour, one step above the widest integer
WINDOW_TICKS = list(range(0, WINDOW_LOG2_MAX + 1, 2)) + [FULL_Z]


def window_z(w: Window, seq_len: int | None = None) -> float:
    """A window's position on the colour scale: log2(w) clipped to [0, WINDOW_LOG2_MAX], full on top.
    For a model of context `seq_len`, the scale is the model's own: 1 .. T, where a window of T keys or
    more is full (the top), so a T=256 model's colour bar does not run to 16384."""
    if seq_len is not None:
        top = math.log2(max(seq_len, 2))
        return top if w is None else min(math.log2(max(int(w), 1)), top)
    return float(FULL_Z) if w is None else min(math.log2(max(int(w), 1)), float(WINDOW_LOG2_MAX))


def _window_scale(seq_len: int | None) -> tuple[float, list[float], list[str]]:
    """(zmax, tick positions, tick labels) of the window colour bar, for a model's context or the fixed scale."""
    if seq_len is None:
        return FULL_Z, list(WINDOW_TICKS), [FULL if z == FULL_Z else str(2 ** z) for z in WINDOW_TICKS]
    top = window_z(None, seq_len)
    ticks = [float(z) for z in range(0, math.ceil(top), 2 if top > 8 else 1) if z < top]
    return top, ticks + [top], [str(2 ** int(z)) for z in ticks] + [f"{FULL} (≥{seq_len})"]


def _cell_rect(row: int, col: int, xref: str = "x", yref: str = "y", color: str = "#ff2d55",
               width: float = 3) -> dict:
    return dict(type="rect", xref=xref, yref=yref, x0=col - 0.5, x1=col + 0.5, y0=row - 0.5, y1=row + 0.5,
                line=dict(color=color, width=width), fillcolor="rgba(0,0,0,0)")


def _grid_trace(plan: Plan, show_scale: bool = True, hover_prefix: str = "", seq_len: int | None = None) -> go.Heatmap:
    n_layer, n_head = len(plan), len(plan[0])
    z = [[window_z(w, seq_len) for w in row] for row in plan]
    text = [[window_label(w) for w in row] for row in plan]
    zmax, ticks, labels = _window_scale(seq_len)
    return go.Heatmap(
        z=z, x=list(range(n_head)), y=list(range(n_layer)), text=text, texttemplate="%{text}",
        colorscale=GRID_SCALE, zmin=0, zmax=zmax, xgap=2, ygap=2, showscale=show_scale,
        colorbar=dict(title="window (log₂)", tickvals=ticks, ticktext=labels),
        hovertemplate=hover_prefix + "layer %{y}, head %{x}<br>window %{text}<extra></extra>",
    )


def _grid_axes(fig: go.Figure, n_layer: int, n_head: int, row: int | None = None, col: int | None = None) -> None:
    fig.update_xaxes(tickvals=list(range(n_head)), ticktext=[f"H{h}" for h in range(n_head)],
                     side="top", showgrid=False, zeroline=False, row=row, col=col)
    fig.update_yaxes(title="layer", tickvals=list(range(n_layer)), ticktext=[f"L{l}" for l in range(n_layer)],
                     autorange="reversed", showgrid=False, zeroline=False, row=row, col=col)


def window_grid_figure(plan: Plan, *, changed: list[list[bool]] | None = None,
                       selected: tuple[int, int] | None = None, title: str | None = None,
                       clickable: bool = False, seq_len: int | None = None) -> go.Figure:
    """The layer x head window map: one cell per head coloured by its window on the log scale
    (`window_z`, full = the top colour; with `seq_len`, the model's own 1 .. T),
    layer 0 on top. `changed` cells are outlined in red, the `selected` cell in black. With `clickable`,
    an invisible marker sits on every cell: Plotly reports clicks on points, not on heatmap cells."""
    n_layer, n_head = len(plan), len(plan[0])
    fig = go.Figure(_grid_trace(plan, seq_len=seq_len))
    if clickable:
        cells = [(l, h) for l in range(n_layer) for h in range(n_head)]
        fig.data[0].hoverinfo = "skip"
        fig.add_trace(go.Scatter(
            x=[h for _, h in cells], y=[l for l, _ in cells], mode="markers", showlegend=False, name="cells",
            text=[window_label(plan[l][h]) for l, h in cells],
            marker=dict(size=36, symbol="square", color="rgba(0,0,0,0)", opacity=0.01),
            unselected=dict(marker=dict(opacity=0.01)), selected=dict(marker=dict(opacity=0.01)),
            hovertemplate="layer %{y}, head %{x}<br>window %{text}<extra>click to pick</extra>"))
    _grid_axes(fig, n_layer, n_head)
    shapes = [_cell_rect(l, h) for l in range(n_layer) for h in range(n_head) if changed and changed[l][h]]
    if selected is not None:
        shapes.append(_cell_rect(selected[0], selected[1], color="#000000", width=4))
    fig.update_layout(shapes=shapes)
    return layout(fig, title, height=max(220, 60 * n_layer + 90))


def window_diff_figure(a: Plan, b: Plan, changed: list[list[bool]], names: tuple[str, str] = ("A", "B")) -> go.Figure:
    """Two window maps side by side on one colour scale, the cells that differ outlined in both."""
    n_layer, n_head = len(a), len(a[0])
    fig = make_subplots(rows=1, cols=2, subplot_titles=names, horizontal_spacing=0.12)
    fig.add_trace(_grid_trace(a, hover_prefix=f"{names[0]}: "), row=1, col=1)
    fig.add_trace(_grid_trace(b, show_scale=False, hover_prefix=f"{names[1]}: "), row=1, col=2)
    for c in (1, 2):
        _grid_axes(fig, n_layer, n_head, row=1, col=c)
    shapes = []
    for l in range(n_layer):
        for h in range(n_head):
            if changed[l][h]:
                shapes += [_cell_rect(l, h, "x", "y"), _cell_rect(l, h, "x2", "y2")]
    fig.update_layout(shapes=shapes)
    n = sum(map(sum, changed))
    return layout(fig, f"window maps: {n} head(s) differ", height=max(260, 60 * n_layer + 120))


def _window_x(w: Window, seq_len: int) -> int:
    return seq_len if w is None else min(int(w), seq_len)


def retained_mass_figure(buckets: Sequence[Window], mass: Sequence[float], window: Window, seq_len: int,
                         *, title: str | None = None, tau: float | None = None) -> go.Figure:
    """Mass within the last w keys against w (full = seq_len), the head's assigned window marked.
    The log x axis spans exactly 1..seq_len: the model's context, nothing beyond it."""
    xs = [_window_x(b, seq_len) for b in buckets]
    fig = go.Figure(go.Scatter(x=xs, y=list(mass), mode="lines+markers", name="retained mass",
                               text=[window_label(b) for b in buckets], cliponaxis=False,
                               hovertemplate="window %{text}: %{y:.3f}<extra></extra>"))
    # a line trace, not add_vline: a shape's annotation on a log axis takes its x as log10(x), which
    # put "assigned full" (x=256) at 10^256 and stretched the axis to match
    assigned = _window_x(window, seq_len)
    fig.add_trace(go.Scatter(x=[assigned, assigned], y=[0, 1], mode="lines", name=f"assigned {window_label(window)}",
                             line=dict(color="#e4572e", dash="dash"), hoverinfo="skip"))
    if tau is not None:
        fig.add_trace(go.Scatter(x=[1, seq_len], y=[tau, tau], mode="lines", name=f"τ = {tau:g}",
                                 line=dict(color="#888888", dash="dot"), hoverinfo="skip"))
    fig.update_xaxes(title=f"window w (keys, log scale; the model's context is {seq_len})", type="log",
                     range=[0, math.log10(seq_len)])
    fig.update_yaxes(title="attention mass within w keys", range=[0, 1.02])
    return layout(fig, title or "retained mass vs window", height=360)


def sensitivity_figure(delta: Sequence[Sequence[Sequence[float]]], buckets: Sequence[Window], k: int) -> go.Figure:
    """Layer x head heatmap of the loss increase when one head alone is set to `buckets[k]`."""
    z = np.array([[row[k] for row in layer] for layer in delta], dtype=float)
    m = float(np.nanmax(np.abs(z))) if z.size and np.isfinite(z).any() else 1.0
    n_layer, n_head = z.shape
    fig = go.Figure(go.Heatmap(z=z, x=list(range(n_head)), y=list(range(n_layer)), colorscale=DIFF_SCALE,
                               reversescale=True, zmid=0, zmin=-m or -1, zmax=m or 1, texttemplate="%{z:.3f}",
                               colorbar=dict(title="Δloss (nats)"),
                               hovertemplate="layer %{y}, head %{x}: Δloss %{z:.4f}<extra></extra>"))
    _grid_axes(fig, n_layer, n_head)
    return layout(fig, f"sensitivity: Δloss with one head at window {window_label(buckets[k])}",
                   height=max(240, 60 * n_layer + 100))


def token_delta_figure(tokens: Sequence[str], delta: Sequence[float | None]) -> go.Figure:
    """A one-row strip of per-token Δloss (red = the edit made that token harder to predict)."""
    z = np.array([[np.nan if v is None else float(v) for v in delta]])
    finite = np.abs(z[np.isfinite(z)])
    m = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(tokens))), y=[0], customdata=[list(tokens)],
                               colorscale=DIFF_SCALE, reversescale=True, zmid=0, zmin=-m, zmax=m,
                               colorbar=dict(title="Δloss", thickness=10),
                               hovertemplate="(%{x}) %{customdata}<br>Δloss %{z:.4f}<extra></extra>"))
    fig.update_yaxes(visible=False)
    fig.update_xaxes(title="token position in the evaluation text")
    return layout(fig, "per-token Δloss vs the model's own plan", height=170)


def loss_coverage_figure(metric: str, eval_set: str, curve: Sequence[dict] = (), live: dict | None = None,
                         baseline: dict | None = None, rounded: Sequence[dict] = ()) -> go.Figure:
    """Loss on one eval set against a coverage metric, for plans of one model: the allocator's path,
    the model's own plan, the current (unsaved) edit and its roundings to serving grains. Only points
    measured on the same eval set share this axis; each trace is named by its source and that eval set.
    Points: dicts with x, y (rounded ones also a label)."""
    fig = go.Figure()
    if rounded:
        fig.add_trace(go.Scatter(x=[p["x"] for p in rounded], y=[p["y"] for p in rounded], mode="markers+text",
                                 text=[p["label"] for p in rounded], textposition="top center",
                                 name=f"rounded to serving grains · eval {eval_set}",
                                 marker=dict(color="#7f7f7f", size=9, symbol="diamond")))
    if curve:
        fig.add_trace(go.Scatter(x=[p["x"] for p in curve], y=[p["y"] for p in curve], mode="lines+markers",
                                 name=f"allocation curve · eval {eval_set}", line=dict(color="#2ca02c")))
    for point, name, color, symbol in ((baseline, "model's own plan", "#1f77b4", "circle"),
                                       (live, "current edit", "#e4572e", "star")):
        if point:
            fig.add_trace(go.Scatter(x=[point["x"]], y=[point["y"]], mode="markers", name=f"{name} · eval {eval_set}",
                                     marker=dict(color=color, size=16, symbol=symbol)))
    # coverages are fractions (0..1); kv_bytes is an absolute size, so its axis starts at 0 and scales
    fig.update_xaxes(title=coverage_label(metric), range=None if metric == "kv_bytes" else [0, 1.05],
                     rangemode="tozero")
    fig.update_yaxes(title=f"loss on eval set {eval_set} (nats)")
    return layout(fig, f"loss vs {metric} · eval set {eval_set}", height=360)


def runs_coverage_figure(metric: str, runs: Sequence[dict]) -> go.Figure:
    """Stored runs' own validation loss against a coverage metric, one trace per group of comparable
    runs (`group`: the model shape or source), so no run sits on an axis with incomparable points."""
    fig = go.Figure()
    groups: dict[str, list[dict]] = {}
    for p in runs:
        groups.setdefault(p.get("group", "runs"), []).append(p)
    for i, (group, points) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(x=[p["x"] for p in points], y=[p["y"] for p in points], mode="markers",
                                 name=f"{user_text.svg(group)} · val_loss (each run's validation set)",
                                 text=[user_text.svg(p.get("name", "")) for p in points],
                                 marker=dict(color=PALETTE[i % len(PALETTE)], size=9),
                                 hovertemplate="%{text}<br>%{x:.3f}, %{y:.4f}<extra></extra>"))
    fig.update_xaxes(title=coverage_label(metric), range=[0, 1.05])
    fig.update_yaxes(title="val_loss (nats, the run's own validation set)")
    return layout(fig, f"stored runs: val_loss vs {metric}", height=360)


def cost_summary(result: dict) -> str:
    """'KV cache X % of full · attention pairs Y % of full' from an answer with the exact cost fields."""
    kv = 100.0 * result["kv_bytes"] / result["kv_bytes_full"]
    pairs = 100.0 * result["attention_pairs"] / result["attention_pairs_full"]
    return f"KV cache {kv:.1f} % of full · attention pairs {pairs:.1f} % of full"


def kv_group_note(plan: Plan, own: Plan, n_kv_head: int) -> str | None:
    """Why edits leave the KV cache as it was, for grouped-query attention: the edited heads whose window
    is below the widest of their KV group (a KV head keeps its group's widest window, so narrowing one
    query head saves no memory). None when there are none, or every query head has its own KV head."""
    n_head = len(plan[0])
    if n_kv_head >= n_head:
        return None
    g = n_head // n_kv_head
    wide = lambda w: math.inf if w is None else w  # noqa: E731 (full is the widest)
    wasted = [f"L{l}H{h}" for l, row in enumerate(plan) for h, w in enumerate(row)
              if w != own[l][h] and wide(w) < max(wide(x) for x in row[h // g * g:(h // g + 1) * g])]
    if not wasted:
        return None
    return (f"{', '.join(wasted[:4])}{' and others' if len(wasted) > 4 else ''}: this edit cannot shrink the KV "
            f"cache: {g} query heads share each KV head (the grey bars on the window map), and a KV head keeps "
            "the widest window of its group, so the group's other heads still need it. Shrink the whole group "
            "to save memory.")


def cache_growth_figure(series: dict[str, tuple[Sequence[int], Sequence[int]]],
                        full: tuple[Sequence[int], Sequence[int]] | None = None) -> go.Figure:
    """KV-cache bytes held against the context as tokens are generated, one line per plan; `full` (the
    full plan's, which grows by the same bytes every position) dashed for reference."""
    fig = go.Figure()
    for i, (name, (positions, sizes)) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(positions), y=list(sizes), mode="lines", name=name,
                                 line=dict(color=PALETTE[i % len(PALETTE)])))
    if full is not None:
        fig.add_trace(go.Scatter(x=list(full[0]), y=list(full[1]), mode="lines", name="full plan",
                                 line=dict(color="#9e9e9e", dash="dash")))
    fig.update_xaxes(title="context (tokens cached when each new token is predicted)")
    fig.update_yaxes(title="KV cache (bytes)", rangemode="tozero")
    return layout(fig, "KV cache as the continuation grows", height=300)


def ema(values: Sequence[float | None], smoothing: float) -> list[float | None]:
    """Exponential moving average with debiasing (so the start is not pulled towards 0); None stays
    None and does not update the average. smoothing=0 returns the values unchanged."""
    if smoothing <= 0:
        return list(values)
    out: list[float | None] = []
    acc, weight = 0.0, 0.0
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        acc = smoothing * acc + (1 - smoothing) * v
        weight = smoothing * weight + (1 - smoothing)
        out.append(acc / weight)
    return out


DENSE_POINTS = 50  # a series with at least this many points may get an EMA overlay; sparser ones never

# A NaN or an inf has no height: the API sends its kind ("nan", "inf", "-inf") and lists each series'
# non-finite points apart (also those a downsampled read left out). They are drawn as markers on the
# plot's top edge (NaN, +inf) or bottom edge (-inf), on a hidden 0..1 axis over the value axis.
NONFINITE = {"nan": ("NaN", "x", 0.97), "inf": ("+inf", "triangle-up", 0.97), "-inf": ("-inf", "triangle-down", 0.03)}
NonFinitePoints = Sequence[tuple[int, str]]  # (step, kind)


def finite(values: Sequence[float | str | None]) -> list[float | None]:
    """Values to draw as a line: a non-finite one (its kind, or a float NaN/inf) is a gap."""
    return [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None for v in values]


def nonfinite_points(series: dict) -> NonFinitePoints:
    """A series' (step, kind) list from an API series (its ``nonfinite`` field)."""
    listed = series.get("nonfinite") or {}
    return list(zip(listed.get("step", []), listed.get("kind", [])))


def add_nonfinite_markers(fig: go.Figure, points: dict[str, NonFinitePoints], colors: dict[str, str]) -> go.Figure:
    """Mark each series' non-finite points at their steps; the hover says what they are ("NaN at step
    1200 · val_loss"). Call after the value axis is set up: the markers get an axis of their own."""
    drawn = False
    for name, pts in points.items():
        if not pts:
            continue
        drawn = True
        fig.add_trace(go.Scatter(
            x=[step for step, _ in pts], y=[NONFINITE[kind][2] for _, kind in pts], yaxis="y2", mode="markers",
            name=f"{user_text.svg(name)}: NaN/inf", legendgroup=name, hoverinfo="text",
            hovertext=[f"{NONFINITE[kind][0]} at step {step} · {user_text.svg(name)}" for step, kind in pts],
            marker=dict(symbol=[NONFINITE[kind][1] for _, kind in pts], size=11, color=colors.get(name, "#000000"),
                        line=dict(width=1.5, color="#000000"))))
    if drawn:
        fig.update_layout(yaxis2=dict(overlaying="y", range=[0, 1], visible=False, fixedrange=True))
    return fig


def axis_title(keys: Sequence[str]) -> str:
    """A y axis title that names what is plotted ("val_loss · train_loss"), never a bare "value"."""
    keys = list(dict.fromkeys(keys))
    return " · ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")


def metric_curves_figure(series: dict[str, tuple[Sequence[int], Sequence[float | None]]], smoothing: float,
                         *, y_title: str | None = None, title: str | None = None,
                         y_range: tuple[float, float] | None = None,
                         nonfinite: dict[str, NonFinitePoints] | None = None) -> go.Figure:
    """Curves by step, each drawn raw (line and points: the last point is the stored last value).
    A dense series (>= DENSE_POINTS points, e.g. train_loss logged every step) also gets an EMA overlay
    of the same colour, named as such; sparse ones (eval series) are never smoothed. ``nonfinite``
    (per series name) marks its NaN and inf points. Names and titles (run names, metric keys) are
    shown as text."""
    fig = go.Figure()
    colors = {}
    for i, (name, (steps, values)) in enumerate(series.items()):
        color = colors[name] = PALETTE[i % len(PALETTE)]
        values = finite(values)
        dense = len(steps) >= DENSE_POINTS
        smooth = dense and smoothing > 0
        fig.add_trace(go.Scatter(x=list(steps), y=list(values), name=user_text.svg(name), legendgroup=name,
                                 mode="lines" if dense else "lines+markers", connectgaps=True,
                                 line=dict(color=color, width=1 if smooth else 2), marker=dict(color=color, size=6),
                                 opacity=0.35 if smooth else 1.0))
        if smooth:
            fig.add_trace(go.Scatter(x=list(steps), y=ema(values, smoothing),
                                     name=f"{user_text.svg(name)} (EMA {smoothing:g})",
                                     mode="lines", line=dict(color=color, width=2.5), legendgroup=name,
                                     connectgaps=True, hovertemplate="%{y:.4g} (smoothed)<extra></extra>"))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=user_text.svg(y_title or axis_title(list(series))), range=list(y_range) if y_range else None)
    add_nonfinite_markers(fig, nonfinite or {}, colors)
    return layout(fig, title and user_text.svg(title), height=360)


def window_fraction_figure(series: dict[str, tuple[Sequence[int], Sequence[float | None]]]) -> go.Figure:
    """Stacked areas of the share of heads at each window over training (keys `window_frac/<bucket>`)."""
    fig = go.Figure()
    labels = sorted(series, key=lambda label: window_order(parse_window(label)))
    # each window in its colour on the window maps' scale, so an area and a map cell agree
    colors = sample_colorscale(GRID_SCALE, [window_z(parse_window(b)) / FULL_Z for b in labels])
    for label, color in zip(labels, colors):
        steps, values = series[label]
        fig.add_trace(go.Scatter(x=list(steps), y=finite(values), mode="lines", stackgroup="frac",
                                 name=f"window {label}", line=dict(width=0.5, color=color), fillcolor=color))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="share of heads", range=[0, 1])
    return layout(fig, "window fractions over training", height=340)
