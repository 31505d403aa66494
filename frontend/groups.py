"""Seeds as groups in the dashboard, pure logic (no Streamlit, no HTTP): labels and keys of groups,
the grouped runs table, the default run of the ACR page, and the rows of the reproduction view
(our suite's groups beside the paper's reported Table 1).

The numbers come from the API: GET /runs/groups (mean, sample std, min and max over a group's
runs) and GET /runs (each run's last values, for the paired differences to the baseline).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

import pandas as pd

SEP = "::"  # between experiment and group in a group's key (compare page state)
PAPER_ORDER = ("baseline", "grouping_off", "full_adaptive", "shallow_freeze", "deep_practical_reuse",
               "fixed_window", "learned_budget")
ADAPTIVE_MODES = ("aah", "learned")  # controller modes whose windows change during training


def group_key(group: Mapping[str, Any]) -> str:
    return f"{group['experiment']}{SEP}{group['group']}"


def split_key(key: str) -> tuple[str, str]:
    experiment, _, group = key.rpartition(SEP)
    return experiment, group


def group_label(group: Mapping[str, Any]) -> str:
    n = len(group["run_ids"])
    return f"{group['group']} · {group['experiment']} ({n} run{'s' * (n != 1)})"


def pm(stat: Mapping[str, Any] | None, digits: int = 4) -> str:
    """"mean ± std (n)", or the one value when there is no std; "–" for none."""
    if not stat:
        return "–"
    if stat.get("std") is None:
        return f"{stat['mean']:.{digits}f} (n={stat['n']})"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f} (n={stat['n']})"


def groups_frame(groups: Sequence[Mapping[str, Any]], key: str) -> pd.DataFrame:
    """One row per group: identity, its runs and seeds, and `key` as mean ± std with min and max."""
    rows = []
    for g in groups:
        stat = (g.get("stats") or {}).get(key) or {}
        rows.append({"group": g["group"], "experiment": g["experiment"], "runs": len(g["run_ids"]),
                     "seeds": ", ".join("?" if s is None else str(s) for s in g["seeds"]),
                     "source": ", ".join(g["sources"]), f"{key} mean": stat.get("mean"),
                     f"{key} std": stat.get("std"), "min": stat.get("min"), "max": stat.get("max"), "n": stat.get("n"),
                     "run ids": ", ".join(f"#{i}" for i in g["run_ids"])})
    return pd.DataFrame(rows)


def default_run(runs: Sequence[Mapping[str, Any]]) -> int | None:
    """The ACR page's run when the link names none: the first listed finished run whose windows change
    during training (an adaptive controller that moved off full attention), else the first run."""
    for r in runs:
        params, summary = r.get("params") or {}, r.get("summary") or {}
        acr = summary.get("acr")
        if (not r.get("read_only") and r.get("status") == "FINISHED"
                and params.get("controller.mode") in ADAPTIVE_MODES and acr is not None and acr < 1):
            return r["id"]
    return runs[0]["id"] if runs else None


def row_order(rows: Sequence[str]) -> list[str]:
    """The paper's row order, then any other row by name."""
    known = [r for r in PAPER_ORDER if r in rows]
    return known + sorted(set(rows) - set(known))


def paired_deltas(runs: Sequence[Mapping[str, Any]], key: str = "val_loss", base: str = "baseline"
                  ) -> dict[str, list[float]]:
    """Per group: `key` minus the baseline's `key` of the same seed (same init and data order), over the
    seeds both have. Runs are one experiment's."""
    by: dict[str, dict[int, float]] = {}
    for r in runs:
        value = (r.get("summary") or {}).get(key)
        if r.get("group") and r.get("seed") is not None and value is not None and math.isfinite(value):
            by.setdefault(r["group"], {})[r["seed"]] = value
    ref = by.get(base, {})
    return {g: [v - ref[s] for s, v in sorted(seeds.items()) if s in ref] for g, seeds in by.items() if g != base}


def _stat(values: Sequence[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None}


REPRO_KEYS = {"val_text_loss": "final val_text_loss (text only)",
              "val_loss": "final val_loss (text and copy averaged, where trained with the copy task)",
              "delta": "Δ val_loss vs baseline (paired by seed)", "acr": "acr",
              "retrieval_mean": "retrieval_mean (passkey accuracy over distances)"}
PAPER_KEYS = {"val_text_loss": "val_loss"}  # the paper's runs were text only: its val_loss is their text loss


def reproduction_rows(ours: Sequence[Mapping[str, Any]], our_runs: Sequence[Mapping[str, Any]],
                      paper_runs: Sequence[Mapping[str, Any]], key: str) -> tuple[list[dict], list[dict]]:
    """(our rows, the paper's rows) for the reproduction view: each {"row", "mean", "std", "n"}.
    Ours: mean ± sample std over seeds (groups of one experiment); `key` "delta" is the paired
    difference to our baseline. The paper's: Table 1 only, one seed, so no std."""
    if key == "delta":
        deltas = paired_deltas(our_runs)
        mine = [{"row": g, **s} for g, vals in deltas.items() if (s := _stat(vals))]
    else:
        mine = [{"row": g["group"], "mean": st["mean"], "std": st["std"], "n": st["n"]}
                for g in ours if (st := (g.get("stats") or {}).get(key))]
    table1 = {r["group"]: (r.get("summary") or {}) for r in paper_runs
              if str((r.get("params") or {}).get("table", "")).startswith("Table 1") and r.get("group")}
    theirs = []
    for row, summary in table1.items():
        if key == "delta":
            value = None if "baseline" not in table1 or row == "baseline" else \
                summary.get("val_loss") - table1["baseline"].get("val_loss")
        else:
            value = summary.get(PAPER_KEYS.get(key, key))
        if value is not None:
            theirs.append({"row": row, "mean": value, "std": None, "n": 1})
    order = row_order([r["row"] for r in mine] + [r["row"] for r in theirs])
    return (sorted(mine, key=lambda r: order.index(r["row"])), sorted(theirs, key=lambda r: order.index(r["row"])))


# the report of each suite the service ships (data/suite/), by scale
SHIPPED_REPORTS = {"mini": "docs/reproduction-mini.md", "long": "docs/reproduction-long.md"}


def suite_scale(runs: Sequence[Mapping[str, Any]]) -> str:
    """The suite scale ("mini", "long", ...) a suite experiment's runs were trained at."""
    return str(((runs[0].get("params") or {}) if runs else {}).get("suite.scale", "?"))


def suite_scale_label(runs: Sequence[Mapping[str, Any]]) -> str:
    """"mini scale: 4×4 heads, d=64, T=128, 400 steps" from a suite experiment's runs' params."""
    p = (runs[0].get("params") or {}) if runs else {}
    shape = f"{p.get('model.n_layer', '?')}×{p.get('model.n_head', '?')} heads, d={p.get('model.d_model', '?')}, " \
            f"T={p.get('model.seq_len', '?')}, {p.get('train.max_steps', '?')} steps"
    return f"{suite_scale(runs)} scale: {shape}"
