"""Runs: the run store as a filterable table, launching a training job and watching it."""

import streamlit as st

from frontend import api, components, groups, jobs, run_table, run_views, user_text

PAGE = "runs"
STATUSES = ["", "SCHEDULED", "PENDING", "RUNNING", "FINISHED", "FAILED", "KILLED"]
st.title("Runs")
state = components.bind_state(PAGE)

SOURCES = ["", "job", "tracked", "imported", "suite", "paper"]
c1, c2, c3, c4 = st.columns([2, 1, 1, 2])
c1.text_input("Experiment", key=components.key(PAGE, "experiment"), placeholder="all experiments")
components.ensure_option(PAGE, "status", STATUSES)
c2.selectbox("Status", STATUSES, key=components.key(PAGE, "status"), format_func=lambda s: s or "any")
c3.text_input("Preset", key=components.key(PAGE, "preset"), placeholder="any")
c4.text_input("Search name / preset / id", key=components.key(PAGE, "q"))
c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
components.ensure_option(PAGE, "source", SOURCES)
c1.selectbox("Source", SOURCES, key=components.key(PAGE, "source"), format_func=lambda s: s or "any",
             help="job: trained here · tracked: reported from elsewhere · imported: aah import · suite: the "
                  "reproduction suite · paper: the paper's reported numbers")
c2.text_input("Group", key=components.key(PAGE, "group"), placeholder="any", help="e.g. a suite row: full_adaptive")
c3.text_input("Tag", key=components.key(PAGE, "tag"), placeholder="any")
c4.number_input("Max val_loss", 0.0, 100.0, step=0.1, key=components.key(PAGE, "maxloss"), help="0 = no limit")
c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
c1.toggle("All params", key=components.key(PAGE, "allparams"), help="off: only params that differ between the listed runs")
c2.toggle("Paper reference", key=components.key(PAGE, "paper"), help="the paper's reported Table 1/2 figures (read-only)")
c3.toggle("Group seeds", key=components.key(PAGE, "bygroup"), help="one row per group: mean ± std of a metric over its runs")
components.ensure_range(PAGE, "cov", 0.0, 1.0)
c4.slider("causal_coverage range", 0.0, 1.0, step=0.01, key=components.key(PAGE, "cov"))
state = components.current_state(PAGE)
components.publish(PAGE, state)


def grouped_table(runs: list[dict]) -> None:
    keys = run_views.group_metrics(runs)
    components.ensure_option(PAGE, "metric", keys)
    metric = st.selectbox("Metric (mean ± std over each group's runs)", keys, key=components.key(PAGE, "metric"))
    rows = run_views.group_rows(runs, state, metric)
    if not rows:
        components.placeholder("None of these runs carries a group. Turn off “Group seeds” to list them.")
        return
    number = st.column_config.NumberColumn(format=f"%.{run_views.GROUP_DECIMALS}f")
    st.dataframe(groups.groups_frame(rows, metric), hide_index=True, key="runs._groups",
                 column_config={f"{metric} mean": number, f"{metric} std": number})
    st.caption("mean ± sample std (ddof 1) of each run's last value; n = runs with a finite value. Draw a group's "
               "curves with a band on Compare → Groups of seeds.")


baseline: dict[int, str] = {}
with api.guard("loading runs"):
    baseline = jobs.snapshot()  # before the table reads the runs: see jobs.snapshot
live_jobs = bool(baseline)


@st.fragment(run_every=3.0 if live_jobs else None)
def runs_table() -> None:
    """The table; while jobs run it refreshes every 3 s (progress and metrics move; a job that starts or
    ends redraws the whole page through jobs.watch)."""
    with api.guard("loading runs"):
        runs = run_views.runs_shown(state)
        if not runs:
            components.placeholder("No runs match these filters. Launch one below, or clear the filters.")
            return
        if state["bygroup"]:
            grouped_table(runs)
            return
        st.dataframe(run_views.runs_frame(runs, state["allparams"]), hide_index=True, key="runs._table",
                     column_config={k: st.column_config.NumberColumn(format=f"%.{d}f")
                                    for k, d in run_table.METRIC_DECIMALS.items()})
        if live_jobs:
            st.caption("Refreshing every 3 s while jobs run.")
        labels = {r["id"]: f"#{r['id']} {r['name']}" for r in runs}
        chosen = st.multiselect("Selected runs", list(labels), format_func=labels.get, key="runs._chosen")
        if chosen:
            links = [f"[ACR curves of #{i}](acr?run={i})" for i in chosen]
            if len(chosen) > 1:
                links.append(f"[compare {len(chosen)} runs](compare?runs={','.join(map(str, chosen))})")
            st.markdown(" · ".join(links))
            run_details(next(r for r in runs if r["id"] == chosen[-1]))


def run_details(run: dict) -> None:
    """The last selected run: identity, every param, and its editable description, notes and tags."""
    name, n_params = user_text.md(run["name"]), len(run.get("params") or {})
    with st.expander(f"Run #{run['id']} {name}: identity, all {n_params} params, notes", expanded=True):
        st.markdown(" · ".join(f"**{k}** {user_text.md(v)}" for k, v in run_table.identity_items(run)))
        st.dataframe(run_table.params_frame(run), hide_index=True, key=f"runs._params.{run['id']}")
        with st.form(f"runs._edit.{run['id']}"):
            desc = st.text_input("Description", run.get("description") or "", disabled=run.get("read_only"))
            notes = st.text_area("Notes", run.get("notes") or "", disabled=run.get("read_only"))
            tags = st.text_input("Tags (comma-separated)", ", ".join(run.get("tags") or []),
                                 disabled=run.get("read_only"))
            saved = st.form_submit_button("Save", disabled=run.get("read_only"))
        if run.get("read_only"):
            st.caption("The paper's reported numbers are read-only.")
        if saved:
            with api.guard("saving the run's notes"):
                api.call("update_run", run["id"], description=desc.strip() or None, notes=notes.strip() or None,
                         tags=run_table.parse_tags(tags))
                st.success(f"Saved run #{run['id']}.")


runs_table()

with st.expander("Launch a training run", expanded=False), api.guard("launching the run"):
    presets = api.cached("presets")
    # outside the form: picking a target shows at once what it has free (or why it is unavailable)
    target, resources = jobs.target_inputs(api.call("targets"))
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
            overrides = run_table.parse_overrides(text)
        except ValueError as exc:
            st.error(str(exc))
        else:
            with st.spinner(f"Starting the training job on {target}..."):
                run = api.call("create_run", preset, overrides=overrides, name=name or None,
                               experiment=experiment or None, target=target, resources=resources)
            # said on the redraw that lists the new run (the table and the jobs below read it afresh)
            st.session_state["runs._started"] = f"Started run #{run['id']} ({run['status']}); its progress shows below."
            st.rerun()
    if st.session_state.get("runs._started"):
        st.success(st.session_state["runs._started"])


jobs.watch(baseline)  # progress every second; the page redraws when a job starts or ends
components.share_bar(PAGE, state, lambda: run_views.runs_section(state))
