"""Figure builders: shapes, axis orders, colour ranges, band coordinates, NaN upper triangle."""

import math
from pathlib import Path

import numpy as np
import pytest

from frontend import attention_figures, figures

PLAN = [[4, 8, None, 16], [8, None, 4, 4]]


def attn(n=6):
    return [[(1.0 / (i + 1) if j <= i else None) for j in range(n)] for i in range(n)]


def test_window_grid_layer_rows_head_columns_and_one_fixed_log_colour_scale():
    fig = figures.window_grid_figure(PLAN, changed=[[True, False, False, False], [False] * 4], selected=(1, 2))
    hm = fig.data[0]
    assert np.array(hm.z).shape == (2, 4)  # rows = layers, columns = heads
    assert hm.text[0][2] == "full" and hm.text[1][0] == "8"
    assert (hm.zmin, hm.zmax) == (0, figures.FULL_Z)  # fixed: the same whatever the plan holds
    assert hm.z[0][0] == 2 and hm.z[0][1] == 3 and hm.z[0][3] == 4  # log2 of the window
    assert hm.z[0][2] == figures.FULL_Z  # full is the top colour
    assert list(hm.colorbar.ticktext)[:3] == ["1", "4", "16"] and hm.colorbar.ticktext[-1] == "full"
    # 16 gets the same colour in a uniform-16 map as in a mixed one (it is not "the widest" there)
    assert figures.window_grid_figure([[16, 16]]).data[0].z[0][0] == hm.z[0][3]
    assert fig.layout.yaxis.autorange == "reversed"  # layer 0 on top
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(r.x0, r.y0, r.line.color) for r in rects] == [(-0.5, -0.5, "#ff2d55"), (1.5, 0.5, "#000000")]


def test_window_diff_outlines_changed_cells_in_both_maps():
    b = [list(r) for r in PLAN]
    b[1][3] = None
    changed = [[False] * 4, [False, False, False, True]]
    fig = figures.window_diff_figure(PLAN, b, changed, names=("run 1", "run 2"))
    assert len(fig.data) == 2 and fig.data[0].zmax == fig.data[1].zmax
    assert {(s.xref, s.x0, s.y0) for s in fig.layout.shapes} == {("x", 2.5, 0.5), ("x2", 2.5, 0.5)}
    assert "1 head(s) differ" in fig.layout.title.text


def test_attention_figure_blank_upper_triangle_and_fixed_scale():
    w = attn()
    w[0][3] = 0.7  # a value above the diagonal must still be blanked
    fig = attention_figures.attention_figure(w, list("abcdef"), window=2)
    z = np.array(fig.data[0].z, dtype=float)
    assert np.isnan(z[np.triu_indices(6, k=1)]).all()
    assert not np.isnan(z[np.tril_indices(6)]).any()
    hm = fig.data[0]
    assert (hm.zmin, hm.zmax, hm.hoverongaps) == (0, 1, False)
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.yaxis.title.text == "query"
    assert fig.layout.xaxis.title.text == "key"
    assert (hm.y[4], hm.x[1]) == ("(4) e", "(1) b") and list(hm.customdata[4][1]) == [3, pytest.approx(0.2)]
    # token axes: one category per token, so the labels thin out to fit and every token shows when zoomed
    assert fig.layout.xaxis.type == "category" and list(hm.x) == ["(0) a", "(1) b", "(2) c", "(3) d", "(4) e", "(5) f"]
    assert list(fig.layout.yaxis.categoryarray) == list(hm.y) == list(hm.x)


def test_attention_maps_travel_as_float32_with_the_apis_weights_unchanged():
    """The maps' values go to the browser (and into a deck) as float32, half of float64's bytes: the
    API's weights are float32 values, so each arrives as sent, and so do the distances in the hover."""
    rng = np.random.default_rng(0)
    w = np.tril(rng.random((40, 40))).astype(np.float32)
    rows = [[float(v) if j <= i else None for j, v in enumerate(r)] for i, r in enumerate(w)]
    fig = attention_figures.attention_figure(rows, ["t"] * 40, window=8, pool=3)
    hm, sent = fig.data[0], fig.to_plotly_json()["data"][0]  # as sent: base64 with its dtype
    assert sent["z"]["dtype"] == sent["customdata"]["dtype"] == "f4"
    low = np.tril_indices(40)
    assert (np.asarray(hm.z)[low] == w[low]).all() and (np.asarray(hm.customdata)[..., 1][low] == w[low]).all()
    assert (np.asarray(hm.customdata)[..., 0][low] == 3 * (low[0] - low[1])).all()
    diff = attention_figures.attention_diff_figure(rows, rows, ["t"] * 40).to_plotly_json()["data"][0]
    assert diff["z"]["dtype"] == "f4"


def test_attention_labels_count_from_the_texts_start_and_show_blank_tokens():
    fig = attention_figures.attention_figure(attn(3), ["x", " ", "\n"], window=None, offset=500, pool=2)
    assert list(fig.data[0].x) == ["(500) x", "(502) ␣", "(504) ↵"]


def test_attention_colour_scales_keep_weak_weights_visible():
    w = [[1.0, None, None], [0.999, 0.001, None], [0.5, 0.25, 0.25]]
    lin = attention_figures.attention_figure(w, list("abc"), None, scale="linear").data[0]
    log = attention_figures.attention_figure(w, list("abc"), None, scale="log").data[0]
    row = attention_figures.attention_figure(w, list("abc"), None, scale="row").data[0]
    assert (lin.zmin, lin.zmax, log.zmin, log.zmax, row.zmin, row.zmax) == (0, 1, attention_figures.LOG_FLOOR_EXP, 0, 0, 1)
    assert np.array(log.z, dtype=float)[1, 1] == pytest.approx(-3.0)  # 0.001 -> 1e-3, mid-scale, not washed out
    assert np.array(row.z, dtype=float)[2].tolist() == pytest.approx([1.0, 0.5, 0.5])  # ÷ the row's largest
    assert np.isnan(np.array(row.z, dtype=float)[0, 1]) and np.isnan(np.array(log.z, dtype=float)[0, 2])
    assert log.customdata[1][1][1] == pytest.approx(0.001)  # the hover keeps the weight itself
    with pytest.raises(ValueError, match="colour scale"):
        attention_figures.attention_figure(w, list("abc"), None, scale="cubic")


def test_head_multiples_one_map_per_head_and_clicks_name_the_head():
    maps = [attn(4), attn(4), attn(4)]
    fig = attention_figures.head_multiples_figure(maps, [2, None, 3], layer=1, selected=2, cols=2)
    heat = [t for t in fig.data if t.type == "heatmap"]
    marks = [t for t in fig.data if t.type == "scatter"]
    assert len(heat) == 3 and len(marks) == 3 and fig.data.index(marks[0]) == 3
    assert [a.text for a in fig.layout.annotations] == ["H0 · window 2", "H1 · window full", "H2 · window 3 (open)"]
    assert [t.showscale for t in heat] == [True, False, False]
    outlined = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.xref, s.yref) for s in outlined] == [("x3 domain", "y3 domain")]
    assert {s.xref for s in fig.layout.shapes if s.name == "window"} == {"x", "x3"}  # H1 is full: no edge
    assert attention_figures.clicked_head([{"curve_number": 4}], 3) == 1
    assert attention_figures.clicked_head([{"curve_number": 1}], 3) is None


def test_small_multiples_are_averaged_down_and_keep_the_band_in_blocks():
    z = attention_figures.as_matrix(attn(200))
    small = attention_figures.block_mean(z, 64)
    assert small.shape == (50, 50)  # blocks of 4
    assert small[10, 3] == pytest.approx(np.mean(z[40:44, 12:16])) and np.isnan(small[3, 10])
    assert attention_figures.block_mean(z[:8, :8], 64).shape == (8, 8)  # small maps keep every cell
    fig = attention_figures.head_multiples_figure([attn(200)], [40], layer=0)
    assert np.array(fig.data[0].z).shape == (50, 50)
    window = next(s for s in fig.layout.shapes if s.name == "window")
    assert window.path.startswith("M -0.5,9.5")  # 40 tokens = 10 blocks of 4


def test_query_text_colours_each_key_by_the_queries_weight():
    html = attention_figures.query_text_html(["<a>", "b", "c", "d"], [0.2, 0.8, 0.0, None], 2, offset=10)
    spans = html.split("<span")[1:]
    assert len(spans) == 4 and "&lt;a&gt;" in spans[0]  # escaped
    assert "rgba(31,119,180,0.250)" in spans[0] and "rgba(31,119,180,1.000)" in spans[1]
    assert "outline" in spans[2] and "(12) weight 0.0000" in spans[2]  # the query, at its text position
    assert "color:#aaa" in spans[3] and "after the query" in spans[3]


def test_band_coordinates_separate_kept_from_cut_keys():
    band = attention_figures.band_coordinates(6, 2)
    assert band["diagonal"][:3] == [(-0.5, -0.5), (0.5, -0.5), (0.5, 0.5)]  # right of key 0 in row 0
    edge = band["window"]
    assert edge[0] == (-0.5, 1.5)  # rows 0 and 1 keep every key; row 2 is the first to lose one
    # row 4 keeps keys 3, 4 (w = 2): its edge is the vertical segment x = 2.5 from y = 3.5 to 4.5
    assert ((2.5, 3.5), (2.5, 4.5)) in list(zip(edge, edge[1:]))
    assert edge[-1] == (3.5, 5.5)
    assert "window" not in attention_figures.band_coordinates(6, None)
    assert "window" not in attention_figures.band_coordinates(6, 6)


def test_attention_band_shapes_follow_pooling():
    fig = attention_figures.attention_figure(attn(8), list("abcdefgh"), window=8, pool=4)  # window 8 tokens = 2 pooled blocks
    paths = {s.name: s.path for s in fig.layout.shapes}
    assert paths["window"].startswith("M -0.5,1.5 L 0.5,1.5")
    assert paths["diagonal"].startswith("M -0.5,-0.5 L 0.5,-0.5")
    assert attention_figures.attention_figure(attn(), list("abcdef"), window=None).layout.title.text.endswith("(window full)")


def test_attention_diff_is_diverging_and_symmetric():
    full = attn()
    win = [[(v * 0.5 if v is not None else None) for v in row] for row in full]
    fig = attention_figures.attention_diff_figure(full, win, list("abcdef"))
    hm = fig.data[0]
    assert hm.colorscale[0][1] != hm.colorscale[-1][1] and hm.zmid == 0
    assert hm.zmin == -hm.zmax == pytest.approx(-0.5)
    assert np.isnan(np.array(hm.z, dtype=float)[0, 1])


def test_cut_mass_bars_on_query_axis():
    fig = attention_figures.cut_mass_figure([0.0, 0.2, 0.5], list("abc"))
    assert list(fig.data[0].x) == [0.0, 0.2, 0.5] and fig.layout.yaxis.autorange == "reversed"
    assert tuple(fig.layout.xaxis.range) == (0, 1)


def test_retained_mass_marks_the_assigned_window_within_the_context():
    fig = figures.retained_mass_figure([4, 8, None], [0.5, 0.8, 1.0], 8, seq_len=32, tau=0.9)
    assert list(fig.data[0].x) == [4, 8, 32] and fig.layout.xaxis.type == "log"
    assert tuple(fig.layout.xaxis.range) == (0, pytest.approx(math.log10(32)))  # 1..T, nothing beyond
    assigned = next(t for t in fig.data if t.name.startswith("assigned"))
    assert list(assigned.x) == [8, 8] and assigned.name == "assigned 8"
    assert not fig.layout.annotations and not fig.layout.shapes  # no log-axis annotation at 10^x
    full = figures.retained_mass_figure([4, None], [0.5, 1.0], None, seq_len=32)
    assert next(t for t in full.data if t.name == "assigned full").x == (32, 32)


def test_sensitivity_heatmap_shape_and_centre():
    delta = [[[0.3, 0.0], [0.1, 0.0]], [[-0.05, 0.0], [0.2, 0.0]]]
    fig = figures.sensitivity_figure(delta, [4, None], 0)
    hm = fig.data[0]
    assert np.array(hm.z).tolist() == [[0.3, 0.1], [-0.05, 0.2]]
    assert hm.zmid == 0 and hm.zmax == pytest.approx(0.3) and hm.zmin == pytest.approx(-0.3)


def test_token_delta_strip():
    fig = figures.token_delta_figure(["a", "b", "c"], [0.2, None, -0.1])
    hm = fig.data[0]
    z = np.array(hm.z, dtype=float)
    assert z.shape == (1, 3) and math.isnan(z[0, 1]) and hm.zmax == pytest.approx(0.2) and hm.zmid == 0


@pytest.mark.parametrize("metric", ["acr", "causal_coverage"])
def test_loss_coverage_names_metric_source_and_eval_set(metric):
    fig = figures.loss_coverage_figure(metric, "text", curve=[{"x": 1.0, "y": 2.0}, {"x": 0.5, "y": 2.2}],
                                       live={"x": 0.4, "y": 2.1}, baseline={"x": 0.5, "y": 2.0})
    assert fig.layout.xaxis.title.text.startswith(metric)
    assert [t.name for t in fig.data] == ["allocation curve · eval text", "model's own plan · eval text",
                                          "current edit · eval text"]
    assert "eval set text" in fig.layout.yaxis.title.text and fig.data[-1].x == (0.4,)


def test_runs_coverage_one_trace_per_comparable_group():
    runs = [{"x": 0.3, "y": 2.0, "name": "a", "group": "4×4"}, {"x": 0.5, "y": 6.5, "name": "p", "group": "paper"},
            {"x": 0.6, "y": 1.9, "name": "b", "group": "4×4"}]
    fig = figures.runs_coverage_figure("acr", runs)
    assert [(t.name.split(" · ")[0], list(t.x)) for t in fig.data] == [("4×4", [0.3, 0.6]), ("paper", [0.5])]
    assert "own validation set" in fig.layout.yaxis.title.text


def test_ema_debiased_and_skips_missing():
    assert figures.ema([1.0, 2.0], 0.0) == [1.0, 2.0]
    out = figures.ema([2.0, None, 2.0, 4.0], 0.5)
    assert out[0] == 2.0 and out[1] is None and out[2] == pytest.approx(2.0)
    assert 2.0 < out[3] < 4.0


def test_metric_curves_sparse_series_drawn_raw_whatever_the_smoothing():
    fig = figures.metric_curves_figure({"val_loss": ([0, 50, 100], [3.0, 2.0, 2.5])}, 0.6)
    (line,) = fig.data
    assert line.name == "val_loss" and list(line.y) == [3.0, 2.0, 2.5] and line.mode == "lines+markers"


def test_metric_curves_dense_series_get_an_ema_overlay_beside_the_raw_line():
    steps = list(range(1, figures.DENSE_POINTS + 1))
    values = [float(s % 7) for s in steps]
    raw, smooth = figures.metric_curves_figure({"train_loss": (steps, values)}, 0.6).data
    assert raw.name == "train_loss" and list(raw.y) == values  # raw values untouched, last point stored
    assert smooth.name == "train_loss (EMA 0.6)" and smooth.line.color == raw.line.color
    assert list(smooth.y) == pytest.approx(figures.ema(values, 0.6)) and list(smooth.y) != values
    (alone,) = figures.metric_curves_figure({"train_loss": (steps, values)}, 0.0).data  # smoothing off: raw only
    assert list(alone.y) == values


def test_window_fraction_stack_orders_buckets_full_last():
    fig = figures.window_fraction_figure({"full": ([0], [0.5]), "16": ([0], [0.25]), "4": ([0], [0.25])})
    assert [t.name for t in fig.data] == ["window 4", "window 16", "window full"]
    assert all(t.stackgroup == "frac" for t in fig.data) and tuple(fig.layout.yaxis.range) == (0, 1)


def test_all_full_grid_uses_the_top_colour():
    hm = figures.window_grid_figure([[None, None]]).data[0]
    assert hm.z[0][0] == hm.zmax == figures.FULL_Z and hm.zmin == 0


def test_clickable_grid_has_a_point_on_every_cell():
    fig = figures.window_grid_figure(PLAN, clickable=True)
    pts = fig.data[1]
    assert sorted(zip(pts.y, pts.x)) == [(l, h) for l in range(2) for h in range(4)]
    assert fig.data[0].hoverinfo == "skip"


def test_loss_against_kv_bytes_scales_its_axis_to_the_bytes():
    fig = figures.loss_coverage_figure("kv_bytes", "mixed", curve=[{"x": 4096, "y": 2.0}, {"x": 1024, "y": 2.3}],
                                       live={"x": 2048, "y": 2.1}, baseline={"x": 4096, "y": 2.0})
    assert fig.layout.xaxis.title.text.startswith("KV cache")
    assert fig.layout.xaxis.range is None and fig.layout.xaxis.rangemode == "tozero"
    assert figures.loss_coverage_figure("acr", "mixed").layout.xaxis.range == (0, 1.05)


def test_cost_summary_gives_both_fractions_of_full():
    result = {"kv_bytes": 300, "kv_bytes_full": 1000, "attention_pairs": 1, "attention_pairs_full": 3}
    assert figures.cost_summary(result) == "KV cache 30.0 % of full · attention pairs 33.3 % of full"


def test_cache_growth_one_line_per_plan_and_the_full_plan_dashed():
    from frontend.generate_panel import full_growth, growth

    resp = {"prompt_tokens": 3, "cache_bytes": [30, 40, 40], "kv_bytes_full": 5 * 20}
    assert growth(resp) == ([3, 4, 5], [30, 40, 40])
    assert full_growth(resp) == ([3, 4, 5], [60, 80, 100])  # 20 bytes a position, context 5 at the end
    fig = figures.cache_growth_figure({"edited plan": growth(resp)}, full=full_growth(resp))
    assert [t.name for t in fig.data] == ["edited plan", "full plan"]
    assert fig.data[1].line.dash == "dash" and fig.data[0].y == (30, 40, 40)


def test_loss_coverage_figure_draws_rounded_points_with_their_labels():
    from frontend.figures import loss_coverage_figure

    rounded = [{"x": 0.5, "y": 2.1, "label": "layer up"}, {"x": 0.4, "y": 2.3, "label": "transformers budget"}]
    fig = loss_coverage_figure("causal_coverage", "mixed", live={"x": 0.45, "y": 2.2}, rounded=rounded)
    (trace,) = [t for t in fig.data if t.name.startswith("rounded to serving grains")]
    assert list(trace.x) == [0.5, 0.4] and list(trace.y) == [2.1, 2.3]
    assert list(trace.text) == ["layer up", "transformers budget"]


def _markers(fig) -> list:
    return [t for t in fig.data if t.yaxis == "y2"]


def test_nonfinite_points_are_gaps_in_the_line_and_markers_that_say_what_they_are():
    steps = [0, 10, 20, 30, 40]
    values = [3.0, "nan", 2.0, "inf", 1.5]  # as the API sends them
    marks = {"val_loss": [(10, "nan"), (30, "inf"), (35, "-inf")]}  # 35: one that downsampling left out
    fig = figures.metric_curves_figure({"val_loss": (steps, values)}, 0.0, nonfinite=marks)
    line, = [t for t in fig.data if t.yaxis != "y2"]
    assert list(line.y) == [3.0, None, 2.0, None, 1.5]
    (mark,) = _markers(fig)
    assert list(mark.x) == [10, 30, 35] and mark.marker.color == line.line.color
    assert list(mark.hovertext) == ["NaN at step 10 · val_loss", "+inf at step 30 · val_loss",
                                    "-inf at step 35 · val_loss"]
    assert list(mark.marker.symbol) == ["x", "triangle-up", "triangle-down"]
    # on their own hidden 0..1 axis: NaN and +inf along the top edge, -inf along the bottom
    assert fig.layout.yaxis2.overlaying == "y" and tuple(fig.layout.yaxis2.range) == (0, 1)
    assert mark.y[0] == mark.y[1] > 0.5 > mark.y[2]
    assert not _markers(figures.metric_curves_figure({"val_loss": (steps, [1.0] * 5)}, 0.0, nonfinite={"val_loss": []}))


def test_group_bands_mark_each_runs_nonfinite_points_in_the_groups_colour():
    from frontend import group_figures

    curve = {"step": [0, 10], "mean": [2.0, 1.5], "std": [0.1, None], "min": [1.9, 1.5], "max": [2.1, 1.5],
             "n": [2, 1], "nonfinite": {"7": {"step": [10], "kind": ["nan"], "total": 1}}}
    fig = group_figures.group_band_figure({"g": curve}, "std", y_title="val_loss", overlay={"this run": ([0, 10], [2.0, "-inf"])})
    (mark,) = _markers(fig)
    mean = next(t for t in fig.data if t.name and t.name.startswith("g ("))
    assert list(mark.hovertext) == ["NaN at step 10 · g · run #7"] and mark.marker.color == mean.line.color
    overlay = next(t for t in fig.data if t.name == "this run")
    assert list(overlay.y) == [2.0, None]


def _curve(steps, mean, std):
    return {"step": steps, "mean": mean, "std": std, "min": mean, "max": mean, "n": [3] * len(steps)}


def test_group_band_bands_under_lines_and_this_run_in_its_keys_colour():
    """Issue 23: both "this run" lines were the same grey; val_loss's band was drawn over train_loss."""
    from frontend import group_figures

    curves = {"train_loss · group g": _curve([0, 1], [3.0, 2.0], [0.1, 0.1]),
              "val_loss · group g": _curve([0, 1], [3.2, 2.2], [0.2, 0.2])}
    overlay = {"train_loss · this run": ([0, 1], [3.1, 2.1]), "val_loss · this run": ([0, 1], [3.3, 2.3])}
    fig = group_figures.group_band_figure(curves, "std", y_title="val_loss", overlay=overlay, overlay_of={
        "train_loss · this run": "train_loss · group g", "val_loss · this run": "val_loss · group g"})
    kinds = ["band" if t.line.width == 0 else "line" for t in fig.data]
    assert kinds == ["band"] * 4 + ["line"] * 4  # every band before every line
    means = [t for t in fig.data if t.name and "n=3" in t.name]
    runs = [t for t in fig.data if t.name and "this run" in t.name]
    assert [r.line.color for r in runs] == [m.line.color for m in means]
    assert runs[0].line.color != runs[1].line.color


def test_group_band_follows_the_ema_slider_on_dense_series():
    from frontend import group_figures

    steps = list(range(figures.DENSE_POINTS))
    values = [float(s % 5) for s in steps]
    curves = {"train_loss · group g": _curve(steps, values, [0.1] * len(steps))}
    overlay = {"train_loss · this run": (steps, values)}
    raw = group_figures.group_band_figure(curves, "std", y_title="val_loss", overlay=overlay)
    smooth = group_figures.group_band_figure(curves, "std", y_title="val_loss", overlay=overlay, smoothing=0.6)
    assert list(raw.data[2].y) == values and list(smooth.data[2].y) == pytest.approx(figures.ema(values, 0.6))
    assert list(smooth.data[3].y) == pytest.approx(figures.ema(values, 0.6)) and "EMA 0.6" in smooth.data[3].name
    sparse = {"val_loss · group g": _curve([0, 100], [3.0, 2.0], [0.1, 0.1])}
    assert list(group_figures.group_band_figure(sparse, "std", y_title="val_loss", smoothing=0.6).data[2].y) == [3.0, 2.0]


def test_legends_sit_below_the_plot_and_never_take_its_width():
    from frontend import group_figures

    many = {f"a long run name number {i} · seed {i}": ([0, 1], [1.0, 2.0]) for i in range(12)}
    for fig in (figures.metric_curves_figure(many, 0.0),
                group_figures.group_band_figure({"g": _curve([0, 1], [1.0, 2.0], [0.1, 0.1])}, y_title="val_loss")):
        legend = fig.layout.legend
        assert legend.orientation == "h" and legend.y < 0 and legend.yanchor == "top"


def test_a_zoomed_range_becomes_whole_steps():
    from frontend import zoom_chart

    assert zoom_chart.step_range([10.4, 99.2]) == (10, 100)
    assert zoom_chart.step_range([-3.0, 5.5]) == (0, 6)
    assert zoom_chart.step_range(None) is None and zoom_chart.step_range([5, 5]) is None
    assert zoom_chart.step_range(["a", 3]) is None and zoom_chart.step_range([float("nan"), 3]) is None


def test_a_zoomable_chart_may_not_set_its_own_x_range():
    """The zoom listener takes a set x range on a chart it finds for the user's zoom (zoom_chart._JS)."""
    from frontend import zoom_chart

    fig = figures.metric_curves_figure({"loss": ([1, 2, 3], [3.0, 2.0, 1.0])}, 0.0, title="metrics by step")
    assert fig.layout.xaxis.range is None  # the ACR page's chart leaves it to Plotly
    fig.update_xaxes(range=[0, 2])
    with pytest.raises(ValueError, match="must not set its x range"):
        zoom_chart.show(fig, "acr._metrics")


def test_a_models_window_map_colour_bar_spans_its_own_context():
    """Issue 23: a T=256 model's colour bar ran 1 .. 16384."""
    hm = figures.window_grid_figure([[4, 256, None, 1000]], seq_len=256).data[0]
    assert hm.zmin == 0 and hm.zmax == 8  # log2(256)
    assert hm.z[0][1] == hm.z[0][2] == hm.z[0][3] == 8 and hm.z[0][0] == 2  # T keys or more: full
    labels = list(hm.colorbar.ticktext)
    assert labels[0] == "1" and labels[-1] == "full (≥256)" and "16384" not in labels and "512" not in labels


def test_every_trace_type_the_dashboard_builds_keeps_the_templates_defaults():
    """figures.TEMPLATE keeps plotly_white's trace defaults for TRACE_TYPES only: every trace the
    frontend constructs (go.<Trace>( in its source) must be one of them, or it would draw unstyled."""
    import re

    import plotly.io as pio

    src = "".join(p.read_text() for p in (Path(figures.__file__).parent).glob("*.py"))
    built = {name.lower() for name in re.findall(r"\bgo\.([A-Z][A-Za-z]+)\(", src)} - {"figure"}
    assert built and built <= set(figures.TRACE_TYPES), built - set(figures.TRACE_TYPES)
    white = pio.templates["plotly_white"]
    for t in figures.TRACE_TYPES:
        assert figures.TEMPLATE.data[t] == white.data[t]
    assert figures.TEMPLATE.layout.colorway == tuple(figures.PALETTE)
    assert figures.TEMPLATE.layout.font == white.layout.font
