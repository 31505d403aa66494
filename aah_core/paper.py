"""The paper's reported numbers, in one place and under one naming: our preset names.

Source: arXiv 2608.19203 (Asymmetric Attention Heads), Table 1 (final training-loop row at step
10000, validation on the first 20 validation blocks, seed 0, T = 4096, 1b model) and Table 2
(``infer.py`` on the step-10000 checkpoint, 61 validation blocks), as transcribed in
shared/reference/aah_method.md §6.1-6.2. These are the paper's figures, not ours. Each row is keyed
by the preset that reproduces it (aah_core/presets.py); the paper's own label for the
row ("Pure baseline", "Deep practical reuse", ...) is kept only as `label`, for display.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP = 10000
SEQ_LEN = 4096
FRACTION_BUCKETS = ("512", "1024", "2048", "full")  # T/8, T/4, T/2, T: the window_frac/<bucket> keys
Fractions = tuple[float, float, float, float]


@dataclass(frozen=True)
class Table1Row:
    """Training loop at step 10000."""

    val_loss: float
    val_ppl: float
    acr: float
    flops_ratio: float
    train_tokens_per_s: float
    peak_alloc_gib: float
    fractions: Fractions | None
    train_loss: float
    mean_acr_after_warmup: float | None


@dataclass(frozen=True)
class Table2Row:
    """infer.py on the step-10000 checkpoint."""

    val_loss: float
    val_ppl: float
    acr: float
    flops_ratio: float
    infer_tokens_per_s: float
    fractions: Fractions | None


@dataclass(frozen=True)
class PaperRow:
    row: str  # the preset that reproduces it
    label: str  # the paper's name for the row
    commit: str  # the commit of the paper's code the row came from
    table1: Table1Row
    table2: Table2Row


ROWS: tuple[PaperRow, ...] = (
    PaperRow("baseline", "Pure baseline", "4b660cc",
             Table1Row(6.5672, 711.36, 1.0, 1.0, 4418, 35.18, None, 7.163, None),
             Table2Row(6.5878, 726.21, 1.0, 1.0, 14420, None)),
    PaperRow("grouping_off", "grouping_off", "4b660cc",
             Table1Row(6.5655, 710.20, 0.5814, 0.8712, 3634, 36.00, (.328, .089, .130, .453), 7.092, 0.569),
             Table2Row(6.5893, 727.27, 0.5794, 0.8706, 8193, (.327, .088, .136, .449))),
    PaperRow("full_adaptive", "Full adaptive", "4b660cc",
             Table1Row(6.5590, 705.55, 0.3066, 0.7867, 3399, 36.78, (.630, .120, .104, .146), 7.056, 0.281),
             Table2Row(6.5824, 722.26, 0.2575, 0.7715, 4455, (.632, .177, .112, .078))),
    PaperRow("shallow_freeze", "Shallow freeze", "aa92c47",
             Table1Row(6.5367, 689.99, 0.3724, 0.8069, 3534, 36.77, (.500, .188, .099, .214), 7.049, 0.385),
             Table2Row(6.5583, 705.09, 0.3393, 0.7967, 7053, (.514, .169, .168, .149))),
    PaperRow("deep_practical_reuse", "Deep practical reuse", "aa92c47",
             Table1Row(6.5549, 702.65, 0.2891, 0.7812, 3395, 36.62, (.563, .250, .063, .125), 7.067, 0.296),
             Table2Row(6.5833, 722.93, 0.3625, 0.8038, 4845, (.502, .200, .096, .202))),
)
PAPER_ROWS = tuple(r.row for r in ROWS)  # Table 1's rows, in the paper's order


def _fractions(fractions: Fractions | None) -> dict[str, float]:
    return {} if fractions is None else {f"window_frac/{b}": f for b, f in zip(FRACTION_BUCKETS, fractions, strict=True)}


def table1_metrics(row: PaperRow) -> dict[str, float]:
    """Table 1 as metric keys (the names our own runs report)."""
    t = row.table1
    out = {"val_loss": t.val_loss, "val_ppl": t.val_ppl, "acr": t.acr, "flops_ratio": t.flops_ratio,
           "train_tokens_per_s": t.train_tokens_per_s, "peak_alloc_gib": t.peak_alloc_gib, "train_loss": t.train_loss}
    if t.mean_acr_after_warmup is not None:
        out["mean_acr_after_warmup"] = t.mean_acr_after_warmup
    return out | _fractions(t.fractions)


def table2_metrics(row: PaperRow) -> dict[str, float]:
    """Table 2 as metric keys."""
    t = row.table2
    return {"val_loss": t.val_loss, "val_ppl": t.val_ppl, "acr": t.acr, "flops_ratio": t.flops_ratio,
            "infer_tokens_per_s": t.infer_tokens_per_s} | _fractions(t.fractions)
