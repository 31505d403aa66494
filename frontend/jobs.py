"""Live job status for pages that show runs: a snapshot of the active jobs taken when the page draws,
and a polling fragment that shows their progress (with where each runs, the engine's job id, why a
queued one waits, and the tail of its log) and reruns the whole page once any job's status changes (a
job ends, starts or appears), so tables and run pickers never keep a stale status; and the target
picker with the resources of the launch form.

It polls only while a job is live: with nothing scheduled or running there is no timer (a rerun every
second would meet the user's clicks for nothing), and a "Check for jobs" button looks once for jobs
started elsewhere (the CLI, another tab); a job launched from this page redraws it anyway."""

from __future__ import annotations

from typing import Mapping, Sequence

import streamlit as st

from frontend import api, user_text

ACTIVE = ("SCHEDULED", "PENDING", "RUNNING")
LOG_LINES = 20
# resources a job can ask for: (field, label, step); 0 means "not asked" (the target's default)
RESOURCES = (("gpus", "GPUs", 1), ("cpus", "CPUs", 1), ("memory_gb", "Memory (GB)", 1), ("nodes", "Nodes", 1),
             ("time_limit_min", "Time limit (min)", 10))
ENDED_KEY = "jobs._ended"  # {run id: line} of jobs seen ending while this session watched


def signature(runs: Sequence[Mapping]) -> dict[int, str]:
    """{run id: status} of the runs that are scheduled or running: what a page's status display
    depends on. Two snapshots differ exactly when a job appeared, started or ended."""
    return {int(r["id"]): str(r["status"]) for r in runs if r.get("status") in ACTIVE}


def snapshot() -> dict[int, str]:
    """The active jobs now (one GET /runs). Take it before the page reads its own runs: a job that
    changes in between then differs from the snapshot, and the watcher reruns the page once."""
    return signature(api.call("runs", limit=500))


def progress_text(run: Mapping) -> tuple[float, str]:
    """(fraction done, "#12 tiny: RUNNING, step 30/50") for a progress bar (Markdown: the name escaped)."""
    prog = run.get("progress") or {}
    total = int(prog.get("total_steps") or 0)
    step = int(prog.get("step") or 0)
    frac = min(step / total, 1.0) if total > 0 else 0.0
    steps = f"step {step}/{total}" if total > 0 else f"step {step}"
    where = ""
    if (run.get("target") or "local") != "local":
        where = user_text.md(f" on {run['target']} job {run.get('engine_job_id') or '(not submitted)'}")
    text = f"#{run['id']} {user_text.md(run['name'])}{where}: {run['status']}, {steps}"
    if run.get("status") == "PENDING" and run.get("pending_reason"):
        text += f" ({user_text.md(run['pending_reason'])})"
    return frac, text


def resources_body(values: Mapping[str, float]) -> dict[str, int | float]:
    """The API's `resources` from the form's numbers: the fields given (> 0), nodes only beyond one."""
    body: dict[str, int | float] = {}
    for field, value in values.items():
        if value and not (field == "nodes" and value == 1):
            body[field] = float(value) if field == "memory_gb" else int(value)
    return body


def target_inputs(targets: Sequence[Mapping]) -> tuple[str, dict[str, int | float]]:
    """A target picker (with each target's free resources or why it is unavailable) and the resources."""
    names = [t["name"] for t in targets] or ["local"]
    info = {t["name"]: t for t in targets}
    target = st.selectbox("Target", names, key="runs._target",
                          format_func=lambda n: n if info.get(n, {}).get("available", True) else f"{n} (unavailable)")
    if target in info:
        st.caption(user_text.md(info[target]["detail"]))
    cols = st.columns(len(RESOURCES))
    values = {field: col.number_input(label, min_value=0, value=1 if field == "nodes" else 0, step=step,
                                      key=f"runs._res.{field}")
              for col, (field, label, step) in zip(cols, RESOURCES)}
    return target, resources_body(values)


def ended_lines(before: Mapping[int, str], runs: Sequence[Mapping]) -> dict[int, str]:
    """Lines for the runs that were active in `before` and are not any more (their final status)."""
    by_id = {int(r["id"]): r for r in runs}
    out = {}
    for rid in before:
        run = by_id.get(rid)
        if run is not None and run.get("status") not in ACTIVE:
            _, text = progress_text(run)
            out[rid] = f"{text} · [curves](acr?run={rid})"
    return out


POLL_S = 1.0


def watch(baseline: dict[int, str], show: bool = True, cancel: bool = True, show_logs: bool = True) -> None:
    """While `baseline` (the snapshot the page drew with) has live jobs, poll them every POLL_S; else no
    timer. With `show`, draw each active job's progress, where it runs and why it waits (and a cancel
    button with `cancel`, the tail of its log with `show_logs`) and the jobs that ended while this page
    was open. When the active jobs differ from `baseline`, rerun the whole page."""
    st.fragment(_watch, run_every=POLL_S if baseline else None)(baseline, show, cancel, show_logs)


def _watch(baseline: dict[int, str], show: bool, cancel: bool, show_logs: bool) -> None:
    with api.guard("watching jobs"):
        runs = api.call("runs", limit=500)
        now = signature(runs)
        ended = st.session_state.setdefault(ENDED_KEY, {})
        ended.update(ended_lines(baseline, runs))
        if now != baseline:
            st.rerun(scope="app")
        if not show:
            return
        active = [r for r in runs if r["status"] in ACTIVE]
        if active:
            st.subheader("Jobs in progress")
        else:
            c1, c2 = st.columns([4, 1])
            c1.caption("No job is running.")
            c2.button("Check for jobs", key="jobs._check", help="look once for jobs started elsewhere (CLI, API)")
        for r in active:
            frac, text = progress_text(r)
            c1, c2, c3 = st.columns([4, 1, 1])
            c1.progress(frac, text=text)
            c2.markdown(f"[curves](acr?run={r['id']})")
            if cancel and c3.button("Cancel", key=f"runs._cancel.{r['id']}"):
                with st.spinner(f"Cancelling run #{r['id']}..."):
                    done = api.call("cancel_run", r["id"])
                st.toast(f"Run #{r['id']}: {done['status']}" + (f" ({done['error']})" if done.get("error") else ""))
            if show_logs:
                lines = api.call("run_logs", r["id"], tail=LOG_LINES)["lines"]
                c1.code("\n".join(lines) or "(no output yet)", language=None)
        for line in list(ended.values())[-5:]:
            st.caption(f"Ended: {line}")
