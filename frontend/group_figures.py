"""Pure Plotly builders for groups of seeds: a group's curve as its mean with a shaded band (±1 sample
std, or min–max), and the reproduction view (our rows with error bars beside the paper's reported rows)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from frontend import user_text
from frontend.figures import DENSE_POINTS, PALETTE, add_nonfinite_markers, ema, finite, layout, nonfinite_points

BANDS = {"std": "mean ± 1 std", "minmax": "mean, min–max"}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def band_edges(curve: Mapping[str, Sequence[Any]], band: str) -> tuple[list, list]:
    """(lower, upper) of the band at each step; a step without a std (one run) has no band (None)."""
    if band == "minmax":
        return list(curve["min"]), list(curve["max"])
    lo, hi = [], []
    for mean, std in zip(curve["mean"], curve["std"]):
        ok = mean is not None and std is not None
        lo.append(mean - std if ok else None)
        hi.append(mean + std if ok else None)
    return lo, hi


def _smoothed(values: Sequence[Any], smoothing: float) -> list:
    """EMA of a dense series (as metric_curves_figure: >= DENSE_POINTS points); sparse ones stay raw."""
    return ema(list(values), smoothing) if smoothing > 0 and len(values) >= DENSE_POINTS else list(values)


def group_band_figure(curves: Mapping[str, Mapping[str, Sequence[Any]]], band: str = "std", *,
                      title: str | None = None, y_title: str,
                      overlay: Mapping[str, tuple[Sequence[int], Sequence[float | None]]] | None = None,
                      overlay_of: Mapping[str, str] | None = None, smoothing: float = 0.0,
                      y_range: tuple[float, float] | None = None) -> go.Figure:
    """Each group's mean (line) with its band shaded (`band`: "std" or "minmax"), named with the number
    of runs; `overlay` adds single runs as dotted lines, each in the colour of the curve `overlay_of`
    names for it (e.g. this run's val_loss in the colour of its group's val_loss). Every band is drawn
    before every line, so no band hides a line. With `smoothing`, dense series (mean, band edges,
    overlays) are drawn as their EMA, as the page's other curves. Each run's NaN and inf points (which
    the mean leaves out) are marked in the group's colour."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {sorted(BANDS)}; got {band!r}")
    fig = go.Figure()
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(curves)}
    marks: dict[str, list] = {}
    mark_colors: dict[str, str] = {}
    ema_note = f", EMA {smoothing:g}" if smoothing > 0 else ""
    for name, curve in curves.items():
        for run_id, listed in (curve.get("nonfinite") or {}).items():
            label = f"{name} · run #{run_id}"
            marks[label], mark_colors[label] = nonfinite_points({"nonfinite": listed}), colors[name]
        steps = list(curve["step"])
        lo, hi = (_smoothed(edge, smoothing) for edge in band_edges(curve, band))
        fig.add_trace(go.Scatter(x=steps, y=hi, mode="lines", line=dict(width=0), showlegend=False,
                                 legendgroup=name, hoverinfo="skip", connectgaps=False))
        fig.add_trace(go.Scatter(x=steps, y=lo, mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor=_rgba(colors[name], 0.22), name=f"{user_text.svg(name)} band",
                                 legendgroup=name,
                                 showlegend=False, hoverinfo="skip", connectgaps=False))
    for name, curve in curves.items():
        n = max(curve.get("n") or [0])
        dense = smoothing > 0 and len(curve["step"]) >= DENSE_POINTS
        fig.add_trace(go.Scatter(x=list(curve["step"]), y=_smoothed(curve["mean"], smoothing), mode="lines",
                                 name=f"{user_text.svg(name)} ({BANDS[band]}{ema_note if dense else ''}, n={n})",
                                 legendgroup=name,
                                 line=dict(color=colors[name], width=2.5), customdata=list(curve.get("n") or []),
                                 hovertemplate="step %{x}: mean %{y:.4g} over %{customdata} runs<extra></extra>"))
    for name, (steps, values) in (overlay or {}).items():
        dense = smoothing > 0 and len(steps) >= DENSE_POINTS
        color = colors.get((overlay_of or {}).get(name, ""), "#333333")
        fig.add_trace(go.Scatter(x=list(steps), y=_smoothed(finite(values), smoothing), mode="lines",
                                 name=user_text.svg(name) + (f" (EMA {smoothing:g})" if dense else ""),
                                 connectgaps=True, line=dict(color=color, width=1.5, dash="dot")))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=user_text.svg(y_title), range=list(y_range) if y_range else None)
    add_nonfinite_markers(fig, marks, mark_colors)
    return layout(fig, title and user_text.svg(title), height=380)


def reproduction_figure(ours: Sequence[Mapping[str, Any]], paper: Sequence[Mapping[str, Any]], *, y_title: str,
                        ours_label: str, paper_label: str, ratio: bool = False) -> go.Figure:
    """Two panels with the same rows on x: ours (mean ± 1 sample std over seeds, as error bars) and the
    paper's (one seed: a point, no error bar). Separate y axes: the two scales' losses are not comparable;
    ratios (`ratio`, e.g. acr) share the 0..1 range. In the panel titles a label's parts after the second
    (" · "-separated) go to lines of their own: the two titles sit side by side."""
    titles = tuple(" · ".join(p[:2]) + "".join(f"<br>{x}" for x in p[2:])
                   for p in (ours_label.split(" · "), paper_label.split(" · ")))
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(
        x=[r["row"] for r in ours], y=[r["mean"] for r in ours], mode="markers", name="ours (mean ± std)",
        marker=dict(color=PALETTE[0], size=10),
        error_y=dict(type="data", array=[r["std"] or 0.0 for r in ours], visible=True, thickness=1.5, width=6),
        customdata=[[r["n"], r["std"]] for r in ours],
        hovertemplate="%{x}: %{y:.4f} ± %{customdata[1]:.4f} over %{customdata[0]} seeds<extra>ours</extra>"),
        row=1, col=1)
    fig.add_trace(go.Scatter(
        x=[r["row"] for r in paper], y=[r["mean"] for r in paper], mode="markers", name="paper (1 seed)",
        marker=dict(color=PALETTE[1], size=10, symbol="diamond"),
        hovertemplate="%{x}: %{y:.4f} (reported, one seed)<extra>paper</extra>"), row=1, col=2)
    for col in (1, 2):
        fig.update_yaxes(title_text=y_title if col == 1 else None, row=1, col=col,
                         range=[0, 1.05] if ratio else None)
        fig.update_xaxes(tickangle=-30, row=1, col=col)
    fig.update_annotations(font_size=12)
    layout(fig, f"reproduction · {y_title}: ours (left) beside the paper's (right)", height=480)
    fig.update_layout(margin=dict(t=140, b=120), legend=dict(orientation="h", y=-0.35, x=0))
    return fig


def retrieval_figure(rows: Sequence[Mapping[str, Any]], chance: float | None, *, title: str) -> go.Figure:
    """Passkey retrieval accuracy against distance, one line per row: the mean over seeds with ±1 sample std
    as error bars (none with one seed), and chance as a dotted line."""
    fig = go.Figure()
    for i, r in enumerate(rows):
        fig.add_trace(go.Scatter(
            x=list(r["distance"]), y=list(r["mean"]), mode="lines+markers", name=f"{user_text.svg(r['row'])} (n={r['n']})",
            line=dict(color=PALETTE[i % len(PALETTE)], width=2),
            error_y=dict(type="data", array=[s or 0.0 for s in r["std"]], visible=True, thickness=1.2, width=4),
            hovertemplate="d=%{x}: %{y:.3f}<extra>" + user_text.svg(r["row"]) + "</extra>"))
    if chance is not None and rows:
        xs = sorted({d for r in rows for d in r["distance"]})
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[chance, chance], mode="lines", name=f"chance ({chance:.3f})",
                                 line=dict(color="#888888", dash="dot")))
    fig.update_xaxes(title="distance d (tokens between the key and where it is reproduced)")
    fig.update_yaxes(title="retrieval accuracy (per key character)", range=[0, 1.05])
    return layout(fig, user_text.svg(title), height=420)
