"""Compare any number of runs: a metric table with a chosen aggregation, overlaid curves, and the
window-map diff of two of them with changed heads outlined."""

import streamlit as st

from frontend import api, components as C, views

PAGE = "compare"
AGGS = ["last", "min", "max", "at_step"]
st.title("Compare runs")
state = C.bind_state(PAGE)

with api.guard("loading runs", stop=True), st.spinner("Loading runs..."):
    c0 = st.columns([1, 5])[0]
    c0.toggle("Paper reference", key=C.key(PAGE, "paper"), help="include the paper's reported figures")
    runs = [r for r in api.call("runs", limit=500)
            if st.session_state[C.key(PAGE, "paper")] or not r.get("read_only")]
    labels = {r["id"]: f"#{r['id']} {r['name']}" + (" (paper)" if r.get("read_only") else "") for r in runs}
    k = C.key(PAGE, "runs")
    st.session_state[k] = [i for i in st.session_state[k] if i in labels] or list(labels)[:2]
    chosen = st.multiselect("Runs (any number)", list(labels), format_func=labels.get, key=k)
    metric_keys = sorted({m for r in runs if r["id"] in chosen for m in (r.get("summary") or {})
                          if not m.startswith("window_frac/")}) or ["val_loss"]
    kk = C.key(PAGE, "keys")
    st.session_state[kk] = [m for m in st.session_state[kk] if m in metric_keys] or metric_keys[:1]
    c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
    c1.multiselect("Metrics", metric_keys, key=kk)
    C.ensure_option(PAGE, "agg", AGGS)
    agg = c2.selectbox("Aggregation", AGGS, key=C.key(PAGE, "agg"))
    c3.number_input("Step", 0, 10**9, key=C.key(PAGE, "step"), disabled=agg != "at_step")
    c4.slider("EMA smoothing", 0.0, 0.99, key=C.key(PAGE, "smooth"), step=0.01)
    state = C.current_state(PAGE)
    C.publish(PAGE, state)
    if not chosen:
        C.placeholder("Pick at least one run.")
        st.stop()

with api.guard("comparing"), st.spinner(f"Comparing {len(chosen)} runs..."):
    data = views.compare_data(state)
    st.dataframe(views.compare_table(data), hide_index=True)
    figs = views.compare_figures(data, data["keys"], state["smooth"])
    cols = st.columns(2)
    for i, (name, fig) in enumerate(figs.items()):
        with cols[i % 2]:
            C.show_figure(fig, f"compare._curve.{name}")

with api.guard("window-map diff"):
    mapped = [i for i in chosen if not next((r for r in runs if r["id"] == i), {}).get("read_only")]
    if len(mapped) >= 2:
        c1, c2 = st.columns(2)
        a = c1.selectbox("Window map A", mapped, format_func=labels.get, key="compare._a")
        b = c2.selectbox("Window map B", mapped, index=1, format_func=labels.get, key="compare._b")
        fig, n = views.window_diff(a, b)
        C.show_figure(fig, "compare._diff")
    else:
        st.caption("Pick two runs with window maps (ours, not the paper's figures) to see their diff.")

C.share_bar(PAGE, state, lambda: views.compare_section(state))
