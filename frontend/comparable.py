"""Which runs may share an axis, pure logic (no Streamlit, no HTTP).

A loss curve of a 4-layer, 256-token model and one of a 0.5 B-parameter model from the paper are not
comparable: they never go on one axis. Runs are grouped by `run_family`:
the model's shape for our runs, the reported model for the paper's reference figures.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

_SHAPE_KEYS = ("model.n_layer", "model.n_head", "model.d_model", "model.seq_len")


def run_family(run: Mapping[str, Any]) -> str:
    """A label naming what a run's numbers are comparable with, e.g. "4×4 heads, d=128, T=256"."""
    params = run.get("params") or {}
    if run.get("read_only"):
        return f"paper: {params.get('model', '?')} model"
    if all(k in params for k in _SHAPE_KEYS):
        n_layer, n_head, d_model, seq_len = (params[k] for k in _SHAPE_KEYS)
        return f"{n_layer}×{n_head} heads, d={d_model}, T={seq_len}"
    return f"{run.get('source') or 'run'}: shape not recorded"


def default_selection(runs: Sequence[Mapping[str, Any]], n: int = 2) -> list[int]:
    """The first `n` runs (in list order) of the first run's family: a default never mixes families."""
    if not runs:
        return []
    family = run_family(runs[0])
    return [r["id"] for r in runs if run_family(r) == family][:n]


def families(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Run ids grouped by family, in first-seen order."""
    out: dict[str, list[int]] = {}
    for r in runs:
        out.setdefault(run_family(r), []).append(r["id"])
    return out


def plan_shape(run: Mapping[str, Any]) -> tuple[int, int] | None:
    """(layers, heads per layer) of a run's window plans, from its params; None when not recorded."""
    params = run.get("params") or {}
    try:
        return int(params["model.n_layer"]), int(params["model.n_head"])
    except (KeyError, TypeError, ValueError):
        return None
