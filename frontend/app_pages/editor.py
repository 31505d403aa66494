"""Window editor: change any head's window and watch the loss move."""

import streamlit as st

from frontend import (
    api,
    components,
    editor_panel,
    figures,
    generate_panel,
    history,
    plans,
    retrieval_panel,
    serving_panel,
    views,
)

PAGE = "editor"
st.title("Window editor")
state = components.bind_state(PAGE)

with api.guard("loading models", stop=True), st.spinner("Loading models from the API..."):
    models = api.cached("models")
    if not models:
        components.unavailable_models_note()
        components.placeholder("The API lists no models yet. Register the demo checkpoint (see README) and reload.")
        st.stop()
    ids = [m["id"] for m in models]
    components.ensure_option(PAGE, "model", ids, "no such model")
    c1, c2, c3 = st.columns([3, 1, 2])
    names = {m["id"]: f"{m['name']} ({m.get('family', 'aah')}, {m['n_layer']}×{m['n_head']} heads, T={m['seq_len']})"
             for m in models}
    model_id = c1.selectbox("Model", ids, format_func=names.get, key=components.key(PAGE, "model"))
    components.unavailable_models_note(c1)
    components.ensure_option(PAGE, "eval", list(editor_panel.EVAL_SETS))
    c2.selectbox("Eval set", list(editor_panel.EVAL_SETS), key=components.key(PAGE, "eval"))
    components.ensure_option(PAGE, "metric", ["causal_coverage", "acr"])
    c3.selectbox("Coverage metric for plots", ["causal_coverage", "acr"], key=components.key(PAGE, "metric"))
    model = next(m for m in models if m["id"] == model_id)
    c1.caption(views.model_caption(model))
    # the cold open: filled after the panel by its own fragment, so neither the first loss nor the
    # script run waits for the sweep; its height is reserved now, so the map never moves when it arrives
    opening = st.container(height=100, border=False)
    own_info = api.cached("model_windows", model_id)
    for_this_model = state["model"] in ("", model_id)
    url_plan, own, ignored = views.plan_for(model, state["plan"] if for_this_model else "")
    if state["plan"] and not for_this_model:  # said, not dropped silently: it was made for another model
        ignored = [f"plan={state['plan'][:40]} (made for model {state['model'][:40]}, not the one shown)"]
    components.link_ignored(PAGE, "plan", ignored)
    editor_panel.plan_history(model, own, url_plan)
    # in the page body, not the panel fragment: a warning written by a fragment is cleared by its next rerun
    editor_panel.check_head(model)


PANEL = "editor.panel"  # the panel fragment's key: an edit made on the map reruns it (frontend/head_editor.py)


@st.fragment(key=PANEL)
def panel() -> None:
    """Everything an edit touches; an edit reruns only this fragment, not the page. The plan is
    evaluated and its loss sent first, into its place below the edit widgets, so the browser draws
    the new loss before it redraws the widgets and charts (bench/ui.py: click -> new loss)."""
    hist = editor_panel.plan_history(model, own, url_plan)
    history_slot = st.container()  # filled after the edits, so it shows this run's edit
    # a plain expander: opening it is the browser's own business, not a rerun that meets the user's clicks
    # (its widgets are light); its Apply button edits the plan in this run: before the evaluation
    with st.expander("Bulk edits and presets"):
        editor_panel.preset_editor(model, own, hist, st.session_state[components.key(PAGE, "metric")])
        editor_panel.bulk_editor(model, hist)
    sinks = editor_panel.sink_editor(model)
    cell_slot, metrics_slot = st.container(), st.container()
    result = None
    with metrics_slot, api.guard("evaluating the plan"), st.spinner("Evaluating the plan..."):
        result = views.evaluate(model_id, hist.current, st.session_state[components.key(PAGE, "eval")], sinks)
        components.metric_badges(result, figures.kv_group_note(hist.current, own, int(own_info.get("n_kv_head")
                                                                                                  or model["n_head"])))
    with metrics_slot:
        serving_panel.serving_table(model, hist, st.session_state[components.key(PAGE, "eval")], editor_panel.commit)
    st.session_state[components.key(PAGE, "plan")] = "" if hist.current == own else plans.encode_plan(hist.current)
    with cell_slot:
        heads(hist, model["n_head"] // int(own_info.get("n_kv_head") or model["n_head"]))
    with history_slot:
        editor_panel.history_buttons(hist)
    live = components.current_state(PAGE)
    components.publish(PAGE, live)
    charts(hist, result, live["metric"])
    generate_panel.generate_panel(model, hist.current)
    retrieval_panel.retrieval_panel(model, hist.current)
    components.share_bar(PAGE, live, lambda: views.editor_section(live))


@st.fragment(key="editor.heads")
def heads(hist: history.PlanHistory, kv_group: int) -> None:
    """The map and pills in a fragment of their own, inside the panel's: a head picked on the map reruns
    only this (and sends the URL, which names the head), so the edit that follows it never waits behind
    a run of the whole panel; an edit reruns the panel (PANEL)."""
    editor_panel.cell_editor(model, own, hist, kv_group, on_edit=PANEL)
    components.publish(PAGE)


@st.fragment
def charts(hist: history.PlanHistory, result: dict | None, metric: str) -> None:
    """The table and the charts, in a fragment inside the panel's: an edit redraws them with the panel,
    and a new session's first paint reruns them alone (the loss and the map are not run again)."""
    left, right = st.columns([3, 2])
    if not components.first_paint_done(PAGE):
        left.caption("Drawing the charts...")
        return
    with left:
        editor_panel.table_editor(model, hist)
    with right:
        if result:
            editor_panel.live_plot(model, own_info, result, metric)
    if result and result.get("per_token"):
        pt = result["per_token"]
        components.show_figure(figures.token_delta_figure(pt["tokens"], pt["delta"]), "editor._strip")
    components.publish(PAGE)  # its x axis and stored-runs plot are view fields, changed in this fragment's runs


@st.fragment
def opening_line() -> None:
    """The cold open's sentence in its own fragment: its timer (while the sweep runs) reruns it alone."""
    editor_panel.opening_line(model, st.session_state[components.key(PAGE, "eval")])


panel()
with opening:
    opening_line()
