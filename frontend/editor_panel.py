"""The window editor's interactive panel (grid, cell and bulk edits, presets, undo/redo) and the
callbacks that turn widget events into new plans. Kept out of the page file so the page stays layout."""

from __future__ import annotations

from typing import Any

import streamlit as st

from frontend import api, cold_open, components, figures, head_editor, history, plans, rerun_timer, serving_panel, views

PAGE = "editor"
EVAL_SETS = ("mixed", "text", "english", "copy")  # the API's EvalSet; english: the bundled English text
PRESETS = ["model's own plan", "all full", "uniform window", "k full heads per layer",
           "budgeted allocation", "controller's plan (training run)"]


# How often the browser asks whether the sweep has come back, while it runs. Rarely: in one loaded test run
# a click on a button outside this fragment, made about when the fragment reran, never took effect (cause
# not proven; issue 23), and at 0.4 s the browser tests' 400 ms "settled" wait could end just as it reran.
OPENING_POLL_S = 1.0


def opening_line(model: dict, eval_set: str) -> None:
    """The cold open's sentence, from the model's own numbers: the one-head sweep (cached by the server
    after the first time), or for a large model the retained-mass curves (one forward pass). Both run in
    a worker thread (api.in_background); until the answer is there this says so and asks the browser
    to rerun it (the page calls it in a fragment of its own), so no run of the page waits for it."""
    with api.guard("the opening line"):
        if model["n_layer"] * model["n_head"] <= cold_open.SWEEP_LIMIT:
            sens = api.ready("sensitivity", model["id"], eval_set)
            line = sens and cold_open.from_sensitivity(sens["delta"], sens["buckets"])
            line = line and line + cold_open.held_out_clause(sens)
            pending = sens is None
        else:
            rm = api.ready("retained_mass", model["id"])
            line = rm and cold_open.from_retained_mass(rm["mass"], rm["buckets"])
            pending = rm is None
        if pending:
            st.caption("Finding the head to try first...")
            rerun_timer.rerun_after(OPENING_POLL_S)
        elif line:
            st.info(line, icon="👋")


def plan_history(model: dict, own: list, url_plan: list) -> history.PlanHistory:
    """The edit history for this model in this session (created from the URL's plan on first use)."""
    k = f"editor._hist.{model['id']}"
    if k not in st.session_state:
        hist = history.PlanHistory(base=own)
        hist.push(url_plan)
        st.session_state[k] = hist
    return st.session_state[k]


def labels(model: dict, plan: list) -> list[str]:
    """Bucket labels offered for a cell: the model's buckets plus any window already in the plan."""
    ws = set(model.get("buckets") or []) | {w for row in plan for w in row}
    return [plans.window_label(w) for w in sorted((w for w in ws if w is not None))] + [plans.FULL]


def commit(hist: history.PlanHistory, plan: list) -> None:
    hist.push(plans.normalize_plan(plan))


def _on_table(hist: history.PlanHistory, tkey: str) -> None:
    """The table's edits, each a "set this cell" applied to the current plan."""
    commit(hist, plans.apply_table_edits(hist.current, (st.session_state.get(tkey) or {}).get("edited_rows", {})))


def check_head(model: dict) -> None:
    """The bound layer and head are the model's (a link's bad ones are reported, then replaced)."""
    n_layer, n_head = model["n_layer"], model["n_head"]
    components.ensure_option(PAGE, "layer", list(range(n_layer)), f"this model has layers 0-{n_layer - 1}")
    components.ensure_option(PAGE, "head", list(range(n_head)), f"this model has heads 0-{n_head - 1}")


def cell_editor(model: dict, own: list, hist: history.PlanHistory, kv_group: int = 1, on_edit: str | None = None) -> None:
    """The window map, the picked head's window pills and a typed window (frontend/head_editor.py):
    one browser-side component, so a pill always edits the head it is shown for. `kv_group`: query
    heads per KV head (grouped-query attention), drawn on the map; `on_edit`: the key of the fragment
    an edit reruns (head_editor.head_editor)."""
    lkey, hkey = components.key(PAGE, "layer"), components.key(PAGE, "head")
    head_editor.head_editor(model, hist, own, labels(model, hist.current),
                            (st.session_state[lkey], st.session_state[hkey]), lkey, hkey, kv_group, on_edit)


def sink_editor(model: dict) -> int | None:
    """The sink tokens to evaluate with (StreamingLLM: every head also sees the first s tokens): a number
    input starting at the model's own count. None while it is the model's own (the API's default)."""
    own = int(model.get("sinks") or 0)
    # a view field (`sinks`, -1: the model's own); the box is keyed by model, so another model starts
    # from its own count, or from the link's
    field, k = components.key(PAGE, "sinks"), f"{components.key(PAGE, 'sinks')}.{model['id']}"
    if k not in st.session_state:
        linked = st.session_state.get(field, -1)
        ok = 0 <= linked <= int(model["seq_len"])
        components.link_ignored(PAGE, "sinks", [] if ok or linked == -1 else
                                [f"sinks={linked} (not within 0..{model['seq_len']}; showing the model's own {own})"])
        st.session_state[k] = linked if ok else own
    sinks = int(st.number_input(
        "Sink tokens", min_value=0, max_value=int(model["seq_len"]), step=1, key=k,
        help=f"Every head also sees the first N tokens besides its window. This model was trained with {own}."))
    st.session_state[field] = -1 if sinks == own else sinks
    return None if sinks == own else sinks


def _on_bulk(hist: history.PlanHistory, what: str) -> None:
    """Set a whole layer or head index from the bulk widgets' current values. A callback, so the
    history (Undo, the caption) already holds the edit when the panel draws."""
    if what == "layer":
        index, w = st.session_state["editor._bulk_layer"], st.session_state["editor._bulk_lw"]
        commit(hist, plans.set_layer(hist.current, index, plans.parse_window(w)))
    else:
        index, w = st.session_state["editor._bulk_head"], st.session_state["editor._bulk_hw"]
        commit(hist, plans.set_head(hist.current, index, plans.parse_window(w)))


def bulk_editor(model: dict, hist: history.PlanHistory) -> None:
    """Set a whole layer or a whole head index at once."""
    opts = labels(model, hist.current)
    c1, c2, c3, c4 = st.columns([1, 1, 1, 1])
    c1.selectbox("Whole layer", list(range(model["n_layer"])), key="editor._bulk_layer")
    c2.selectbox("to window", opts, key="editor._bulk_lw")
    c2.button("Set layer", key="editor._set_layer", on_click=_on_bulk, args=(hist, "layer"))
    c3.selectbox("Whole head index", list(range(model["n_head"])), key="editor._bulk_head")
    c4.selectbox("to window ", opts, key="editor._bulk_hw")
    c4.button("Set head", key="editor._set_head", on_click=_on_bulk, args=(hist, "head"))


def preset_editor(model: dict, own: list, hist: history.PlanHistory, metric: str) -> None:
    opts = labels(model, hist.current)
    c1, c2, c3 = st.columns([2, 2, 1])
    choice = c1.selectbox("Preset", PRESETS, key="editor._preset")
    params: dict[str, Any] = {}
    if choice in ("uniform window", "k full heads per layer"):
        params["w"] = c2.selectbox("window", opts[:-1] or opts, key="editor._preset_w")
    if choice == "k full heads per layer":
        params["k"] = c2.number_input("k", 0, model["n_head"], 1, key="editor._preset_k")
    if choice == "budgeted allocation":
        params["budget"] = c2.slider(f"budget ({metric})", 0.05, 1.0, 0.5, 0.05, key="editor._budget")
    if c3.button("Apply preset", key="editor._apply"):
        with api.guard(f"applying “{choice}”"):
            plan = preset_plan(choice, model, own, metric, params)
            if plan is not None:
                commit(hist, plan)
    note = st.session_state.get(f"editor._allocated.{model['id']}")
    if note:
        st.caption(note)


def preset_plan(choice: str, model: dict, own: list, metric: str, params: dict) -> list | None:
    n_layer, n_head = model["n_layer"], model["n_head"]
    if choice == "model's own plan":
        return own
    if choice == "all full":
        return plans.uniform(n_layer, n_head, None)
    if choice == "uniform window":
        return plans.uniform(n_layer, n_head, plans.parse_window(params["w"]))
    if choice == "k full heads per layer":
        return plans.k_full_per_layer(own, int(params["k"]), plans.parse_window(params["w"]))
    if choice == "budgeted allocation":
        with st.spinner(f"Allocating windows at {metric} ≤ {params['budget']:.2f} (the server evaluates candidates)..."):
            res = api.call("allocate", model["id"], float(params["budget"]), metric=metric, eval_set=_eval_set())
        st.session_state[_curve_key(model["id"], metric)] = res.get("curve", [])
        st.session_state[f"editor._allocated.{model['id']}"] = allocation_note(res)
        return res["windows"]
    if model.get("run_id") is None:
        st.warning("This model has no training run in the store, so there is no controller plan to load.")
        return None
    return api.call("run_windows", model["run_id"])["windows"]


def allocation_note(res: dict) -> str:
    """Both numbers of an allocation: Δloss on the set it chose on (in-sample) and on the held-out set."""
    chosen = f"Δloss {res['loss'] - res['baseline_loss']:+.4f} on {res['eval_set']}, where it was chosen (in-sample)"
    if res.get("held_out_loss") is None:
        return f"Allocated plan: {chosen}; this model has no held-out set to check it on."
    held = res["held_out_loss"] - res["held_out_baseline_loss"]
    return f"Allocated plan: {chosen} · Δloss {held:+.4f} on held-out {res['held_out']} (not used to choose)."


def _eval_set() -> str:
    return st.session_state.get(components.key(PAGE, "eval"), "mixed")


def _curve_key(model_id: str, metric: str) -> str:
    """An allocation curve's losses hold for one eval set and its path for one metric: key it by both,
    so switching either never plots a stale curve beside the live point."""
    return f"editor._curve.{model_id}.{_eval_set()}.{metric}"


def history_buttons(hist: history.PlanHistory) -> None:
    c1, c2, c3, c4 = st.columns([1, 1, 1, 4])
    # callbacks: the change is made before anything is drawn, so the buttons and caption never lag
    c1.button("↶ Undo", key="editor._undo", disabled=not hist.can_undo, on_click=hist.undo)
    c2.button("↷ Redo", key="editor._redo", disabled=not hist.can_redo, on_click=hist.redo)
    c3.button("Reset", key="editor._reset", help="back to the model's own plan (undoable)", on_click=hist.reset)
    n = sum(map(sum, plans.changed_cells(hist.base, hist.current)))
    c4.caption(f"{n} head(s) differ from the model's own plan · step {hist.pos} of {len(hist.stack) - 1}")


def table_editor(model: dict, hist: history.PlanHistory) -> None:
    """The plan as a table of select boxes, built while its expander is open only: the data grid is
    1.4 MB of the browser's code, and drawn with the charts of a new session it held them up by about
    1.4 s (bench/ui.py cold opens, with and without it, alternating: every chart drawn p50 5.1 s vs 3.8 s).
    Opening it reruns the charts' fragment, not the map's."""
    with components.lazy_expander("Edit as a table", "editor._table_open") as box:
        if box.open:
            _table(model, hist)


def _table(model: dict, hist: history.PlanHistory) -> None:
    import pandas as pd

    opts = labels(model, hist.current)
    df = pd.DataFrame([[plans.window_label(w) for w in row] for row in hist.current],
                      columns=[f"H{h}" for h in range(model["n_head"])],
                      index=[f"L{l}" for l in range(model["n_layer"])])
    # keyed by the plan it shows (what its edits are relative to): a new plan gets a fresh table, and a
    # replayed value of an earlier table belongs to a key that no longer exists, so it edits nothing
    tkey = f"editor._table.{model['id']}.{plans.encode_plan(hist.current)}"
    cols = {c: st.column_config.SelectboxColumn(c, options=opts, required=True) for c in df.columns}
    st.data_editor(df, key=tkey, column_config=cols, on_change=_on_table, args=(hist, tkey))


def live_plot(model: dict, own_info: dict, result: dict, metric: str) -> None:
    ckey = _curve_key(model["id"], metric)
    with api.guard("the allocation curve"):
        if not st.session_state.get(ckey) and st.button(
                "Draw the allocation curve", key="editor._curvebtn",
                help="runs the allocator from full attention down to 10 % coverage; the plan is not changed"):
            with st.spinner("Running the allocator (the server evaluates candidate plans)..."):
                res = api.call("allocate", model["id"], 0.1, metric=metric, eval_set=_eval_set())
            st.session_state[ckey] = res.get("curve", [])
    components.ensure_option(PAGE, "xaxis", ["coverage", "kv_bytes"])
    axis = st.radio("x axis", ["coverage", "kv_bytes"], horizontal=True, key=components.key(PAGE, "xaxis"),
                    format_func=lambda m: "KV cache bytes" if m == "kv_bytes" else metric)
    x = metric if axis == "coverage" else axis
    curve = [{"x": p[x], "y": p["loss"]} for p in st.session_state.get(ckey) or [] if p.get(x) is not None]
    fig = figures.loss_coverage_figure(x, result["eval_set"], curve, live={"x": result[x], "y": result["loss"]},
                                       baseline={"x": own_info[x], "y": result["baseline_loss"]},
                                       rounded=serving_panel.rounded_points(model["id"], result["eval_set"],
                                                                            result["windows"], x))
    components.show_figure(fig, "editor._lossplot")
    if st.toggle("Stored runs: val_loss vs coverage", key=components.key(PAGE, "runsplot"),
                 help="a separate plot: a run's val_loss is measured on its own validation set"):
        with api.guard("loading runs for the coverage plot"):
            st.caption("Not on the plot above: a run's val_loss is measured on its own validation set, "
                       f"not on eval set {result['eval_set']}. Runs are grouped by model shape.")
            components.show_figure(figures.runs_coverage_figure(metric, views.run_points(metric)), "editor._runsplot")
