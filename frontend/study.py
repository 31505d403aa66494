"""The reproduction view's study, pure logic (no Streamlit, no HTTP): which suite experiment holds which
corpus and learning-rate scale, retrieval accuracy by distance per row, rankings and where they change
between corpora or learning rates, and the matched-coverage comparisons as table rows.

Suite runs carry `suite.scale`, `suite.corpus` and `suite.lr_scale` params (backend/seed/suite.py); packs
written before the study carry neither of the last two and read as the code corpus at x1.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from frontend.groups import row_order

RETRIEVAL = "retrieval@"
MATCHED_BASELINES = ("fixed_window", "sink_window", "local_global")
ADAPTIVE_MODES = ("aah", "learned")
LOSS_KEYS = ("val_text_loss", "val_loss")  # the loss a study compares: the text alone when the runs have it
# key characters behind one retrieval@d of one run: 64 sequences x 4 (aah_core/analysis/retrieval.py)
RETRIEVAL_CELL_CHARS = 256


def run_corpus(run: Mapping[str, Any]) -> str:
    return str((run.get("params") or {}).get("suite.corpus") or "code")


def run_lr_scale(run: Mapping[str, Any]) -> float:
    return float((run.get("params") or {}).get("suite.lr_scale") or 1)


def catalog(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Suite scale -> {corpus: experiment} over the runs at x1 learning rate; "lr" corpus key excluded."""
    out: dict[str, dict[str, str]] = {}
    for r in runs:
        if run_lr_scale(r) == 1:
            scale = str((r.get("params") or {}).get("suite.scale") or "?")
            out.setdefault(scale, {}).setdefault(run_corpus(r), r["experiment"])
    return {scale: dict(sorted(c.items(), key=lambda kv: (kv[0] != "code", kv[0]))) for scale, c in out.items()}


def loss_key(runs: Sequence[Mapping[str, Any]]) -> str:
    """val_text_loss when every run has it, else val_loss."""
    has = [r for r in runs if r.get("group")]
    return LOSS_KEYS[0] if has and all((r.get("summary") or {}).get(LOSS_KEYS[0]) is not None for r in has) \
        else LOSS_KEYS[1]


# where a run's logged passkey set plants its key (aah_core/analysis/retrieval.py): runs from before the
# setting have no such param and planted it where its repeat ends the sequence
ANCHOR_PARAM = "train.retrieval_anchor"
RETRIEVAL_SET = {
    "end": "A 4-character key follows a 4-character cue in random filler; the cue comes again at the end and the "
           "key must be reproduced d tokens after it first appeared. The repeat always ends the sequence, so a short "
           "distance plants the key late: a model that learned to copy only from the sequence's start (the suite's "
           "copy task starts every span there) scores by where the key sits, not by distance. "
           "`aah eval CHECKPOINT --retrieval` tables both.",
    "start": "A 4-character key follows a 4-character cue at the start of random filler; the cue comes again d "
             "tokens later and the key must be reproduced there. Every distance asks for the same copy from the "
             "sequence's start (where the suite's copy task starts every span), so only the distance changes. "
             "`aah eval CHECKPOINT --retrieval` also tables keys planted further in.",
}


def describe_set(anchor: str) -> str:
    """RETRIEVAL_SET's sentence for `anchor`, or one that says the dashboard does not know it (a newer engine's)."""
    return RETRIEVAL_SET.get(anchor, f"These runs logged a passkey set this dashboard does not know ({anchor!r}).")


def retrieval_anchors(runs: Sequence[Mapping[str, Any]], experiment: str) -> list[str]:
    """The passkey sets (RETRIEVAL_SET's keys) the experiment's runs logged, sorted."""
    return sorted({str((r.get("params") or {}).get(ANCHOR_PARAM) or "end") for r in runs if r["experiment"] == experiment})


def distances(keys: Sequence[str]) -> list[int]:
    return sorted({int(k[len(RETRIEVAL):]) for k in keys if k.startswith(RETRIEVAL) and k[len(RETRIEVAL):].isdigit()})


def chance_bound(chance: float) -> float:
    """The most one run's retrieval@d reaches by luck: chance plus 4 binomial standard errors of its cell (the
    bound a random model stays under in tests/core/test_retrieval.py)."""
    return chance + 4 * math.sqrt(chance * (1 - chance) / RETRIEVAL_CELL_CHARS)


def unlearned_note(rows: Sequence[Mapping[str, Any]], chance: float) -> str | None:
    """What to say when no row retrieves above chance at any distance (runs too short to learn the task), else None."""
    bound = chance_bound(chance)
    if not rows or any(m > bound for r in rows for m in r["mean"] if m is not None):
        return None
    return (f"No row retrieves above chance at any distance: every mean is at most {bound:.3f} (chance {chance:.3f} "
            "plus 4 binomial standard errors of one run's 256 key characters, which a random model stays under). "
            "These runs did not learn the task, so their retrieval differences measure noise.")


def retrieval_rows(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per group (row), in the paper's order: accuracy mean and std over seeds at each distance."""
    out = []
    for g in groups:
        stats = g.get("stats") or {}
        ds = [d for d in distances(list(stats)) if stats.get(f"{RETRIEVAL}{d}")]
        if ds:
            out.append({"row": g["group"], "distance": ds, "n": max(stats[f"{RETRIEVAL}{d}"]["n"] for d in ds),
                        "mean": [stats[f"{RETRIEVAL}{d}"]["mean"] for d in ds],
                        "std": [stats[f"{RETRIEVAL}{d}"]["std"] for d in ds]})
    order = row_order([r["row"] for r in out])
    return sorted(out, key=lambda r: order.index(r["row"]))


def ranking(groups: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    """Rows by mean `key`, lowest first (rows without it left out)."""
    means = {g["group"]: s["mean"] for g in groups if (s := (g.get("stats") or {}).get(key))}
    return sorted(means, key=means.__getitem__)


def order_changes(first: Sequence[str], second: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (a, b) with a before b in `first` and after it in `second` (rows in both only)."""
    common = [r for r in first if r in second]
    return [(a, b) for i, a in enumerate(common) for b in common[i + 1:] if second.index(b) < second.index(a)]


def lr_table(main_runs: Sequence[Mapping[str, Any]], lr_runs: Sequence[Mapping[str, Any]], key: str,
             seed: int = 0) -> dict[float, dict[str, float]]:
    """lr scale -> {row: `key` at `seed`}: x1 from the corpus' own runs of the rows the sweep has, the other
    scales from the sweep's runs (group "<row> · lr×<scale>")."""
    swept: dict[float, dict[str, float]] = {}
    for r in lr_runs:
        value = (r.get("summary") or {}).get(key)
        if r.get("seed") == seed and isinstance(value, float):
            swept.setdefault(run_lr_scale(r), {})[str(r["group"]).split(" · ")[0]] = value
    rows = {row for values in swept.values() for row in values}
    base = {str(r["group"]): v for r in main_runs if r.get("seed") == seed and r.get("group") in rows
            and isinstance(v := (r.get("summary") or {}).get(key), float)}
    return dict(sorted({**swept, **({1.0: base} if base else {})}.items()))


def adaptive_groups(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rows whose controller allocates windows per head (the AAH rows and learned_budget)."""
    found = {str(r["group"]) for r in runs if r.get("group")
             and (r.get("params") or {}).get("controller.mode") in ADAPTIVE_MODES}
    return row_order(sorted(found))


def verdict(d: Mapping[str, Any] | None, digits: int) -> str:
    """"+0.0123 ± 0.0200 · no difference resolved" (mean ± 95% half-interval over n seeds)."""
    if not d or d.get("mean") is None:
        return "–"
    if d.get("ci95") is None:
        return f"{d['mean']:+.{digits}f} (n={d['n']}: no interval)"
    word = "resolved" if d["resolved"] else "no difference resolved"
    return f"{d['mean']:+.{digits}f} ± {d['ci95']:.{digits}f} (n={d['n']}) · {word}"


def mean_coverage(runs: Sequence[Mapping[str, Any]], key: str = "causal_coverage") -> dict[str, float]:
    """Per group: the mean of its runs' final `key` (groups without it left out)."""
    by: dict[str, list[float]] = {}
    for r in runs:
        value = (r.get("summary") or {}).get(key)
        if r.get("group") and isinstance(value, (int, float)):
            by.setdefault(str(r["group"]), []).append(float(value))
    return {group: sum(values) / len(values) for group, values in by.items()}


def matched_table(paired: Mapping[str, Sequence[Mapping[str, Any]]], rows: Sequence[str], loss: str,
                  retrieval: str = "retrieval_mean", coverage: Mapping[str, float] | None = None
                  ) -> list[dict[str, str]]:
    """One line per (adaptive row, matched baseline): the two rows' mean causal coverage (a baseline is matched
    to full_adaptive's; another adaptive row ends where its controller put it), Δloss and Δretrieval with their
    intervals. `paired`: baseline -> the API's paired differences against it."""
    out = []
    cov = coverage or {}
    for base, diffs in paired.items():
        by = {(d["group"], d["key"]): d for d in diffs}
        for row in rows:
            if (row, loss) in by or (row, retrieval) in by:
                shown = f"{cov[row]:.3f} / {cov[base]:.3f}" if row in cov and base in cov else "–"
                out.append({"row": row, "against": base, "causal_coverage": shown,
                            f"Δ{loss}": verdict(by.get((row, loss)), 4),
                            f"Δ{retrieval}": verdict(by.get((row, retrieval)), 3)})
    order = row_order(rows)
    return sorted(out, key=lambda r: (order.index(r["row"]), MATCHED_BASELINES.index(r["against"])
                                      if r["against"] in MATCHED_BASELINES else 99))

