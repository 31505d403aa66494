"""The paper suite as a study (issue 27): the suite on each bundled corpus, a learning-rate sweep, and the
comparisons a reader asks for first: does a learned per-head allocation beat the simple windows people
deploy (fixed_window, sink_window, local_global) at the same coverage, on loss and on passkey retrieval;
does the rows' ordering hold on a second corpus, and under another learning rate.

Each corpus is one `run_suite` folder (out/<corpus>/) and each learning-rate scale another
(out/<corpus>-lr<scale>/, LR_ROWS at one seed), so an interrupted study resumes and disjoint row sets
may be trained by several processes at once. The report renders the first corpus as `aah suite` always
has, then the study's sections.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aah_core.suite import LR_ROWS, LR_SCALES, loss_key, paired, render, run_suite, summarize

MATCHED_BASELINES = ("fixed_window", "sink_window", "local_global")  # coverage matched to full_adaptive
ADAPTIVE_MODES = ("aah", "learned")  # controller modes that allocate windows per head
COMPARED = ("loss", "retrieval_mean")  # the paired comparisons: the report's loss, mean retrieval accuracy


def folder(out: Path, corpus: str, lr_scale: float = 1.0) -> Path:
    return out / (corpus if lr_scale == 1 else f"{corpus}-lr{lr_scale:g}")


def run_study(scale: str, seeds: int, out: str | Path, corpora: list[str], lr_sweep: bool, doc: str | Path | None,
              log: Callable[[str], None] = lambda line: None, command: str = "", **suite: Any) -> dict[str, Any]:
    """Every row on every corpus (3 seeds), then with `lr_sweep` LR_ROWS at seed 0 on the first corpus at each
    of LR_SCALES; writes `doc` (markdown) and its .json beside it."""
    out = Path(out)
    reports = {c: run_suite(scale=scale, seeds=seeds, out=folder(out, c), doc=None, log=log, command=command,
                            corpus=c, **suite) for c in corpora}
    lr: dict[str, dict[str, Any]] = {}
    if lr_sweep:
        rows = [r for r in LR_ROWS if r in reports[corpora[0]]["rows"]]
        lr = {f"{s:g}": run_suite(scale=scale, seeds=1, out=folder(out, corpora[0], s), doc=None, log=log,
                                  command=command, corpus=corpora[0], lr_scale=s, **{**suite, "rows": rows})
              for s in LR_SCALES}
    study = {"corpora": reports, "lr": lr}
    # the study's own header (a pack of `out` reads it): the first corpus' report, named by the study's command
    first = {k: v for k, v in reports[corpora[0]].items() if k != "rows"}
    (out / "suite.json").write_text(json.dumps({**first, "corpora": corpora, "lr_scales": list(lr)}, indent=1))
    if doc is not None:
        Path(doc).parent.mkdir(parents=True, exist_ok=True)
        Path(doc).write_text(render_study(study))
        Path(doc).with_suffix(".json").write_text(json.dumps({**study, "summary": summarize_study(study)}, indent=1))
    return study


def adaptive_rows(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [name for name, runs in rows.items() if runs and runs[0]["controller"].get("mode") in ADAPTIVE_MODES]


def matched_comparisons(rows: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per adaptive row and matched baseline: the paired difference (row - baseline, same seed) of the loss
    and of the mean retrieval accuracy, with its 95% interval over seeds."""
    keys = {"loss": loss_key(rows), "retrieval_mean": "retrieval_mean"}
    out: dict[str, dict[str, Any]] = {}
    for name in adaptive_rows(rows):
        for base in MATCHED_BASELINES:
            runs, refs = rows[name], rows.get(base, [])
            if len(runs) != len(refs) or len(runs) < 2:
                continue
            out.setdefault(name, {})[base] = {
                what: paired([r[key] - b[key] for r, b in zip(runs, refs)])
                for what, key in keys.items() if all(key in r for r in runs + refs)}
    return out


def ranking(rows: dict[str, list[dict[str, Any]]], key: str) -> list[str]:
    """Rows by mean `key`, lowest first."""
    return sorted(rows, key=lambda name: statistics.mean(r[key] for r in rows[name]))


def order_changes(first: list[str], second: list[str]) -> list[tuple[str, str]]:
    """Pairs (a, b) ranked a before b in `first` and b before a in `second` (rows in both only)."""
    common = [r for r in first if r in second]
    return [(a, b) for i, a in enumerate(common) for b in common[i + 1:] if second.index(b) < second.index(a)]


def lr_table(study: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per learning-rate scale ("0.5", "1", "2"): each LR row's loss at seed 0."""
    first = next(iter(study["corpora"].values()))
    loss = loss_key(first["rows"])
    table = {"1": {row: first["rows"][row][0][loss] for row in LR_ROWS if row in first["rows"]}}
    for scale, report in study["lr"].items():
        table[scale] = {row: runs[0][loss] for row, runs in report["rows"].items()}
    return dict(sorted(table.items(), key=lambda item: float(item[0])))


def summarize_study(study: dict[str, Any]) -> dict[str, Any]:
    corpora = study["corpora"]
    rankings = {c: ranking(r["rows"], loss_key(r["rows"])) for c, r in corpora.items()}
    names = list(corpora)
    lr = lr_table(study) if study["lr"] else {}
    lr_rankings = {s: sorted(v, key=v.__getitem__) for s, v in lr.items()}
    return {"corpora": {c: summarize(r) for c, r in corpora.items()},
            "matched": {c: matched_comparisons(r["rows"]) for c, r in corpora.items()},
            "rankings": rankings,
            "order_changes": order_changes(rankings[names[0]], rankings[names[1]]) if len(names) > 1 else [],
            "lr": lr, "lr_rankings": lr_rankings,
            "lr_flips": {s: order_changes(lr_rankings["1"], r) for s, r in lr_rankings.items() if s != "1"}}


# what the logged passkey set is, by the runs' train.retrieval_anchor (a suite from before the setting: "end")
RETRIEVAL_SET = {
    "end": "A key of 4 characters follows a 4-character cue in random filler; the cue comes again at the end and the "
           "key must be reproduced d tokens after its first occurrence (aah_core/analysis/retrieval.py). Accuracy is "
           f"per key character; chance is 1/62 = {1 / 62:.3f}. The repeat always ends the sequence, so a short distance "
           "plants the key late: a model that learned to copy only from the sequence's start (the copy task starts "
           "every span there) scores by where the key sits, not by distance (`aah eval CHECKPOINT --retrieval` "
           "tables both; the last section measures it).",
    "start": "A key of 4 characters follows a 4-character cue at the start of random filler; the cue comes again d "
             "tokens later and the key must be reproduced there (aah_core/analysis/retrieval.py; these runs' "
             f"`train.retrieval_anchor` is start). Accuracy is per key character; chance is 1/62 = {1 / 62:.3f}. Every "
             "distance asks for the same copy from the sequence's start, where the copy task starts every span, so "
             "only the distance changes: a head whose window is at most d cannot reach the key (`aah eval CHECKPOINT "
             "--retrieval` also tables keys planted further in).",
}


def _verdict(d: dict[str, Any], digits: int) -> str:
    shown = f"{d['mean']:+.{digits}f} ± {d['ci95']:.{digits}f}"
    return f"{shown} (no difference resolved)" if d["within_noise"] else shown


def render_study(study: dict[str, Any]) -> str:
    """The first corpus' report, then retrieval, matched-coverage comparisons, the second corpus and the sweep."""
    summary = summarize_study(study)
    first = next(iter(study["corpora"].values()))
    reports = [*study["corpora"].values(), *study["lr"].values()]
    runs = [r for report in reports for rows in report["rows"].values() for r in rows]
    walls = {id(r): r["wall_s"] for r in runs}  # a run read by two reports (lr x1) counts once
    per_corpus = ", ".join(f"{c} {sum(len(v) for v in r['rows'].values())}" for c, r in study["corpora"].items())
    out = [render(first).rstrip("\n"), "", "## The study: both corpora and the learning-rate sweep", "",
           f"- {len(walls)} runs ({per_corpus}; learning-rate sweep "
           f"{sum(len(v) for r in study['lr'].values() for v in r['rows'].values())}), "
           f"{sum(walls.values()) / 3600:.2f} h of training wall time in total ({statistics.mean(walls.values()):.0f} s per "
           "run, one torch thread each). The sections above describe the first corpus; those below every corpus.",
           "", "## Passkey retrieval at a distance (accuracy, mean ± std over seeds)", "",
           RETRIEVAL_SET[first["settings"].get("train.retrieval_anchor", "end")]]
    for corpus, rsum in summary["corpora"].items():
        dists = sorted({k for e in rsum.values() for k in e if k.startswith("retrieval@")}, key=lambda k: int(k[10:]))
        if not dists:
            continue
        out += ["", f"{corpus} corpus:", "", "| method | " + " | ".join(dists) + " |", "|---" * (len(dists) + 1) + "|"]
        for name, e in rsum.items():
            out.append(f"| {name} | " + " | ".join(f"{e[k][0]:.3f} ± {e[k][1]:.3f}" for k in dists) + " |")
    out += ["", "## Against the windows people deploy, at matched coverage", "",
            "Paired differences (row - baseline, same seed), mean ± the 95% t half-interval over seeds; negative Δloss "
            "and positive Δretrieval favour the row. (no difference resolved): the interval contains 0. The baselines "
            "are matched to full_adaptive's mean causal coverage; every other adaptive row ends at the coverage its "
            "controller chose (causal_coverage: the row's / the baseline's, mean over seeds)."]
    for corpus, per_row in summary["matched"].items():
        loss = loss_key(study["corpora"][corpus]["rows"])
        coverage = {name: e["causal_coverage"][0] for name, e in summary["corpora"][corpus].items()}
        out += ["", f"{corpus} corpus:", "", f"| row | against | causal_coverage | Δ{loss} | Δretrieval_mean |",
                "|---|---|---|---|---|"]
        for name, bases in per_row.items():
            for base, d in bases.items():
                cells = [_verdict(d[k], 4 if k == "loss" else 3) if k in d else "–" for k in COMPARED]
                out.append(f"| {name} | {base} | {coverage[name]:.3f} / {coverage[base]:.3f} | {cells[0]} | {cells[1]} |")
    if len(summary["rankings"]) > 1:
        out += ["", "## A second corpus", ""]
        out += [f"- {corpus}: {' < '.join(rank)}" for corpus, rank in summary["rankings"].items()]
        changes = summary["order_changes"]
        out.append("- Pairs whose order changes between the corpora: "
                   + (", ".join(f"{a} / {b}" for a, b in changes) if changes else "none") + ".")
    if summary["lr"]:
        out += ["", "## Learning-rate sensitivity (one seed)", "", "| lr scale | " + " | ".join(LR_ROWS) + " | ranking |",
                "|---" * (len(LR_ROWS) + 2) + "|"]
        for s, values in summary["lr"].items():
            out.append(f"| ×{s} | " + " | ".join(f"{values[r]:.4f}" if r in values else "–" for r in LR_ROWS)
                       + f" | {' < '.join(summary['lr_rankings'][s])} |")
        flips = [f"×{s}: " + ", ".join(f"{a} / {b}" for a, b in pairs) for s, pairs in summary["lr_flips"].items() if pairs]
        out.append("")
        out.append("- Orderings that flip against ×1: " + ("; ".join(flips) if flips else "none") + ". One seed per "
                   "point: a flip between rows closer than the seed noise above is not evidence of sensitivity.")
    return "\n".join(out) + "\n"
