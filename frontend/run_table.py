"""Run-table helpers for the runs and compare pages: override text, differing params, filters. Pure."""

from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd


def parse_overrides(text: str) -> dict[str, Any]:
    """`key=value` lines (or one JSON object) -> overrides for POST /runs. Values are read as JSON
    where possible (numbers, true/false, null), else kept as text. Raises ValueError naming the line."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"overrides: not valid JSON ({exc.msg} at char {exc.pos})") from exc
        if not isinstance(value, dict):
            raise ValueError("overrides: a JSON object is expected")
        return value
    out: dict[str, Any] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"overrides line {n}: {line!r} is not key=value (e.g. train.max_steps=50)")
        key, raw = (s.strip() for s in line.split("=", 1))
        if not key:
            raise ValueError(f"overrides line {n}: the key is empty")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def differing_params(runs: list[Mapping[str, Any]]) -> list[str]:
    """Parameter keys whose values are not the same across all the given runs (MLflow #7980)."""
    keys = sorted({k for r in runs for k in (r.get("params") or {})})
    return [k for k in keys if len({(r.get("params") or {}).get(k) for r in runs}) > 1]


def filter_runs(runs: list[dict], query: str = "", max_loss: float | None = None,
                coverage_range: tuple[float, float] | None = None, loss_key: str = "val_loss",
                coverage_key: str = "causal_coverage") -> list[dict]:
    """Client-side filters over GET /runs rows: a text match on name/preset/experiment, a loss ceiling
    and a coverage interval (runs without the metric pass the numeric filters)."""
    q = query.strip().lower()
    out = []
    for r in runs:
        hay = " ".join(str(r.get(k) or "") for k in ("name", "preset", "experiment", "id")).lower()
        if q and q not in hay:
            continue
        summary = r.get("summary") or {}
        loss, cov = summary.get(loss_key), summary.get(coverage_key)
        if max_loss is not None and loss is not None and loss > max_loss:
            continue
        if coverage_range is not None and cov is not None and not coverage_range[0] <= cov <= coverage_range[1]:
            continue
        out.append(r)
    return out


IDENTITY = ("source", "experiment", "group", "seed", "preset", "status", "target", "engine_job_id", "engine_state",
            "pending_reason", "error", "tags", "description", "data_hash", "git_rev")


def identity_items(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, text) for the identity fields a run has (tags joined)."""
    out = []
    for k in IDENTITY:
        v = run.get(k)
        if v not in (None, "", []):
            out.append((k, ", ".join(v) if isinstance(v, list) else str(v)))
    return out


def params_frame(run: Mapping[str, Any]) -> pd.DataFrame:
    """Every param of a run, sorted by key: the full resolved config for runs trained by the engine."""
    params = run.get("params") or {}
    return pd.DataFrame({"param": sorted(params), "value": [params[k] for k in sorted(params)]})


def parse_tags(text: str) -> list[str]:
    """"a, b ,, a" -> ["a", "b"]: comma-separated, trimmed, empties and repeats dropped (the API checks the rest)."""
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


# One number format per metric, for the dashboard's table and its export alike (issue 23: mixed decimals).
METRIC_DECIMALS = {"val_loss": 4, "acr": 3, "causal_coverage": 3}


def metric_text(column: str, value: Any, decimals: Mapping[str, int] = METRIC_DECIMALS) -> str:
    """A table cell as text: a metric with its fixed decimals, a missing value as "", others as str."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    digits = decimals.get(column)
    return f"{float(value):.{digits}f}" if digits is not None and isinstance(value, (int, float)) else str(value)
