"""ACR curves for one run: metrics by step (smoothed over faint raw points), coverage over training,
window fractions, and the window map at any step."""

import streamlit as st

from frontend import api, components, group_figures, groups, jobs, user_text, views, zoom_chart

PAGE = "acr"
st.title("ACR curves")
first_visit = PAGE not in st.session_state.get("_seeded_pages", set()) and "run" not in st.query_params
state = components.bind_state(PAGE)


def _picked(wkey: str) -> None:
    """A run picked: it becomes the view's run, and its step range starts whole."""
    st.session_state[components.key(PAGE, "run")] = st.session_state[wkey]
    st.session_state.pop(components.key(PAGE, "steps"), None)


def steps_slider(run_id: int, last_step: int) -> tuple[int, int]:
    """The step range, kept in the view's `steps` ([] = all of it, so a live run's range keeps growing);
    the slider is keyed by run, so another run starts from its whole range, or from the link's range."""
    k, saved = f"{PAGE}.steps.{run_id}", st.session_state.get(components.key(PAGE, "steps")) or []
    if k not in st.session_state:
        ok = len(saved) == 2 and 0 <= saved[0] <= saved[1] <= last_step
        components.link_ignored(PAGE, "steps", [] if ok or not saved else
                                [f"steps={','.join(map(str, saved))} (not within 0..{last_step}; showing all)"])
        st.session_state[k] = tuple(saved) if ok else (0, last_step)
    first, last = st.slider("Steps", 0, last_step, key=k)
    st.session_state[components.key(PAGE, "steps")] = [] if (first, last) == (0, last_step) else [first, last]
    return first, last

with api.guard("loading runs", stop=True), st.spinner("Loading runs..."):
    runs = api.call("runs", limit=500)
    if not runs:
        components.placeholder("No runs in the store yet. Launch one on the Runs page.")
        st.stop()
    labels = {r["id"]: f"#{r['id']} {r['name']} ({r['status']})" for r in runs}
    if first_visit:  # no run in the link: the newest finished run whose windows change during training
        st.session_state[components.key(PAGE, "run")] = groups.default_run(runs)
    components.ensure_option(PAGE, "run", list(labels), "no such run", lambda i: f"run #{i}")
    c1, c2, c3 = st.columns([2, 3, 1])
    # Streamlit's selectbox keeps showing the label it was drawn with when only that label changes (a
    # live run's "(RUNNING)" stayed after its end, the options already saying FINISHED: issue 23), so
    # the picker is keyed by the shown run's status too: a new status is a new widget, with its label
    shown = st.session_state[components.key(PAGE, "run")]
    wkey = f"{components.key(PAGE, 'run')}.{next(r['status'] for r in runs if r['id'] == shown)}"
    st.session_state[wkey] = shown  # the view's run; a pick reaches it through _picked, before this line
    run_id = c1.selectbox("Run", list(labels), format_func=labels.get, key=wkey, on_change=_picked, args=(wkey,))
    metrics = api.call("run_metrics", run_id, max_points=views.CURVE_POINTS)["series"]
    keys = sorted(k for k in metrics if not k.startswith("window_frac/"))
    chosen = st.session_state[components.key(PAGE, "keys")]
    if next((r["status"] for r in runs if r["id"] == run_id), None) in jobs.ACTIVE:
        # a live run may not have logged a chosen key yet (val_loss before its first eval): keep it
        # chosen, so it is drawn once it arrives, rather than dropping it for good
        waiting = [k for k in chosen if k not in keys]
        keys = sorted({*keys, *waiting})
        if waiting:
            c2.caption(f"Not logged yet: {', '.join(waiting)} (drawn once the run writes it).")
    else:
        st.session_state[components.key(PAGE, "keys")] = [k for k in chosen if k in keys]
    c2.multiselect("Metrics", keys, key=components.key(PAGE, "keys"))
    c3.slider("EMA smoothing", 0.0, 0.99, key=components.key(PAGE, "smooth"), step=0.01)
    # Long runs come downsampled (bucket min/max, views.CURVE_POINTS per series); narrowing the step
    # range asks the server again for just that range, in finer buckets.
    last_step = max((max(s["step"]) for s in metrics.values() if s["step"]), default=0)
    first, last = steps_slider(run_id, last_step) if last_step > 0 else (0, 0)
    # the range's open ends stay open, so that a live run's curves keep growing
    step_range = (first or None, None if last >= last_step else last)

drawn_status = next((r["status"] for r in runs if r["id"] == run_id), None)  # as the run picker says it
live = drawn_status in jobs.ACTIVE
# Any job that starts or ends relabels the picker: the jobs watcher (as on the Runs page) redraws the
# page then, whichever run is shown; the curves' own check below covers the shown run between polls.
jobs.watch(jobs.signature(runs), show=False)
group = next((r.get("group") for r in runs if r["id"] == run_id), None)
if group:
    components.ensure_option(PAGE, "band", ["", *group_figures.BANDS])
    st.selectbox(f"Group {group}: draw the group's seeds as", ["", *group_figures.BANDS], key=components.key(PAGE, "band"),
                 format_func=lambda b: group_figures.BANDS.get(b, "off (this run only)"),
                 help="the mean over the group's runs at each step with a ±1 std or min–max band; this run dotted")


@st.fragment(run_every=3.0 if live else None)
def curves(step_range: tuple[int | None, int | None]) -> None:
    """The run's curves; while it trains they refresh every 3 s, so they grow on screen, and the page
    redraws when its status changes."""
    with api.guard("drawing the curves"):
        state = components.current_state(PAGE)
        zoom = zoom_chart.zoomed("acr._metrics")  # a range dragged on the chart: asked at full resolution
        run, figs = views.acr_figures(run_id, state["keys"], state["smooth"], *(zoom or step_range))
        if run["status"] != drawn_status:  # started or ended: the picker, the map and the polling follow
            st.rerun(scope="app")
        for line in views.run_lines(run):
            st.caption(user_text.md(line))
        if not figs:
            components.placeholder("This run has no metrics yet; curves appear as training writes them.")
        if "metrics" in figs:
            zoom_chart.show(figs["metrics"], "acr._metrics")
            st.caption(f"Zoomed to steps {zoom[0]:,}–{zoom[1]:,}: these points were asked for this range "
                       "(double-click the chart to zoom out)." if zoom else
                       "Drag a range on the chart to ask the server for it at full resolution.")
        if group and state["band"]:
            fig = views.acr_group_figure(run, state)
            if fig is None:
                components.placeholder(f"Group {user_text.md(group)} has no other run with these metrics.")
            else:
                components.show_figure(fig, "acr._group")
        left, right = st.columns(2)
        with left:
            if "coverage" in figs:
                components.show_figure(figs["coverage"], "acr._coverage")
        with right:
            if "fractions" in figs:
                components.show_figure(figs["fractions"], "acr._fractions")


curves(step_range)  # an argument, not a global: a fragment rerun sees the page's globals as they end
state = components.current_state(PAGE)

with api.guard("window map"):
    if any(r["id"] == run_id and r.get("read_only") for r in runs):
        components.placeholder("Reference figures from the paper carry no window maps.")
        st.stop()
    # a training run's plan and its list of steps grow as it trains: never serve them from the 30 s cache
    fetch = api.call if live else api.cached
    try:
        latest = fetch("run_windows", run_id)
    except api.ApiError as exc:
        if not live or exc.status != 404:
            raise
        components.placeholder("No window map yet: it appears once training writes its first plan.")
        st.stop()
    steps = latest["steps"] or [latest["step"]]
    if state["step"] not in steps:
        st.session_state[components.key(PAGE, "step")] = steps[-1]
    if len(steps) > 1:
        step = st.select_slider("Window map at step", steps, key=components.key(PAGE, "step"))
    else:
        step = st.session_state[components.key(PAGE, "step")]
    wm = api.cached("run_windows", run_id, step=step)  # a stored step's plan never changes
    components.show_figure(views.acr_window_figure(latest, wm), "acr._windows")

state = components.current_state(PAGE)
components.publish(PAGE, state)
components.share_bar(PAGE, state, lambda: views.acr_section(state))
