"""Pure state logic for the dashboard: window plans as URL text, edit history, bulk edits,
per-page query-parameter schemas, run-table helpers. No Streamlit, no HTTP, no torch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlencode

Window = int | None
Plan = list[list[Window]]
FULL = "full"

# -- windows and plans -----------------------------------------------------------------------------


def window_label(w: Window) -> str:
    """`None` -> "full", 64 -> "64"."""
    return FULL if w is None else str(int(w))


def parse_window(label: str | int | None) -> Window:
    """Inverse of `window_label`; accepts "full", "f", "", None or a positive integer (as text or int)."""
    if label is None or (isinstance(label, str) and label.strip().lower() in ("", FULL, "f", "null", "none")):
        return None
    w = int(label)
    if w < 1:
        raise ValueError(f"window {w} is invalid; use an integer >= 1 or full")
    return w


def normalize_plan(plan: Plan, seq_len: int | None = None) -> Plan:
    """A copy with every window >= seq_len written as None (full), as the API does."""
    return [[None if w is None or (seq_len is not None and w >= seq_len) else int(w) for w in row] for row in plan]


def encode_plan(plan: Plan) -> str:
    """Compact, URL-safe text: heads joined by '.', layers by '_', full as 'f' (e.g. "64.f_16.32")."""
    return "_".join(".".join("f" if w is None else str(int(w)) for w in row) for row in plan)


def decode_plan(text: str | None, n_layer: int | None = None, n_head: int | None = None) -> Plan | None:
    """Parse `encode_plan` text; None when it is malformed or does not match the model's shape."""
    if not text:
        return None
    try:
        plan = [[parse_window(cell) for cell in row.split(".")] for row in text.split("_")]
    except ValueError:
        return None
    if n_layer is not None and len(plan) != n_layer:
        return None
    if n_head is not None and any(len(row) != n_head for row in plan):
        return None
    return plan


def changed_cells(a: Plan, b: Plan) -> list[list[bool]]:
    return [[wa != wb for wa, wb in zip(ra, rb)] for ra, rb in zip(a, b)]


def coverage(plan: Plan, seq_len: int) -> dict[str, float]:
    """`acr` and `causal_coverage` of a plan (ARCHITECTURE.md "Coverage metrics"); for display before
    the server answers. The server's numbers are the ones shown once they arrive."""
    ws = [min(seq_len, seq_len if w is None else w) for row in plan for w in row]
    full_pairs = seq_len * (seq_len + 1) / 2
    pairs = sum(w * seq_len - w * (w - 1) / 2 for w in ws)
    return {"acr": sum(w / seq_len for w in ws) / len(ws), "causal_coverage": pairs / (full_pairs * len(ws))}


# -- bulk edits (each returns a new plan) -----------------------------------------------------------


def set_cell(plan: Plan, layer: int, head: int, w: Window) -> Plan:
    out = [list(row) for row in plan]
    out[layer][head] = w
    return out


def set_layer(plan: Plan, layer: int, w: Window) -> Plan:
    out = [list(row) for row in plan]
    out[layer] = [w] * len(out[layer])
    return out


def set_head(plan: Plan, head: int, w: Window) -> Plan:
    out = [list(row) for row in plan]
    for row in out:
        row[head] = w
    return out


def uniform(n_layer: int, n_head: int, w: Window) -> Plan:
    return [[w] * n_head for _ in range(n_layer)]


def k_full_per_layer(plan: Plan, k: int, w: Window) -> Plan:
    """In every layer keep k heads full and set the rest to `w`. The heads kept full are those with
    the widest current windows (ties broken by head index), so the edit respects the current plan."""
    out = []
    for row in plan:
        order = sorted(range(len(row)), key=lambda h: (-(math.inf if row[h] is None else row[h]), h))
        keep = set(order[: max(0, k)])
        out.append([None if h in keep else w for h in range(len(row))])
    return out


def apply_table_edits(plan: Plan, edited_rows: Mapping[Any, Mapping[str, Any]]) -> Plan:
    """Apply `st.data_editor` edits ({row: {"H<h>": label}}) to a plan; returns a new plan."""
    out = [list(row) for row in plan]
    for row, cells in edited_rows.items():
        for col, label in cells.items():
            out[int(row)][int(str(col).lstrip("H"))] = parse_window(label)
    return out


# -- edit history ----------------------------------------------------------------------------------


@dataclass
class PlanHistory:
    """Undo/redo over plans. `version` increases on every change (used to key editor widgets)."""

    base: Plan
    stack: list[Plan] = field(default_factory=list)
    pos: int = 0
    version: int = 0

    def __post_init__(self) -> None:
        if not self.stack:
            self.stack = [self.base]

    @property
    def current(self) -> Plan:
        return self.stack[self.pos]

    @property
    def can_undo(self) -> bool:
        return self.pos > 0

    @property
    def can_redo(self) -> bool:
        return self.pos < len(self.stack) - 1

    def push(self, plan: Plan) -> bool:
        """Record a new plan; returns False (and records nothing) if it equals the current one."""
        if plan == self.current:
            return False
        self.stack = self.stack[: self.pos + 1] + [plan]
        self.pos += 1
        self.version += 1
        return True

    def undo(self) -> Plan:
        if self.can_undo:
            self.pos -= 1
            self.version += 1
        return self.current

    def redo(self) -> Plan:
        if self.can_redo:
            self.pos += 1
            self.version += 1
        return self.current

    def reset(self) -> Plan:
        """Back to the base plan, kept as a new (undoable) step."""
        self.push(self.base)
        return self.current


# -- URL state -------------------------------------------------------------------------------------
# Each page's state is a flat dict; these schemas give each field a kind and a default. Defaults are
# left out of the URL, so links stay short and an empty URL means "the defaults".

PAGE_STATE: dict[str, dict[str, tuple[str, Any]]] = {
    "editor": {"model": ("str", ""), "plan": ("str", ""), "eval": ("str", "mixed"),
               "layer": ("int", 0), "head": ("int", 0), "metric": ("str", "causal_coverage")},
    "attention": {"model": ("str", ""), "text": ("str", ""), "layer": ("int", 0), "head": ("int", 0),
                  "window": ("str", "own"), "bucket": ("int", 0)},
    "runs": {"experiment": ("str", ""), "preset": ("str", ""), "status": ("str", ""), "q": ("str", ""),
             "allparams": ("bool", False), "paper": ("bool", True)},
    "acr": {"run": ("int", 0), "keys": ("strs", ["val_loss", "train_loss"]), "smooth": ("float", 0.6),
            "step": ("int", -1)},
    "compare": {"runs": ("ints", []), "keys": ("strs", ["val_loss"]), "agg": ("str", "last"),
                "step": ("int", 0), "paper": ("bool", False), "smooth": ("float", 0.6)},
    "present": {"deck": ("ints", []), "slide": ("int", 0), "mode": ("str", "")},
}


def _decode_value(kind: str, raw: str, default: Any) -> Any:
    try:
        if kind == "str":
            return raw
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return raw.lower() in ("1", "true", "yes", "on")
        if kind == "ints":
            return [int(x) for x in raw.split(",") if x.strip()]
        if kind == "strs":
            return [x for x in raw.split(",") if x]
    except ValueError:
        return default
    raise ValueError(f"unknown state kind {kind!r}")


def _encode_value(kind: str, value: Any) -> str:
    if kind == "bool":
        return "1" if value else "0"
    if kind in ("ints", "strs"):
        return ",".join(str(x) for x in value)
    return str(value)


def defaults(page: str) -> dict[str, Any]:
    return {name: (list(d) if isinstance(d, list) else d) for name, (_, d) in PAGE_STATE[page].items()}


def decode_state(page: str, params: Mapping[str, str]) -> dict[str, Any]:
    """Query parameters -> the page's full state (missing or malformed fields take their default)."""
    state = defaults(page)
    for name, (kind, default) in PAGE_STATE[page].items():
        if name in params and params[name] is not None:
            state[name] = _decode_value(kind, str(params[name]), default)
    return state


def encode_state(page: str, state: Mapping[str, Any]) -> dict[str, str]:
    """A page's state -> query parameters, leaving out fields equal to their default."""
    out = {}
    for name, (kind, default) in PAGE_STATE[page].items():
        if name in state and state[name] != default:
            out[name] = _encode_value(kind, state[name])
    return out


def coerce_state(page: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """A stored state (URL text, typed values, or a mix, as saved views hold) -> the page's full state."""
    text = {}
    for name, (kind, _) in PAGE_STATE[page].items():
        if name in state and state[name] is not None:
            v = state[name]
            text[name] = v if isinstance(v, str) else _encode_value(kind, v)
    return decode_state(page, text)


DEFAULT_PAGE = "editor"  # served at the app's root URL (Streamlit gives the default page no path)


def page_path(page: str) -> str:
    return "" if page == DEFAULT_PAGE else page


def share_url(base_url: str, page: str, state: Mapping[str, Any]) -> str:
    """The link that reopens this view: `<app>/<page>?<state>` (the editor lives at `<app>/`)."""
    query = urlencode(encode_state(page, state))
    return f"{base_url.rstrip('/')}/{page_path(page)}" + (f"?{query}" if query else "")


# -- runs ------------------------------------------------------------------------------------------


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


def suggest_window(buckets: list[Window], mass: list[float], tau: float) -> Window:
    """The smallest bucket whose retained attention mass is >= tau (full if none reaches it)."""
    order = sorted(range(len(buckets)), key=lambda k: math.inf if buckets[k] is None else buckets[k])
    for k in order:
        if mass[k] is not None and mass[k] >= tau:
            return buckets[k]
    return None
