"""Runs: the run store as a filterable table, launching a training job and watching it."""

import streamlit as st

from frontend import api, components as C, views
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

with api.guard("loading runs"), st.spinner("Loading runs..."):
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
            st.session_state["runs._watch"] = run["id"]
            st.success(f"Started run #{run['id']} ({run['status']}); its progress shows below.")


@st.fragment(run_every=2.0)
def active_runs() -> None:
    """Live progress of running and scheduled jobs, with a cancel button each (polls every 2 s)."""
    with api.guard("watching jobs"):
        active = [r for r in api.call("runs", limit=500) if r["status"] in ("RUNNING", "SCHEDULED")]
        if not active:
            st.caption("No job is running.")
            return
        st.subheader("Jobs in progress")
        for r in active:
            prog = r.get("progress") or {}
            total = max(prog.get("total_steps") or 0, 1)
            c1, c2, c3 = st.columns([4, 1, 1])
            c1.progress(min((prog.get("step") or 0) / total, 1.0),
                        text=f"#{r['id']} {r['name']}: {r['status']}, step {prog.get('step', 0)}/{total}")
            c2.markdown(f"[curves](acr?run={r['id']})")
            if c3.button("Cancel", key=f"runs._cancel.{r['id']}"):
                with st.spinner(f"Cancelling run #{r['id']}..."):
                    done = api.call("cancel_run", r["id"])
                st.toast(f"Run #{r['id']}: {done['status']}")


active_runs()
C.share_bar(PAGE, state, lambda: views.runs_section(state))
