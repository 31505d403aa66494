"""The dashboard's plan type and its one codec: windows as labels ("full" or an integer), plans as the
API's JSON (lists of int | None, None = full) and as compact URL text, plus the bulk edits of the window
editor. Pure: no Streamlit, no HTTP, no torch."""

from __future__ import annotations

from typing import Any, Mapping

Window = int | None
Plan = list[list[Window]]
FULL = "full"  # a full window (JSON null) in text: labels and URLs
LEGACY_URL_FULL = "f"  # links made before "full" wrote it so; still read

# -- windows and plans -----------------------------------------------------------------------------


def window_label(w: Window) -> str:
    """`None` -> "full", 64 -> "64"."""
    return FULL if w is None else str(int(w))


def parse_window(label: str | int | None) -> Window:
    """Inverse of `window_label`: "full" or None -> None, a positive integer (as text or int) -> itself."""
    if label is None or label == FULL:
        return None
    if isinstance(label, bool) or isinstance(label, float):
        raise ValueError(f"window {label!r} is invalid; use an integer >= 1 or full")
    w = int(label)
    if w < 1:
        raise ValueError(f"window {w} is invalid; use an integer >= 1 or full")
    return w


def url_window(cell: str) -> Window:
    """One window of link text: `parse_window`, plus the "f" of links made before."""
    return None if cell == LEGACY_URL_FULL else parse_window(cell)


def normalize_plan(plan: Plan, seq_len: int | None = None) -> Plan:
    """A copy with every window >= seq_len written as None (full), as the API does."""
    return [[None if w is None or (seq_len is not None and w >= seq_len) else int(w) for w in row] for row in plan]


def encode_plan(plan: Plan) -> str:
    """Compact, URL-safe text: heads joined by '.', layers by '_' (e.g. "64.full_16.32")."""
    return "_".join(".".join(window_label(w) for w in row) for row in plan)


def decode_plan(text: str | None, n_layer: int | None = None, n_head: int | None = None) -> Plan | None:
    """Parse `encode_plan` text; None when it is malformed or does not match the model's shape."""
    if not text:
        return None
    try:
        plan = [[url_window(cell) for cell in row.split(".")] for row in text.split("_")]
    except ValueError:
        return None
    if n_layer is not None and len(plan) != n_layer:
        return None
    if n_head is not None and any(len(row) != n_head for row in plan):
        return None
    return plan


def repair_plan(text: str, own: Plan) -> tuple[Plan, list[str]]:
    """A plan from link text, keeping what is valid: a cell that is not a window takes the model's own
    window there. Returns (plan, what was ignored). A plan of another shape is ignored whole (own plan)."""
    rows = text.split("_")
    shape = f"{len(own)} layers × {len(own[0])} heads" if own else "no heads"
    if len(rows) != len(own) or any(len(r.split(".")) != len(o) for r, o in zip(rows, own)):
        return [list(r) for r in own], [f"plan={text} (not a plan for this model's {shape}; showing its own plan)"]
    plan, bad = [], []
    for layer, (row, own_row) in enumerate(zip(rows, own)):
        plan.append([])
        for head, (cell, w) in enumerate(zip(row.split("."), own_row)):
            try:
                plan[-1].append(url_window(cell))
            except ValueError:
                plan[-1].append(w)
                bad.append(f"L{layer}H{head}={cell!r}")
    if bad:
        return plan, [f"plan: {', '.join(bad)} (a window is an integer >= 1 or {FULL}; "
                      "those heads keep the model's own window)"]
    return plan, []


def changed_cells(a: Plan, b: Plan) -> list[list[bool]]:
    return [[wa != wb for wa, wb in zip(ra, rb)] for ra, rb in zip(a, b)]


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


def window_order(w: Window) -> tuple[bool, int]:
    """A sort key: narrow to wide, full (None) last."""
    return (w is None, 0 if w is None else int(w))


def uniform(n_layer: int, n_head: int, w: Window) -> Plan:
    return [[w] * n_head for _ in range(n_layer)]


def k_full_per_layer(plan: Plan, k: int, w: Window) -> Plan:
    """In every layer keep k heads full and set the rest to `w`. The heads kept full are those with
    the widest current windows (ties broken by head index), so the edit respects the current plan."""
    out = []
    for row in plan:
        widest_first = sorted(row, key=window_order, reverse=True)
        order = sorted(range(len(row)), key=lambda h: (widest_first.index(row[h]), h))
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


def suggest_window(buckets: list[Window], mass: list[float], tau: float) -> Window:
    """The smallest bucket whose retained attention mass is >= tau (full if none reaches it)."""
    order = sorted(range(len(buckets)), key=lambda k: window_order(buckets[k]))
    for k in order:
        if mass[k] is not None and mass[k] >= tau:
            return buckets[k]
    return None
