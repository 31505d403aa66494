"""The editor's serving-grains table: what the current plan keeps when serving engines run it, at each
grain (POST /models/{id}/round) in both modes; one click loads a rounded plan into the editor."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from frontend import api, components, history, plans

GRAINS = ("head", "kv_group", "layer", "transformers")
MODES = ("up", "budget")
GRAIN_LABELS = {"head": "per head", "kv_group": "per KV group", "layer": "per layer",
                "transformers": "transformers layer_types"}
MODE_HELP = {"up": "no head sees less context; fewest KV bytes", "budget": "KV bytes ≤ the plan's; lowest loss"}


def roundings(model_id: str, plan: list, eval_set: str) -> list[dict]:
    """The plan rounded to every grain in both modes (the server's answers, cached like evaluations)."""
    return [api.cached("round_plan", model_id, plan, granularity=g, mode=m, eval_set=eval_set)
            for g in GRAINS for m in MODES]


def table_rows(results: list[dict]) -> list[dict]:
    """One row per rounding: grain, mode, loss, Δloss (vs the per-head plan), KV bytes and % of full."""
    return [{"grain": GRAIN_LABELS[r["granularity"]], "mode": r["mode"], "loss": f"{r['loss']:.4f}",
             "Δloss": f"{r['delta']:+.4f}", "KV bytes": f"{r['kv_bytes']:,}",
             "KV % of full": f"{100.0 * r['kv_bytes'] / r['kv_bytes_full']:.1f}",
             "window": "" if r["granularity"] != "transformers" else
             ("all full" if r.get("window") is None else f"w={r['window']}")} for r in results]


def rounded_key(model_id: str, eval_set: str) -> str:
    """Where the last table's answers are kept for the loss plot (per model and eval set)."""
    return f"editor._rounded.{model_id}.{eval_set}"


def serving_table(model: dict, hist: history.PlanHistory, eval_set: str,
                  load: Callable[[history.PlanHistory, list], None]) -> None:
    """Under the cost line: loss, Δloss and KV bytes at each serving grain; `load` puts a row's plan in
    the editor (an undoable edit). Built only while its expander is open (it asks 8 roundings)."""
    with components.lazy_expander("Serving grains: what this plan keeps when engines serve it", "editor._serving") as box:
        if not box.open:
            return
        with api.guard("rounding the plan to serving grains"), st.spinner("Rounding the plan to serving grains..."):
            results = roundings(model["id"], hist.current, eval_set)
            st.session_state[rounded_key(model["id"], eval_set)] = {"plan": hist.current, "results": results}
            widths = [2, 1, 1, 1, 1.4, 1, 1, 1]
            header = st.columns(widths)
            for col, name in zip(header, ["grain", "mode", "loss", "Δloss", "KV bytes", "KV % of full", "window", ""]):
                col.caption(name)
            for r, row in zip(results, table_rows(results)):
                cols = st.columns(widths)
                for col, value in zip(cols, row.values()):
                    col.write(value)
                cols[-1].button("Load", key=f"editor._load.{r['granularity']}.{r['mode']}.{plans.encode_plan(r['windows'])}",
                                help=f"{MODE_HELP[r['mode']]}. {r['note']}", on_click=load,
                                args=(hist, r["windows"]), disabled=r["windows"] == hist.current)
            st.caption("Δloss: against this plan's loss. KV bytes at the model's context, one sequence (as the "
                       "cost line). Export a rounded plan as a folder engines load with `aah export` or "
                       "POST /models/{id}/export (README: From a plan to a served model).")


def rounded_points(model_id: str, eval_set: str, plan: list, x: str) -> list[dict]:
    """The last table's rounded plans as points (x, loss, label) for the loss plot, if it was made for `plan`."""
    kept = st.session_state.get(rounded_key(model_id, eval_set))
    if not kept or kept["plan"] != plan:
        return []
    return [{"x": r[x], "y": r["loss"], "label": f"{r['granularity']} {r['mode']}"} for r in kept["results"]]
