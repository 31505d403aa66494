"""Runs: the run store as a filterable table, launching a training job and watching it."""

import streamlit as st

from frontend import api, components as C, jobs, views
from frontend import run_table as R

PAGE = "runs"
STATUSES = ["", "SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED"]
st.title("Runs")
state = C.bind_state(PAGE)

c1, c2, c3, c4 = st.columns([2, 1, 1, 2])
c1.text_input("Experiment", key=C.key(PAGE, "experiment"), placeholder="all experiments")
C.ensure_option(PAGE, "status", STATUSES)
c2.selectbox("Status", STATUSES, key=C.key(PAGE, "status"), format_func=lambda s: s or "any")
c3.text_input("Preset", key=C.key(PAGE, "preset"), placeholder="any")
c4.text_input("Search name / preset / id", key=C.key(PAGE, "q"))
c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
c1.toggle("All params", key=C.key(PAGE, "allparams"), help="off: only params that differ between the listed runs")
c2.toggle("Paper reference", key=C.key(PAGE, "paper"), help="the paper's reported Table 1/2 figures (read-only)")
max_loss = c3.number_input("Max val_loss", 0.0, 100.0, 0.0, 0.1, key="runs._maxloss", help="0 = no limit")
cov = c4.slider("causal_coverage range", 0.0, 1.0, (0.0, 1.0), 0.01, key="runs._cov")
state = C.current_state(PAGE)
C.publish(PAGE, state)
baseline: dict[int, str] = {}

with api.guard("loading runs"), st.spinner("Loading runs..."):
    baseline = jobs.snapshot()  # before the table reads the runs: see jobs.snapshot
    runs = api.call("runs", experiment=state["experiment"] or None, preset=state["preset"] or None,
                    status=state["status"] or None, limit=500)
    if not state["paper"]:
        runs = [r for r in runs if not r.get("read_only")]
    runs = R.filter_runs(runs, state["q"], max_loss or None, cov)
    if runs:
        st.dataframe(views.runs_frame(runs, state["allparams"]), hide_index=True, key="runs._table",
                     column_config={"val_loss": st.column_config.NumberColumn(format="%.4f"),
                                    "acr": st.column_config.NumberColumn(format="%.3f"),
                                    "causal_coverage": st.column_config.NumberColumn(format="%.3f")})
        labels = {r["id"]: f"#{r['id']} {r['name']}" for r in runs}
        chosen = st.multiselect("Selected runs", list(labels), format_func=labels.get, key="runs._chosen")
        if chosen:
            links = [f"[ACR curves of #{i}](acr?run={i})" for i in chosen]
            if len(chosen) > 1:
                links.append(f"[compare {len(chosen)} runs](compare?runs={','.join(map(str, chosen))})")
            st.markdown(" · ".join(links))
    else:
        C.placeholder("No runs match these filters. Launch one below, or clear the filters.")

with st.expander("Launch a training run", expanded=False), api.guard("launching the run"):
    presets = api.cached("presets")
    with st.form("runs._launch"):
        names = [p["name"] for p in presets]
        desc = {p["name"]: f"{p['name']} [{p['group']}]: {p['description']}" for p in presets}
        preset = st.selectbox("Preset", names, format_func=desc.get, key="runs._preset")
        c1, c2 = st.columns(2)
        name = c1.text_input("Run name (optional)", key="runs._name")
        experiment = c2.text_input("Experiment (optional)", key="runs._exp")
        text = st.text_area("Overrides, one key=value per line", "train.max_steps=50", key="runs._overrides")
        submitted = st.form_submit_button("Launch")
    if submitted:
        try:
            overrides = R.parse_overrides(text)
        except ValueError as exc:
            st.error(str(exc))
        else:
            with st.spinner("Starting the training job..."):
                run = api.call("create_run", preset, overrides=overrides, name=name or None,
                               experiment=experiment or None)
            # said on the redraw that lists the new run (the table and the jobs below read it afresh)
            st.session_state["runs._started"] = f"Started run #{run['id']} ({run['status']}); its progress shows below."
            st.rerun()
    if st.session_state.get("runs._started"):
        st.success(st.session_state["runs._started"])


jobs.watch(baseline)  # progress every second; the page redraws when a job starts or ends
C.share_bar(PAGE, state, lambda: views.runs_section(state))
