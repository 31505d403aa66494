"""Pure builders for attention maps: data in, `go.Figure` (or HTML text) out. No Streamlit, no HTTP.

Conventions (shared/reference/dashboard_anchors.md §4): rows = query, columns = key, origin upper-left,
the causal upper triangle NaN (blank, no hover). The axes are categorical, one category per token
labelled "(position) token", so Plotly thins the labels to fit and shows every token's text once the
user zooms in. Weights take one of three colour scales (`SCALES`): linear on a fixed 0..1, log10 on a
fixed 1e-4..1 (weak attention stays visible), or each row divided by its largest weight.
"""

from __future__ import annotations

import html
import math
import warnings
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from frontend import user_text
from frontend.figures import DIFF_SCALE, layout
from frontend.plans import window_label

PROB_SCALE = "Blues"
SCALES = {"linear": "linear (0..1)", "log": "log₁₀ (1e-4..1)", "row": "per row (÷ the row's largest)"}
LOG_FLOOR_EXP = -4  # the log scale's floor: 1e-4; weaker weights take its colour
MULTIPLE_SIDE = 64  # a small multiple is averaged down to at most 64 x 64 cells


def as_matrix(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """JSON rows (None for blank) -> float array with NaN, and the causal upper triangle forced to NaN."""
    z = np.array([[np.nan if v is None else float(v) for v in row] for row in rows], dtype=float)
    if z.size:
        z[np.triu_indices(z.shape[0], k=1, m=z.shape[1])] = np.nan
    return z


def compact(values: np.ndarray) -> np.ndarray:
    """A map's values as float32 for the browser: half the bytes of float64, in the page and in an exported
    deck (a 256-token map's values and hover data were 2.1 MB of base64). The API's weights are float32
    tensors' values, so they keep every digit, as do positions (exact below 2**24); a derived value (log,
    ÷ row max, a difference) keeps 7 significant digits, far finer than a colour or a 4-decimal hover."""
    return values.astype(np.float32)


def visible(token: str) -> str:
    """A token as it can be read on an axis: newline ↵, tab ⇥, a blank token as ␣ per character."""
    t = token.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    return "␣" * max(len(t), 1) if not t.strip() else t


def token_labels(tokens: Sequence[str], pool: int = 1, offset: int = 0) -> list[str]:
    """One unique label per (pooled) row: "(position in the whole text) token" (tags in it shown as text)."""
    return [f"({offset + i * pool}) {user_text.svg(visible(t))}" for i, t in enumerate(tokens)]


def scaled(z: np.ndarray, scale: str) -> tuple[np.ndarray, dict]:
    """(the values to colour, the heatmap's colour settings) for a weight matrix on `scale`."""
    if scale == "linear":
        return z, dict(zmin=0, zmax=1, colorbar=dict(title="weight"))
    if scale == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(np.isnan(z), np.nan, np.log10(np.clip(z, 10.0 ** LOG_FLOOR_EXP, 1.0)))
        ticks = list(range(LOG_FLOOR_EXP, 1))
        return out, dict(zmin=LOG_FLOOR_EXP, zmax=0, colorbar=dict(
            title="weight (log)", tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]))
    if scale == "row":
        with np.errstate(invalid="ignore"):
            peak = np.nanmax(np.where(np.isnan(z), -np.inf, z), axis=1, keepdims=True) if z.size else z
        out = np.divide(z, peak, out=np.full_like(z, np.nan), where=peak > 0)
        return out, dict(zmin=0, zmax=1, colorbar=dict(title="÷ row max"))
    raise ValueError(f"colour scale {scale!r} is unknown; use one of {', '.join(SCALES)}")


def band_coordinates(n: int, window: int | None) -> dict[str, list[tuple[float, float]]]:
    """Staircase edges of the attended band in cell coordinates (cell (i, j) is centred at x=j, y=i).
    `diagonal` runs along x = i + 0.5 (the causal edge right of key j = i); `window` along
    x = i - w + 0.5, between the last cut key j = i - w and the first kept key j = i - w + 1, for the
    rows i >= w that lose keys. Each edge is a list of (x, y) vertices."""
    diagonal = [(-0.5, -0.5)]
    for i in range(n):
        diagonal += [(i + 0.5, i - 0.5), (i + 0.5, i + 0.5)]
    out = {"diagonal": diagonal}
    if window is not None and window < n:
        edge = [(-0.5, window - 0.5)]
        for i in range(window, n):
            edge += [(i - window + 0.5, i - 0.5), (i - window + 0.5, i + 0.5)]
        out["window"] = edge
    return out


def _svg_path(points: list[tuple[float, float]]) -> str:
    return "M " + " L ".join(f"{x},{y}" for x, y in points)


def _band_shapes(n: int, window: int | None, pool: int, xref: str = "x", yref: str = "y") -> list[dict]:
    band = band_coordinates(n, None if window is None else max(1, math.ceil(window / pool)))
    if n > 64:  # on long maps the blank upper triangle already shows the causal edge
        band.pop("diagonal")
    return [dict(type="path", path=_svg_path(points), xref=xref, yref=yref, name=name,
                 line=dict(color="#e4572e" if name == "window" else "#888888", width=2,
                           dash="solid" if name == "window" else "dot"))
            for name, points in band.items()]


def _token_axes(fig: go.Figure, labels: list[str]) -> None:
    """Categorical token axes: Plotly shows as many labels as fit, every one when zoomed in. The colour
    bar stays thin so the map keeps the width."""
    for trace in fig.data:
        trace.update(colorbar=dict(thickness=14, len=0.8))
    common = dict(type="category", showgrid=False, zeroline=False, tickfont=dict(size=10), automargin=True)
    fig.update_xaxes(title="key", tickangle=-60, constrain="domain", categoryorder="array",
                     categoryarray=labels, **common)
    fig.update_yaxes(title=dict(text="query", standoff=6), autorange="reversed", scaleanchor="x", scaleratio=1,
                     constrain="domain", categoryorder="array", categoryarray=labels, **common)


def attention_figure(weights: Sequence[Sequence[float | None]], tokens: Sequence[str], window: int | None,
                     *, title: str | None = None, pool: int = 1, offset: int = 0, scale: str = "linear",
                     height: int = 860) -> go.Figure:
    """One head's attention map (rows = query, columns = key) on the colour `scale`, upper triangle
    blank, the window band drawn, token text on the axes and in the hover (positions count from the
    text's start: `offset`). `window` is in tokens; with pooled maps it is divided by `pool`."""
    z = as_matrix(weights)
    n = z.shape[0]
    labels = token_labels(tokens, pool, offset)
    # numeric customdata only (distance, weight): the token labels are the axes' categories already
    custom = np.stack([np.subtract.outer(np.arange(n), np.arange(n)) * pool, z], axis=-1)
    colour, settings = scaled(z, scale)
    fig = go.Figure(go.Heatmap(
        z=compact(colour), x=labels, y=labels, customdata=compact(custom), colorscale=PROB_SCALE, hoverongaps=False, **settings,
        hovertemplate="query %{y}<br>key %{x}<br>distance %{customdata[0]}"
                      "<br>weight %{customdata[1]:.4f}<extra></extra>"))
    fig.update_layout(shapes=_band_shapes(n, window, pool))
    _token_axes(fig, labels)
    return layout(fig, title or f"attention (window {window_label(window)})", height=height, left=90)


def attention_diff_figure(full: Sequence[Sequence[float | None]], windowed: Sequence[Sequence[float | None]],
                          tokens: Sequence[str], *, pool: int = 1, offset: int = 0, height: int = 620) -> go.Figure:
    """windowed - full on a diverging scale symmetric about 0 (mass moved by the window)."""
    z = as_matrix(windowed) - as_matrix(full)
    finite = np.abs(z[np.isfinite(z)])
    m = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    labels = token_labels(tokens, pool, offset)
    fig = go.Figure(go.Heatmap(
        z=compact(z), x=labels, y=labels, colorscale=DIFF_SCALE, zmid=0, zmin=-m, zmax=m,
        hoverongaps=False, colorbar=dict(title="Δ weight"),
        hovertemplate="query %{y}<br>key %{x}<br>windowed - full %{z:.4f}<extra></extra>"))
    _token_axes(fig, labels)
    return layout(fig, "difference: windowed - full", height=height, left=90)


def cut_mass_figure(cut_mass: Sequence[float], tokens: Sequence[str], *, pool: int = 1, offset: int = 0,
                    height: int = 620) -> go.Figure:
    """Per query row, the share of its full attention mass that the window cuts off (0..1)."""
    labels = token_labels(tokens, pool, offset)
    fig = go.Figure(go.Bar(x=list(cut_mass), y=list(range(len(cut_mass))), orientation="h", customdata=labels,
                           marker_color="#e4572e", hovertemplate="%{customdata}: cut %{x:.3f}<extra></extra>"))
    fig.update_xaxes(title="mass cut off", range=[0, 1])
    fig.update_yaxes(title="query", autorange="reversed")
    return layout(fig, "attention mass cut off per query", height=height)


def block_mean(z: np.ndarray, side: int) -> np.ndarray:
    """A square map averaged over blocks so that no side exceeds `side` (NaN cells ignored; a block of
    only NaN stays NaN): small multiples need their shape, not every cell."""
    n = z.shape[0]
    k = max(1, math.ceil(n / side))
    if k == 1:
        return z
    m = math.ceil(n / k) * k
    padded = np.full((m, m), np.nan)
    padded[:n, :n] = z
    blocks = padded.reshape(m // k, k, m // k, k)
    with warnings.catch_warnings():  # all-NaN blocks (above the diagonal) stay NaN without a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(blocks, axis=(1, 3))


def head_multiples_figure(maps: Sequence[Sequence[Sequence[float | None]]], windows: Sequence[int | None],
                          *, layer: int, pool: int = 1, scale: str = "linear", selected: int | None = None,
                          cols: int = 4) -> go.Figure:
    """A layer's heads as small multiples on one colour scale (each averaged down to MULTIPLE_SIDE cells a
    side), titled with its window and its band drawn; `selected` is outlined. An invisible marker grid over
    each map (one trace per head, in head order) makes a click anywhere on a map report that head: Plotly
    reports clicks on points only."""
    n_head = len(maps)
    cols = max(1, min(cols, n_head))
    rows = math.ceil(n_head / cols)
    titles = [f"H{h} · window {window_label(w)}" + (" (open)" if h == selected else "") for h, w in enumerate(windows)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.03,
                        vertical_spacing=0.08 if rows > 1 else 0.0)
    shapes = []
    sides = []
    for h, weights in enumerate(maps):
        r, c = divmod(h, cols)
        z = block_mean(as_matrix(weights), MULTIPLE_SIDE)
        block = math.ceil(len(weights) / z.shape[0])
        sides.append(z.shape[0])
        colour, settings = scaled(z, scale)
        settings["showscale"] = h == 0
        fig.add_trace(go.Heatmap(z=compact(colour), colorscale=PROB_SCALE, hoverinfo="skip", **settings), row=r + 1, col=c + 1)
        suffix = "" if h == 0 else str(h + 1)
        shapes += _band_shapes(z.shape[0], windows[h], pool * block, f"x{suffix}", f"y{suffix}")
        if h == selected:
            shapes.append(dict(type="rect", xref=f"x{suffix} domain", yref=f"y{suffix} domain", x0=0, x1=1, y0=0,
                               y1=1, line=dict(color="#000000", width=3)))
    for h, n in enumerate(sides):  # the click targets after every heatmap: curve h + n_head is head h
        r, c = divmod(h, cols)
        grid = np.linspace(0, max(n - 1, 0), 8)
        xs, ys = np.meshgrid(grid, grid)
        fig.add_trace(go.Scatter(x=xs.ravel(), y=ys.ravel(), mode="markers", showlegend=False, name=f"H{h}",
                                 marker=dict(size=24, color="rgba(0,0,0,0)", opacity=0.01),
                                 unselected=dict(marker=dict(opacity=0.01)), selected=dict(marker=dict(opacity=0.01)),
                                 hovertemplate=f"layer {layer}, head {h}: click to open<extra></extra>"),
                      row=r + 1, col=c + 1)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, constrain="domain")
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed", constrain="domain")
    for h in range(n_head):
        suffix = "" if h == 0 else str(h + 1)
        fig.update_yaxes(scaleanchor=f"x{suffix}", selector=dict(anchor=f"x{suffix}"))
    fig.update_layout(shapes=shapes)
    return layout(fig, f"layer {layer}: every head (click one to open it)", height=60 + 260 * rows)


def clicked_head(points: Sequence[dict], n_head: int) -> int | None:
    """The head a click on `head_multiples_figure` picked (its marker traces come after the n_head maps)."""
    for p in points:
        curve = p.get("curve_number")
        if curve is not None and n_head <= curve < 2 * n_head:
            return int(curve - n_head)
    return None


def query_text_html(tokens: Sequence[str], row: Sequence[float | None], query: int, *, offset: int = 0,
                    pool: int = 1) -> str:
    """One query's attention as text: each key token's background is the query's weight on it (darker =
    more, relative to the row's largest weight; the exact weight in the tooltip), the query itself
    boxed, tokens after it greyed (causal: never attended). HTML-escaped."""
    weights = [0.0 if v is None or j > query else float(v) for j, v in enumerate(row)]
    peak = max(weights) if weights and max(weights) > 0 else 1.0
    spans = []
    for j, token in enumerate(tokens):
        text = html.escape(token.replace("\r", "")).replace("\n", "↵<br>")
        pos = offset + j * pool
        if j > query:
            spans.append(f"<span style='color:#aaa' title='({pos}) after the query'>{text}</span>")
            continue
        alpha = weights[j] / peak
        style = f"background:rgba(31,119,180,{alpha:.3f});color:{'#fff' if alpha > 0.6 else '#111'}"
        if j == query:
            style += ";outline:2px solid #e4572e"
        spans.append(f"<span style='{style}' title='({pos}) weight {weights[j]:.4f}'>{text}</span>")
    return ("<div style='font-family:monospace;white-space:pre-wrap;line-height:1.6;font-size:0.95rem'>"
            + "".join(spans) + "</div>")
