"""The paper's reported numbers as a read-only experiment, ``paper (reported)``.

Source: arXiv 2608.19203 (Asymmetric Attention Heads), Table 1 (final training-loop row at
step 10000, validation on the first 20 validation blocks, seed 0, T = 4096, 1b model) and
Table 2 (``infer.py`` on the step-10000 checkpoint, 61 validation blocks), as transcribed in
shared/reference/aah_method.md §6.1-6.2. These are the paper's figures, not ours: the runs
carry ``read_only: true`` and a ``source`` param so nobody mistakes them for local results.
Differences below ~0.01 in val_loss are within the paper's own export-to-export noise.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Experiment
from backend.store import create_run, log_metrics, now_ms

EXPERIMENT = "paper (reported)"
STEP = 10000
_FRAC_KEYS = ("window_frac/512", "window_frac/1024", "window_frac/2048", "window_frac/full")

# method -> (variant, commit). The rows come from two commits of the paper's code.
_METHODS = {
    "Pure baseline": ("pure", "4b660cc"),
    "grouping_off": ("grouping_off", "4b660cc"),
    "Full adaptive": ("full_adaptive", "4b660cc"),
    "Shallow freeze": ("shallow_freeze", "aa92c47"),
    "Deep practical reuse": ("deep_reuse", "aa92c47"),
}

# variant -> the matching row of our reproduction suite (aah_core/suite.py): the run's group
SUITE_ROW = {"pure": "baseline", "grouping_off": "grouping_off", "full_adaptive": "full_adaptive",
             "shallow_freeze": "shallow_freeze", "deep_reuse": "deep_practical_reuse"}

# Table 1: val_loss, val_ppl, acr (training), flops_ratio, train tok/s, peak GiB, fractions, final train loss,
# mean ACR after warm-up.
_TABLE1 = {
    "Pure baseline": (6.5672, 711.36, 1.0, 1.0, 4418, 35.18, None, 7.163, None),
    "grouping_off": (6.5655, 710.20, 0.5814, 0.8712, 3634, 36.00, (.328, .089, .130, .453), 7.092, 0.569),
    "Full adaptive": (6.5590, 705.55, 0.3066, 0.7867, 3399, 36.78, (.630, .120, .104, .146), 7.056, 0.281),
    "Shallow freeze": (6.5367, 689.99, 0.3724, 0.8069, 3534, 36.77, (.500, .188, .099, .214), 7.049, 0.385),
    "Deep practical reuse": (6.5549, 702.65, 0.2891, 0.7812, 3395, 36.62, (.563, .250, .063, .125), 7.067, 0.296),
}

# Table 2: val_loss, val_ppl, acr (inference), flops_ratio, infer tok/s, fractions.
_TABLE2 = {
    "Pure baseline": (6.5878, 726.21, 1.0, 1.0, 14420, None),
    "grouping_off": (6.5893, 727.27, 0.5794, 0.8706, 8193, (.327, .088, .136, .449)),
    "Full adaptive": (6.5824, 722.26, 0.2575, 0.7715, 4455, (.632, .177, .112, .078)),
    "Shallow freeze": (6.5583, 705.09, 0.3393, 0.7967, 7053, (.514, .169, .168, .149)),
    "Deep practical reuse": (6.5833, 722.93, 0.3625, 0.8038, 4845, (.502, .200, .096, .202)),
}


def _table1_metrics(row: tuple) -> dict[str, float]:
    val, ppl, acr, flops, tps, peak, fracs, train_loss, mean_acr = row
    out = {"val_loss": val, "val_ppl": ppl, "acr": acr, "flops_ratio": flops, "train_tokens_per_s": tps,
           "peak_alloc_gib": peak, "train_loss": train_loss}
    if mean_acr is not None:
        out["mean_acr_after_warmup"] = mean_acr
    if fracs is not None:
        out.update(zip(_FRAC_KEYS, fracs, strict=True))
    return out


def _table2_metrics(row: tuple) -> dict[str, float]:
    val, ppl, acr, flops, tps, fracs = row
    out = {"val_loss": val, "val_ppl": ppl, "acr": acr, "flops_ratio": flops, "infer_tokens_per_s": tps}
    if fracs is not None:
        out.update(zip(_FRAC_KEYS, fracs, strict=True))
    return out


def paper_runs() -> list[tuple[str, dict[str, str], dict[str, float]]]:
    """(run name, params, metrics at step 10000) for every row of Tables 1 and 2."""
    common = {"source": "arXiv 2608.19203 (reported by the paper, not reproduced here)", "seq_len": "4096",
              "model": "1b", "seed": "0", "step": str(STEP)}
    runs = []
    for method, row in _TABLE1.items():
        variant, commit = _METHODS[method]
        params = {**common, "table": "Table 1 (training loop)", "method": method, "variant": variant,
                  "commit": commit, "val_blocks": "20"}
        runs.append((f"{method} · Table 1", params, _table1_metrics(row)))
    for method, row in _TABLE2.items():
        variant, commit = _METHODS[method]
        params = {**common, "table": "Table 2 (infer.py)", "method": method, "variant": variant,
                  "commit": commit, "val_blocks": "61"}
        runs.append((f"{method} · Table 2", params, _table2_metrics(row)))
    return runs


def seed_paper_reference(s: Session) -> bool:
    """Create the reference experiment once; returns False when it already exists."""
    if s.scalar(select(Experiment.id).where(Experiment.name == EXPERIMENT)) is not None:
        return False
    ts = now_ms() / 1000
    for name, params, metrics in paper_runs():
        run_id = create_run(s, name=name, experiment=EXPERIMENT, status="FINISHED", params=params,
                            read_only=True, seq_len=4096, source="paper", group=SUITE_ROW[params["variant"]],
                            seed=int(params["seed"]))
        log_metrics(s, run_id, [(k, STEP, float(v), ts) for k, v in metrics.items()])
    return True
