"""What the Runs page lists for a state, as the page and its saved view's slide (and deck) both draw it:
the filtered runs, or with "Group seeds" one row per group. Calls the API through `frontend.api`."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from frontend import api, groups, run_table
from frontend.export import Section

RUNS_LIMIT = 500  # rows GET /runs returns to the page


def api_filters(state: dict) -> dict:
    """The state's filters that GET /runs applies (an empty field: no filter)."""
    return {k: state[k] or None for k in ("experiment", "preset", "status", "source", "group", "tag")}


def runs_shown(state: dict) -> list[dict]:
    """The runs the page lists: the API's filters, then the paper toggle (the paper's read-only rows),
    the text search, the val_loss ceiling (0: none) and the causal_coverage range."""
    runs = api.call("runs", limit=RUNS_LIMIT, **api_filters(state))
    if not state["paper"]:
        runs = [r for r in runs if not r.get("read_only")]
    return run_table.filter_runs(runs, state["q"], state["maxloss"] or None, tuple(state["cov"]))


def runs_frame(runs: list[dict], all_params: bool) -> pd.DataFrame:
    """The runs table: identity, status, progress, key metrics, then params (only those that differ
    between the listed runs unless `all_params`)."""
    keys = sorted({k for r in runs for k in (r.get("params") or {})}) if all_params else run_table.differing_params(runs)
    rows = []
    for r in runs:
        s, p, prog = r.get("summary") or {}, r.get("params") or {}, r.get("progress")
        # the metrics right after the run's name: at the table's default width they are on screen
        rows.append({"id": r["id"], "name": r["name"], "status": r["status"],
                     "val_loss": s.get("val_loss"), "acr": s.get("acr"), "causal_coverage": s.get("causal_coverage"),
                     "target": r.get("target", "local"), "engine job": r.get("engine_job_id") or "",
                     "progress": f"{prog['step']}/{prog['total_steps']}" if prog else "",
                     "preset": r.get("preset"), "experiment": r.get("experiment"), "source": r.get("source"),
                     "group": r.get("group"), "seed": r.get("seed"), "tags": ", ".join(r.get("tags") or []),
                     **{f"param {k}": p.get(k) for k in keys}})
    return pd.DataFrame(rows)


def group_metrics(runs: list[dict]) -> list[str]:
    """The metrics "Group seeds" offers: every summary key of the listed runs."""
    return sorted({k for r in runs for k in (r.get("summary") or {})}) or ["val_loss"]


def group_rows(runs: list[dict], state: dict, metric: str) -> list[dict]:
    """The groups holding a listed run, with `metric`'s statistics (GET /runs/groups). The paper's rows
    pair its Table 1 with its Table 2, not seeds: Compare's reproduction view shows them."""
    f = api_filters(state)
    rows = api.call("run_groups", keys=[metric], experiment=f["experiment"], group=f["group"], source=f["source"],
                    tag=f["tag"])
    shown = {r["id"] for r in runs}
    return [g for g in rows if set(g["run_ids"]) & shown and "paper" not in g["sources"]]


GROUP_DECIMALS = 4  # the grouped table's mean and std


def runs_section(state: dict) -> Section:
    runs = runs_shown(state)
    if state["bygroup"]:
        keys = group_metrics(runs)
        metric = state["metric"] if state["metric"] in keys else keys[0]
        df = groups.groups_frame(group_rows(runs, state, metric), metric)
        digits = {f"{metric} mean": GROUP_DECIMALS, f"{metric} std": GROUP_DECIMALS}
        lines = [f"{len(df)} groups of seeds · {metric}: mean ± sample std (ddof 1) of each run's last value"]
    else:
        df, digits = runs_frame(runs, state["allparams"]), run_table.METRIC_DECIMALS
        lines = [f"{len(df)} runs"]
    cells = [[run_table.metric_text(c, v, digits) for v in df[c].tolist()] for c in df.columns]
    table = go.Figure(go.Table(header=dict(values=list(df.columns)), cells=dict(values=cells)))
    return Section("Runs", {"table": table}, lines)
