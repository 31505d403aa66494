"""What the pages show of groups of seeds, as data + figures: grouped curves with bands (Compare, ACR)
and the reproduction view (our suite's rows beside the paper's Table 1). Calls the API through
`frontend.api`; the numbers are aggregated by the server (GET /runs/groups, /runs/groups/series)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from frontend import api, group_figures, groups, study_views
from frontend.comparable import run_family
from frontend.export import Section
from frontend.figures import axis_title, coverage_label

CURVE_POINTS = 2000
PAPER_LABEL = "paper · Table 1 (1b model, T=4096, step 10000) · one seed, no error bar"


def group_family(group: dict, runs_by_id: dict[int, dict]) -> str:
    """A group's model family (its runs'); "mixed models" when they differ."""
    fams = {run_family(runs_by_id[i]) for i in group["run_ids"] if i in runs_by_id}
    return fams.pop() if len(fams) == 1 else ("mixed models" if fams else "?")


def group_curve_figures(chosen: list[dict], keys: list[str], band: str, runs_by_id: dict[int, dict]
                        ) -> dict[str, go.Figure]:
    """Per key and model family, each chosen group's mean with its band (groups of different models
    never share an axis)."""
    per_key: dict[tuple[str, str], dict[str, dict]] = {}
    for g in chosen:
        data = api.call("group_series", g["experiment"], g["group"], keys=keys, max_points=CURVE_POINTS)
        fam = group_family(g, runs_by_id)
        for key in keys:
            if key in data["series"] and data["series"][key]["step"]:
                per_key.setdefault((key, fam), {})[groups.group_label(g)] = data["series"][key]
    return {f"{key} · {fam}": group_figures.group_band_figure(curves, band, title=f"{key} · {fam}", y_title=coverage_label(key))
            for (key, fam), curves in per_key.items()}


def run_group_figure(run: dict, keys: list[str], band: str, run_series: dict[str, tuple[list, list]],
                     smoothing: float = 0.0) -> go.Figure | None:
    """The run's group (other seeds of its setting) as mean and band per key, with this run dotted in
    its key's colour; `smoothing` as the page's EMA slider."""
    if not run.get("group"):
        return None
    data = api.call("group_series", run["experiment"], run["group"], keys=keys, max_points=CURVE_POINTS)
    if len(data["run_ids"]) < 2:
        return None
    curve_name = {k: f"{k} · group {run['group']}" for k in keys if k in data["series"]}
    curves = {curve_name[k]: data["series"][k] for k in curve_name}
    run_name = {k: f"{k} · this run (#{run['id']}, seed {run.get('seed')})" for k in keys if k in run_series}
    overlay = {run_name[k]: run_series[k] for k in run_name}
    if not curves:
        return None
    return group_figures.group_band_figure(curves, band, overlay=overlay, smoothing=smoothing,
                                           y_title=axis_title(list(curve_name)),
                                           overlay_of={run_name[k]: curve_name[k] for k in run_name if k in curve_name},
                                           title=f"group {run['group']}: {len(data['run_ids'])} runs (seeds "
                                                 f"{', '.join(str(s) for s in data['seeds'])}) · {group_figures.BANDS[band]}")


# the reproduction view's default metric: the language-modelling loss alone, as the paper's (text only) val_loss
TEXT_LOSS = "val_text_loss"


def suite_experiments() -> list[str]:
    """Experiments that hold suite runs (our reproductions), newest first."""
    return list(dict.fromkeys(g["experiment"] for g in api.call("run_groups", keys=["val_loss"], source="suite")))


def reproduction(experiment: str, key: str) -> dict[str, Any]:
    """Our rows (mean ± std over seeds) and the paper's Table 1 rows for `key` (see groups.REPRO_KEYS; "key": the
    one drawn, val_loss for runs that logged no val_text_loss)."""
    metric = "val_loss" if key == "delta" else key
    ours = api.call("run_groups", keys=[metric], experiment=experiment, source="suite")
    if key == TEXT_LOSS and not any((g.get("stats") or {}).get(TEXT_LOSS) for g in ours):
        key = metric = "val_loss"  # runs that logged no text loss of its own: their val_loss is all there is
        ours = api.call("run_groups", keys=[metric], experiment=experiment, source="suite")
    our_runs = api.call("runs", experiment=experiment, source="suite", limit=1000)
    paper_runs = api.call("runs", source="paper", limit=1000)
    mine, theirs = groups.reproduction_rows(ours, our_runs, paper_runs, key)
    seeds = max((r["n"] for r in mine), default=0)
    ours_label = f"ours · suite · {groups.suite_scale_label(our_runs)} · mean ± std over {seeds} seeds"
    fig = group_figures.reproduction_figure(mine, theirs, y_title=groups.REPRO_KEYS.get(key, key), ours_label=ours_label,
                                            paper_label=PAPER_LABEL, ratio=key in ("acr", "retrieval_mean"))
    return {"ours": mine, "paper": theirs, "figure": fig, "ours_label": ours_label, "key": key,
            "doc": groups.SHIPPED_REPORTS.get(groups.suite_scale(our_runs))}


def reproduction_table(data: dict[str, Any]) -> list[dict[str, str]]:
    """One row per suite row: ours as mean ± std (n seeds) and the paper's reported value."""
    paper = {r["row"]: r["mean"] for r in data["paper"]}
    rows = groups.row_order([r["row"] for r in data["ours"]] + list(paper))
    ours = {r["row"]: r for r in data["ours"]}
    return [{"row": row, "ours (mean ± std)": groups.pm(ours.get(row)),
             "paper (reported)": f"{paper[row]:.4f}" if row in paper else "not in its Table 1"} for row in rows]


def reproduction_section(experiment: str, key: str, corpora: dict[str, str]) -> Section:
    """Table 1 beside the paper and the study under it, as the page draws them. The table's numbers are the
    chart's points, so the slide's lines are the study's findings (a slide fits one 1100 px screen)."""
    data = reproduction(experiment, key)
    figures, lines = study_views.study_slide(experiment, corpora)
    return Section(f"Reproduction: {groups.REPRO_KEYS.get(data['key'], data['key'])} · {experiment}",
                   {"reproduction": data["figure"], **figures}, [data["ours_label"], PAPER_LABEL, *lines])


def groups_section(group_keys: list[str], keys: list[str], band: str) -> Section:
    by_key = {groups.group_key(g): g for g in api.call("run_groups", keys=keys or None)}
    chosen = [by_key[k] for k in group_keys if k in by_key]
    runs_by_id = {r["id"]: r for r in api.call("runs", limit=1000)}
    lines = [f"{groups.group_label(g)}: " + ", ".join(f"{k} {groups.pm(g['stats'].get(k))}" for k in keys) for g in chosen]
    return Section("Compare groups of seeds", group_curve_figures(chosen, keys, band, runs_by_id), lines)
