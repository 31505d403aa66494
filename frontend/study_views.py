"""The reproduction view's study sections as data + figures (issue 27): retrieval accuracy by distance per
row, the AAH rows against the matched-coverage baselines (paired by seed, 95% intervals from the API),
where the ranking changes between corpora, and the learning-rate sweep. Calls the API through
`frontend.api`; the logic is frontend/study.py."""

from __future__ import annotations

from typing import Any

from frontend import api, group_figures, groups, study

# keys are uniform over 62 letters and digits (aah_core/analysis/retrieval.py): any guess that does not
# read the key is right 1 time in 62
RETRIEVAL_CHANCE = 1 / 62
SUITE_RUNS = 1000


def suite_runs() -> list[dict]:
    return api.call("runs", source="suite", limit=SUITE_RUNS)


def suites() -> dict[str, dict[str, str]]:
    """Suite -> {corpus: experiment}; a suite is named by its first corpus' experiment (the code corpus'
    when it has one, the name a suite had before it had corpora)."""
    return {next(iter(corpora.values())): corpora for corpora in study.catalog(suite_runs()).values()}


def experiment_of(suite: str, corpus: str | None) -> str:
    """The experiment of `suite` on `corpus` (the suite's own when it has no such corpus)."""
    return suites().get(suite, {}).get(corpus or "", suite)


def retrieval(experiment: str, runs: list[dict]) -> dict[str, Any]:
    """Accuracy by distance per row (mean ± std over seeds) and its figure; empty rows when the runs logged none."""
    keys = [f"{study.RETRIEVAL}{d}" for d in study.distances(
        [k for r in runs if r["experiment"] == experiment for k in r.get("summary") or {}])]
    groups = api.call("run_groups", keys=keys, experiment=experiment, source="suite") if keys else []
    rows = study.retrieval_rows(groups)
    fig = group_figures.retrieval_figure(rows, RETRIEVAL_CHANCE, title=f"passkey retrieval by distance · {experiment}")
    table = [{"row": r["row"], "seeds": r["n"], **{f"d={d}": _pm(m, s) for d, m, s in zip(r["distance"], r["mean"], r["std"])}}
             for r in rows]
    return {"rows": rows, "figure": fig, "table": table}


def _pm(mean: float, std: float | None) -> str:
    return f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"


def matched(experiment: str, runs: list[dict]) -> dict[str, Any]:
    """Each adaptive row against each matched-coverage baseline the experiment has: Δloss, Δretrieval."""
    mine = [r for r in runs if r["experiment"] == experiment]
    loss = study.loss_key(mine)
    present = {r.get("group") for r in mine}
    paired = {base: api.call("group_paired", experiment, base, [loss, "retrieval_mean"])
              for base in study.MATCHED_BASELINES if base in present}
    table = study.matched_table(paired, study.adaptive_groups(mine), loss, coverage=study.mean_coverage(mine))
    return {"loss": loss, "bases": list(paired), "table": table}


def corpora(experiments: dict[str, str], runs: list[dict]) -> dict[str, Any]:
    """Each corpus' ranking by its loss and the pairs whose order differs from the first corpus'."""
    rankings = {}
    for corpus, experiment in experiments.items():
        loss = study.loss_key([r for r in runs if r["experiment"] == experiment])
        rankings[corpus] = study.ranking(api.call("run_groups", keys=[loss], experiment=experiment, source="suite"), loss)
    names = list(rankings)
    changes = {c: study.order_changes(rankings[names[0]], rankings[c]) for c in names[1:]}
    return {"rankings": rankings, "changes": changes}


def lr_sweep(experiment: str, runs: list[dict]) -> dict[str, Any] | None:
    """The sweep's rows at each learning-rate scale (seed 0), their rankings and the flips against x1; None
    when the experiment's corpus has no sweep."""
    corpus = next((study.run_corpus(r) for r in runs if r["experiment"] == experiment), "code")
    swept = [r for r in runs if study.run_lr_scale(r) != 1 and study.run_corpus(r) == corpus]
    if not swept:
        return None
    mine = [r for r in runs if r["experiment"] == experiment]
    loss = study.loss_key(mine)
    table = study.lr_table(mine, swept, loss)
    rankings = {s: sorted(v, key=v.__getitem__) for s, v in table.items()}
    flips = {s: study.order_changes(rankings[1.0], r) for s, r in rankings.items() if s != 1.0 and 1.0 in rankings}
    rows = groups.row_order(sorted({row for v in table.values() for row in v}))
    lines = [{"lr scale": f"×{s:g}", **{row: f"{v[row]:.4f}" if row in v else "–" for row in rows},
              "ranking (lowest first)": " < ".join(rankings[s])} for s, v in table.items()]
    return {"loss": loss, "table": lines, "flips": flips}


def study_slide(experiment: str, corpora_of_suite: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The study as a slide draws it: the retrieval chart the page draws, and one line per finding the page's
    tables state (each adaptive row against each matched baseline, the corpora's swaps, the lr flips)."""
    runs = suite_runs()
    ret = retrieval(experiment, runs)
    figures = {"retrieval": ret["figure"]} if ret["rows"] else {}
    m = matched(experiment, runs)
    lines = [f"{r['row']} vs {r['against']}: " + " · ".join(f"{k} {v}" for k, v in r.items() if k.startswith("Δ"))
             for r in m["table"]]
    if len(corpora_of_suite) > 1:
        c = corpora(corpora_of_suite, runs)
        first = next(iter(c["rankings"]))
        lines += [f"{first} → {name}: " + ("; ".join(f"{a} / {b} swap" for a, b in pairs) if pairs else "the ordering holds")
                  for name, pairs in c["changes"].items()]
    lr = lr_sweep(experiment, runs)
    if lr is not None:
        flips = [f"×{s:g}: " + "; ".join(f"{a} / {b}" for a, b in pairs) for s, pairs in lr["flips"].items() if pairs]
        lines.append("learning rate, orderings that flip against ×1: " + (" · ".join(flips) if flips else "none"))
    return figures, lines
