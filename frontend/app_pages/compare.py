"""Compare any number of runs: a metric table with a chosen aggregation, overlaid curves, and the
window-map diff of two of them with changed heads outlined."""

import streamlit as st

from frontend import api, comparable, components, group_panels, user_text, views

PAGE = "compare"
AGGS = ["last", "min", "max", "at_step"]
MODES = {"runs": "Runs", "groups": "Groups of seeds (mean and band)", "reproduction": "Reproduction vs the paper"}
st.title("Compare runs")
state = components.bind_state(PAGE)
components.ensure_option(PAGE, "mode", list(MODES))
mode = st.radio("Compare", list(MODES), format_func=MODES.get, key=components.key(PAGE, "mode"), horizontal=True)

if mode != "runs":
    with api.guard("loading groups", stop=True), st.spinner("Loading groups..."):
        if mode == "groups":
            group_panels.groups_panel(PAGE, api.call("runs", limit=1000))
        else:
            group_panels.reproduction_panel(PAGE)
    state = components.current_state(PAGE)
    components.publish(PAGE, state)
    components.share_bar(PAGE, state, lambda: views.compare_section(state))
    st.stop()

with api.guard("loading runs", stop=True), st.spinner("Loading runs..."):
    c0 = st.columns([1, 5])[0]
    c0.toggle("Paper reference", key=components.key(PAGE, "paper"), help="include the paper's reported figures")
    runs = [r for r in api.call("runs", limit=500)
            if st.session_state[components.key(PAGE, "paper")] or not r.get("read_only")]
    labels = {r["id"]: f"#{r['id']} {r['name']} · {comparable.run_family(r)}" for r in runs}
    k = components.key(PAGE, "runs")
    # by default, runs of one model only (the first listed run's): never a tiny run beside a 0.5 B one
    st.session_state[k] = (components.keep_known(PAGE, "runs", list(labels), "not among the listed runs")
                           or comparable.default_selection(runs))
    chosen = st.multiselect("Runs (any number)", list(labels), format_func=labels.get, key=k)
    metric_keys = sorted({m for r in runs if r["id"] in chosen for m in (r.get("summary") or {})
                          if not m.startswith("window_frac/")}) or ["val_loss"]
    kk = components.key(PAGE, "keys")
    st.session_state[kk] = [m for m in st.session_state[kk] if m in metric_keys] or metric_keys[:1]
    c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
    c1.multiselect("Metrics", metric_keys, key=kk)
    components.ensure_option(PAGE, "agg", AGGS)
    agg = c2.selectbox("Aggregation", AGGS, key=components.key(PAGE, "agg"))
    c3.number_input("Step", 0, 10**9, key=components.key(PAGE, "step"), disabled=agg != "at_step")
    c4.slider("EMA smoothing", 0.0, 0.99, key=components.key(PAGE, "smooth"), step=0.01)
    state = components.current_state(PAGE)
    components.publish(PAGE, state)
    if not chosen:
        components.placeholder("Pick at least one run.")
        st.stop()
    fams = comparable.families([r for r in runs if r["id"] in chosen])
    if len(fams) > 1:
        families = user_text.md("; ".join(fams))
        st.info(f"These runs come from {len(fams)} different models ({families}); their numbers are not "
                "comparable, so each model's curves get their own axes and the table names each run's model.",
                icon="ℹ️")

with api.guard("comparing"), st.spinner(f"Comparing {len(chosen)} runs..."):
    data = views.compare_data(state)
    if agg == "at_step":
        st.caption(f"At step {state['step']}: each value is the run's last stored one at or before that step; "
                   "the “@ step” columns say which step it is (empty: the series starts later).")
    st.dataframe(views.compare_table(data), hide_index=True)
    figs = views.compare_figures(data, data["keys"], state["smooth"])
    cols = st.columns(2)
    for i, (name, fig) in enumerate(figs.items()):
        with cols[i % 2]:
            components.show_figure(fig, f"compare._curve.{name}")

with api.guard("window-map diff"):
    by_id = {r["id"]: r for r in runs}
    mapped = [i for i in chosen if not by_id[i].get("read_only")]
    if len(mapped) >= 2:
        c1, c2 = st.columns(2)
        ka, kb = components.key(PAGE, "diffa"), components.key(PAGE, "diffb")
        if st.session_state.get(ka) not in mapped:
            st.session_state[ka] = mapped[0]  # 0 (the default) or a run no longer chosen: the first
        a = c1.selectbox("Window map A", mapped, format_func=labels.get, key=ka)
        same, others = views.diff_partners(a, mapped, by_id)
        if st.session_state.get(kb) not in same + others:
            st.session_state[kb] = (same + others)[0]  # the default: the first run of A's shape
        b = c2.selectbox("Window map B", same + others, format_func=labels.get, key=kb)
        sa, sb = comparable.plan_shape(by_id[a]), comparable.plan_shape(by_id[b])
        if sa is None or sa != sb:
            shape = {None: "an unrecorded shape"} | {s: f"{s[0]} layers × {s[1]} heads" for s in (sa, sb) if s}
            components.placeholder(f"Run #{a} has {shape[sa]} and run #{b} {shape[sb]}: window maps of different shapes "
                                   "cannot be diffed. Pick two runs of one model.")
        else:
            try:
                fig, n = views.window_diff(a, b)
                components.show_figure(fig, "compare._diff")
            except api.ApiError as exc:  # e.g. a tracked run that stored no window map
                components.placeholder(f"No window-map diff for runs #{a} and #{b}: {user_text.md(exc.detail)}")
    else:
        st.caption("Pick two runs with window maps (ours, not the paper's figures) to see their diff.")

state = components.current_state(PAGE)  # with the diff's pair, chosen above
components.publish(PAGE, state)
components.share_bar(PAGE, state, lambda: views.compare_section(state))
