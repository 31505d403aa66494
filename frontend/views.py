"""What each page shows, as data + figures, independent of layout: pages lay these out, the present
page steps through them as slides, and the HTML export writes them to a file. Calls the API through
`frontend.api` (raising ApiError); builds figures through `frontend.figures`."""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go

from aah_client.client import OWN_WINDOW
from frontend import api, attention_figures, figures, group_views, plans, run_views, study_views, url_state
from frontend.comparable import plan_shape, run_family
from frontend.export import Section

COVERAGE_KEYS = ("acr", "causal_coverage", "tile_coverage")


# -- models and the editor ---------------------------------------------------------------------------


def model_caption(model: dict) -> str:
    """The model's evaluation dtype and, where it was measured, bfloat16's loss difference against float32."""
    p = model.get("precision")
    size = (f" Each eval set: {model['eval_seqs']} × {model['seq_len']:,} = {model['eval_tokens']:,} tokens."
            if "eval_tokens" in model else "")
    if not p:
        return f"Evaluated in {model.get('dtype', 'float32')}.{size}"
    why = (f"bfloat16 products run {p['bf16_speedup']:.1f}× as fast as float32 here"
           if p["choice"] == "measured" else "as requested")
    text = f"Evaluated in {p['dtype']} ({why}).{size}"
    if p.get("loss_delta") is not None:
        text += (f" Loss in bfloat16 {p['loss_bfloat16']:.4f} vs float32 {p['loss_float32']:.4f}"
                 f" (Δ {p['loss_delta']:+.4f}) on {p['tokens']:,} tokens, the model's own windows.")
    return text


def pick_model(model_id: str) -> dict:
    """The model named in the state, or the first one the API lists."""
    models = api.cached("models")
    if not models:
        raise api.ApiError(404, "the API lists no models; is the demo checkpoint registered?")
    return next((m for m in models if m["id"] == model_id), models[0])


def plan_for(model: dict, encoded: str) -> tuple[list, list, list[str]]:
    """(the plan from the URL text or the model's own plan, the model's own plan, what of the text was
    ignored: cells that are not windows keep the model's own window, another shape gives the own plan)."""
    own = api.cached("model_windows", model["id"])["windows"]
    if not encoded:
        return own, own, []
    plan, ignored = plans.repair_plan(encoded, own)
    return plans.normalize_plan(plan, model["seq_len"]), own, ignored


def evaluate(model_id: str, plan: list, eval_set: str, sinks: int | None = None) -> dict:
    """POST /evaluate with per-token losses; identical plans are served from the cache (undo/redo).
    `sinks`: sink tokens other than the model's own (None: its own, not sent)."""
    extra = {} if sinks is None else {"sinks": sinks}
    return api.cached("evaluate", model_id, plan, eval_set=eval_set, per_token=True, **extra)


def metric_lines(result: dict) -> list[str]:
    return [
        f"loss {result['loss']:.4f} nats (model's own plan {result['baseline_loss']:.4f})",
        f"Δloss {result['delta']:+.4f} nats ({result['delta_pct']:+.2f} %)",
        f"perplexity {result['perplexity']:.3f}",
        f"acr {result['acr']:.3f} · causal_coverage {result['causal_coverage']:.3f}"
        f" · tile_coverage {result.get('tile_coverage', float('nan')):.3f}",
    ]


def editor_section(state: dict) -> Section:
    model = pick_model(state["model"])
    plan, own, _ = plan_for(model, state["plan"])
    result = evaluate(model["id"], plan, state["eval"], None if state["sinks"] < 0 else state["sinks"])
    figs: dict[str, go.Figure] = {
        "grid": figures.window_grid_figure(plan, changed=plans.changed_cells(own, plan), seq_len=model["seq_len"],
                                           title="window plan (red outline: changed vs the model's own plan)")}
    figs.update(editor_plots(model, result, state))
    if result.get("per_token"):
        figs["tokens"] = figures.token_delta_figure(result["per_token"]["tokens"], result["per_token"]["delta"])
    lines = metric_lines(result) + [f"model {model['name']} · eval set {result['eval_set']}",
                                    f"plan {plans.encode_plan(plan)}"]
    return Section(f"Window editor: {model['name']}", figs, lines)


EDITOR_METRICS = ("causal_coverage", "acr")  # the editor's "Coverage metric for plots", its first the default


def editor_plots(model: dict, result: dict, state: dict) -> dict[str, go.Figure]:
    """The editor's loss plot (and its stored-runs plot when the view asks), as the page opened from the
    view draws them: the allocation curve and the serving grains' points come only after an action in
    the page's session (a button, an expander), which a view does not hold."""
    metric = state["metric"] if state["metric"] in EDITOR_METRICS else EDITOR_METRICS[0]
    x = "kv_bytes" if state["xaxis"] == "kv_bytes" else metric
    own_info = api.cached("model_windows", model["id"])
    figs = {"loss": figures.loss_coverage_figure(x, result["eval_set"], [], live={"x": result[x], "y": result["loss"]},
                                                 baseline={"x": own_info[x], "y": result["baseline_loss"]})}
    if state["runsplot"]:
        figs["runs"] = figures.runs_coverage_figure(metric, run_points(metric))
    return figs


def run_points(metric: str) -> list[dict]:
    """Stored runs as (coverage, val_loss) points, each with its comparability group (model shape or
    source): runs' val_loss is measured on each run's own validation set, never on an editor eval set."""
    out = []
    for r in api.cached("runs", limit=500):
        s = r.get("summary") or {}
        if s.get(metric) is not None and s.get("val_loss") is not None:
            out.append({"x": s[metric], "y": s["val_loss"], "name": f"#{r['id']} {r['name']}",
                        "group": run_family(r)})
    return out


# -- attention ----------------------------------------------------------------------------------------


def window_request(choice: str) -> int | str | None:
    """The `window` argument of /attention for a state choice: "own", None (full) or an int."""
    return OWN_WINDOW if choice in ("", OWN_WINDOW) else plans.parse_window(choice)


CUSTOM_TEXT = "own"  # the `text` state value meaning "the user's own text" (kept out of links)
OWN_TEXT_MAX_CHARS = 100_000  # the API's limit for a posted text (read whole; shown seq_len tokens at a time)


def attention_data(state: dict, own_text: str | None = None, offset: int = 0) -> tuple[dict, dict, list[dict]]:
    """One head's maps on a bundled text, or on `own_text` from token `offset` when the state says so
    (POST /attention)."""
    model = pick_model(state["model"])
    texts = api.cached("model_texts", model["id"])
    window = window_request(state["window"])
    if state["text"] == CUSTOM_TEXT and own_text:
        data = api.cached("attention", model["id"], state["layer"], state["head"], text=own_text, window=window,
                          offset=offset)
        return model, data, texts
    text_id = state["text"] if state["text"] not in ("", CUSTOM_TEXT) else (texts[0]["id"] if texts else None)
    data = api.cached("attention", model["id"], state["layer"], state["head"], text_id=text_id, window=window)
    return model, data, texts


def span_note(data: dict) -> str | None:
    """What of the text the maps leave out, in words; None when they show all of it."""
    n, start, shown = data.get("text_tokens", data["n_tokens"]), data.get("offset", 0), data["n_tokens"]
    if shown >= n:
        return None
    before, after = start, n - start - shown
    return (f"Showing tokens {start + 1:,}–{start + shown:,} of {n:,}: the model reads {data['seq_len']:,} tokens "
            f"at a time, so {before:,} token(s) before and {after:,} after this span are not shown. "
            "Move the span with the slider.")


def attention_section_figures(data: dict, scale: str = "linear") -> dict[str, go.Figure]:
    w, tokens = data["window"], data["tokens"]
    at = dict(pool=data.get("pool", 1), offset=data.get("offset", 0))
    head = f"L{data['layer']}H{data['head']}"
    scale = scale if scale in attention_figures.SCALES else "linear"
    return {
        "full": attention_figures.attention_figure(data["full"], tokens, w, title=f"{head} full causal attention",
                                                   scale=scale, **at),
        "windowed": attention_figures.attention_figure(data["windowed"], tokens, w,
                                                       title=f"{head} with window {plans.window_label(w)}",
                                                       scale=scale, **at),
        "diff": attention_figures.attention_diff_figure(data["full"], data["windowed"], tokens, **at),
        "cut": attention_figures.cut_mass_figure(data["cut_mass"], tokens, **at),
    }


def layer_maps(state: dict, own_text: str | None, offset: int, n_head: int) -> list[dict]:
    """Every head's maps in the state's layer (one cached /attention call per head)."""
    return [attention_data({**state, "head": h}, own_text, offset)[1] for h in range(n_head)]


MULTIPLES_OPEN_UP_TO = 8  # heads per layer drawn as small multiples without asking (each is one API call)


def multiples_figure(state: dict, model: dict, own_text: str | None, offset: int, scale: str) -> go.Figure:
    """Every head of the state's layer as a small map, the state's head outlined."""
    maps = layer_maps(state, own_text, offset, model["n_head"])
    return attention_figures.head_multiples_figure([d["windowed"] for d in maps], [d["window"] for d in maps],
                                                   layer=state["layer"], pool=maps[0].get("pool", 1), scale=scale,
                                                   selected=state["head"])


TAU_RANGE = (0.5, 0.99)  # the retained-mass slider's range


def retained_figure(rm: dict, own: list, state: dict, seq_len: int) -> go.Figure:
    """The head's retained-mass curve (GET /retained_mass) against its assigned window, with τ."""
    layer, head = state["layer"], state["head"]
    return figures.retained_mass_figure(rm["buckets"], rm["mass"][layer][head], own[layer][head], seq_len,
                                        tau=state["tau"], title=f"L{layer}H{head}: mass within w keys")


def attention_diagnostics(model: dict, state: dict) -> dict[str, go.Figure]:
    """The Attention page's charts below the maps, as the page opened from the view draws them: the
    layer's small multiples (without asking up to MULTIPLES_OPEN_UP_TO heads), the retained mass and the
    sensitivity sweep where the view turns them on."""
    figs: dict[str, go.Figure] = {}
    scale = state["scale"] if state["scale"] in attention_figures.SCALES else "linear"
    if model["n_head"] <= MULTIPLES_OPEN_UP_TO:
        figs["heads"] = multiples_figure(state, model, None, 0, scale)
    if state["rm"]:
        own = api.cached("model_windows", model["id"])["windows"]
        tau = state["tau"] if TAU_RANGE[0] <= state["tau"] <= TAU_RANGE[1] else url_state.defaults("attention")["tau"]
        rm = api.cached("retained_mass", model["id"], text_id=state["text"] or None)
        figs["retained"] = retained_figure(rm, own, {**state, "tau": tau}, model["seq_len"])
    if state["sens"]:
        sens = api.cached("sensitivity", model["id"])
        k = state["bucket"] if 0 <= state["bucket"] < len(sens["buckets"]) else 0
        figs["sweep"] = figures.sensitivity_figure(sens["delta"], sens["buckets"], k)
    return figs


def attention_section(state: dict) -> Section:
    model, data, _ = attention_data(state)
    cut = [c for c in data["cut_mass"] if c is not None]
    lines = [f"model {model['name']} · layer {data['layer']} head {data['head']} · window "
             f"{plans.window_label(data['window'])} · {data['n_tokens']} tokens (pool {data.get('pool', 1)})",
             f"mean attention mass cut off per query: {sum(cut) / max(len(cut), 1):.3f}"]
    figs = {**attention_section_figures(data, state["scale"]), **attention_diagnostics(model, state)}
    return Section(f"Attention: layer {data['layer']}, head {data['head']}", figs, lines)


# -- runs, ACR curves, compare ------------------------------------------------------------------------


def split_series(series: dict[str, dict]) -> dict[str, tuple[list, list]]:
    """(steps, values) per key; a non-finite value (sent as its kind) is a gap: see `split_nonfinite`."""
    return {k: (v["step"], figures.finite(v["value"])) for k, v in series.items()}


def split_nonfinite(series: dict[str, dict]) -> dict[str, figures.NonFinitePoints]:
    """Each key's NaN and inf points, (step, kind), for the charts' markers."""
    return {k: figures.nonfinite_points(v) for k, v in series.items()}


CURVE_POINTS = 2000  # per series: the server keeps each step bucket's min and max and the last point


def acr_figures(run_id: int, keys: list[str], smoothing: float, min_step: int | None = None,
                max_step: int | None = None) -> tuple[dict, dict[str, go.Figure]]:
    """The run's figures; a step range asks the server for that range only (finer buckets, or every
    point when the range holds at most CURVE_POINTS per series)."""
    run = api.call("run", run_id)
    raw = api.call("run_metrics", run_id, min_step=min_step, max_step=max_step, max_points=CURVE_POINTS)["series"]
    series, marks = split_series(raw), split_nonfinite(raw)
    figs: dict[str, go.Figure] = {}
    chosen = {k: series[k] for k in keys if k in series}
    if chosen:
        figs["metrics"] = figures.metric_curves_figure(chosen, smoothing, title="metrics by step",
                                                       nonfinite={k: marks[k] for k in chosen})
    cov = {k: series[k] for k in COVERAGE_KEYS if k in series}
    if cov:
        figs["coverage"] = figures.metric_curves_figure(cov, 0.0, y_title="coverage (acr, causal_coverage, tile)",
                                                  title="coverage over training", y_range=(0, 1.05),
                                                  nonfinite={k: marks[k] for k in cov})
    frac = {k.split("/", 1)[1]: v for k, v in series.items() if k.startswith("window_frac/")}
    if frac:
        figs["fractions"] = figures.window_fraction_figure(frac)
    return run, figs


def acr_group_figure(run: dict, state: dict) -> go.Figure | None:
    """The run's group drawn as the ACR page's band control asks (None: no band chosen, no group, or
    no other run with these metrics); the page and its saved view (slide, deck) draw this same figure."""
    if not (run.get("group") and state.get("band")):
        return None
    keys = state["keys"] or ["val_loss"]
    own = split_series(api.call("run_metrics", run["id"], keys=keys, max_points=CURVE_POINTS)["series"])
    return group_views.run_group_figure(run, keys, state["band"], own, state["smooth"])


def acr_window_figure(latest: dict, shown: dict) -> go.Figure:
    """The run's window map at a step (GET /run_windows), its heads outlined where they differ from the
    latest plan: the ACR page and its saved view's slide draw this same figure."""
    changed = plans.changed_cells(latest["windows"], shown["windows"])
    return figures.window_grid_figure(shown["windows"], changed=changed,
                                      title=f"window map at step {shown['step']} (outlined: differs from the latest)")


def acr_section(state: dict) -> Section:
    run, figs = acr_figures(state["run"], state["keys"], state["smooth"])
    group = acr_group_figure(run, state)
    if group is not None:
        figs["group"] = group
    try:
        latest = api.cached("run_windows", state["run"])
        figs["windows"] = acr_window_figure(latest, latest if state["step"] < 0 else
                                            api.cached("run_windows", state["run"], step=state["step"]))
    except api.ApiError:
        pass  # runs without window maps (e.g. paper reference figures) simply have no map panel
    return Section(f"Run #{run['id']} {run['name']}", figs, run_lines(run))


def run_lines(run: dict) -> list[str]:
    s = run.get("summary") or {}
    parts = [f"{k} {v:.4g}" for k, v in s.items() if isinstance(v, (int, float)) and not k.startswith("window_frac")]
    return [f"status {run['status']} · preset {run.get('preset')} · experiment {run.get('experiment')}",
            " · ".join(parts[:8])]


def compare_data(state: dict) -> dict:
    return api.call("compare_runs", state["runs"], keys=state["keys"] or None, agg=state["agg"],
                    step=state["step"] if state["agg"] == "at_step" else None, max_points=CURVE_POINTS)


def compare_figures(data: dict, keys: list[str], smoothing: float) -> dict[str, go.Figure]:
    """Curves per metric key and per model family: runs of different models never share an axis."""
    names = {str(r["id"]): f"#{r['id']} {r['name']}" for r in data["runs"]}
    family = {str(r["id"]): run_family(r) for r in data["runs"]}
    figs = {}
    for key in keys:
        for fam in dict.fromkeys(family.values()):
            shown = {names.get(rid, rid): s[key] for rid, s in data.get("series", {}).items()
                     if key in s and family.get(rid) == fam}
            if shown:
                figs[f"{key} · {fam}"] = figures.metric_curves_figure(
                    split_series(shown), smoothing, y_title=figures.coverage_label(key), title=f"{key} · {fam}",
                    nonfinite=split_nonfinite(shown))
    return figs


def compare_table(data: dict) -> pd.DataFrame:
    """One row per run: its model family, then each key's aggregated value; with agg=at_step, beside each
    value the stored step it was read at (the last one at or before the asked step)."""
    runs = {r["id"]: r for r in data["runs"]}
    rows = []
    for row in data["table"]:
        run = runs.get(row["run_id"], {})
        out = {"run": f"#{row['run_id']} {run.get('name', '')}", "model": run_family(run) if run else ""}
        for key, value in row["values"].items():
            out[key] = value
            if row.get("steps") is not None:
                out[f"{key} @ step"] = row["steps"].get(key)
        rows.append(out)
    return pd.DataFrame(rows)


def window_diff(a: int, b: int) -> tuple[go.Figure, int]:
    d = api.call("windows_diff", {"run_id": a, "step": None}, {"run_id": b, "step": None})
    return figures.window_diff_figure(d["a"], d["b"], d["changed"], names=(f"run #{a}", f"run #{b}")), d["n_changed"]


def diff_partners(a: int, mapped: list[int], by_id: dict[int, dict]) -> tuple[list[int], list[int]]:
    """The runs that can be B beside A: those of A's plan shape first, then the others."""
    same = [i for i in mapped if i != a and plan_shape(by_id[i]) == plan_shape(by_id[a])]
    return same, [i for i in mapped if i != a and i not in same]


def diff_pair(state: dict, by_id: dict[int, dict]) -> tuple[int, int] | None:
    """The two runs whose window maps Compare diffs, as the page picks them: the view's diffa and diffb
    where they are among its runs, else the first run with a map and the first of its shape."""
    mapped = [i for i in state["runs"] if i in by_id and not by_id[i].get("read_only")]
    if len(mapped) < 2:
        return None
    a = state["diffa"] if state["diffa"] in mapped else mapped[0]
    same, others = diff_partners(a, mapped, by_id)
    return a, state["diffb"] if state["diffb"] in same + others else (same + others)[0]


def compare_section(state: dict) -> Section:
    if state.get("mode") == "reproduction":
        corpora = study_views.suites().get(state["suite"], {})
        return group_views.reproduction_section(study_views.experiment_of(state["suite"], state.get("corpus")),
                                                state["rkey"], corpora)
    if state.get("mode") == "groups":
        return group_views.groups_section(state["groups"], state["keys"], state["band"])
    data = compare_data(state)
    figs = compare_figures(data, data["keys"], state["smooth"])
    pair = diff_pair(state, {r["id"]: r for r in api.call("runs", limit=500)})  # as the page lists them
    if pair:
        try:
            figs["diff"], _ = window_diff(*pair)
        except api.ApiError:
            pass  # runs without stored window maps cannot be diffed
    lines = [f"{row['run']}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in row.items() if k != "run")
             for row in compare_table(data).to_dict("records")]
    return Section(f"Compare runs ({state['agg']})", figs, lines)


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


SECTIONS: dict[str, Callable[[dict], Section]] = {
    "editor": editor_section, "attention": attention_section, "acr": acr_section,
    "compare": compare_section, "runs": run_views.runs_section,
}


def build_section(page: str, state: dict) -> Section:
    """The Section for a saved view: its page and state (unknown fields ignored, missing defaulted)."""
    if page not in SECTIONS:
        raise ValueError(f"a view of page {page!r} cannot be shown; known pages: {', '.join(SECTIONS)}")
    return SECTIONS[page](url_state.coerce_state(page, state))
