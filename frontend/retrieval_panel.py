"""The editor's Retrieval panel: passkey retrieval under the edited plan beside the model's own plan's. A key
planted in random filler must be reproduced d tokens later; each table has one row per distance, the key's
repeat ending the sequence (as training logs `retrieval@d`) and the key planted at fixed starts. A model that
copies only from the sequence's start shows as high first columns over a low "at the end" for short distances."""

from __future__ import annotations

import streamlit as st

from frontend import api, components, plans

STATE = "editor._retrieval"
NO_FIT = "–"


def table_rows(resp: dict) -> list[dict]:
    """One row per distance: accuracy with the repeat at the end, then with the key planted at each start
    (NO_FIT where the distance does not fit after that start)."""
    rows = []
    for j, distance in enumerate(resp["distances"]):
        row = {"distance": distance, "repeat at the end": f"{resp['end'][j]:.2f}"}
        for start, column in zip(resp["starts"], resp["by_start"]):
            row[f"key at {start}"] = NO_FIT if column[j] is None else f"{column[j]:.2f}"
        rows.append(row)
    return rows


def _run(model_id: str, plan: list) -> None:
    with api.guard("measuring retrieval"), st.spinner("Measuring passkey retrieval under both plans..."):
        edited = api.call("retrieval", model_id, windows=plan)
        own = api.call("retrieval", model_id, windows=None)
        st.session_state[STATE] = {"model": model_id, "plan": plans.encode_plan(plan), "edited": edited, "own": own}


def retrieval_panel(model: dict, plan: list) -> None:
    """A button; the last result stays until the next press. Built while open."""
    with components.lazy_expander("Retrieval: a planted key reproduced at a distance, under the edited plan and "
                                  "the model's own", "editor._ret_open") as box:
        if not box.open:
            return
        if st.button("Measure", key="editor._ret_btn", help="passkey accuracy by distance and by where the key sits"):
            _run(model["id"], plan)
        res = components.last_plan_result(STATE, model["id"], plan, "Measure",
                                          "test whether each plan can reproduce a key planted d tokens back")
        if res is None:
            return
        left, right = st.columns(2)
        for col, title, resp in ((left, "edited plan", res["edited"]), (right, "model's own plan", res["own"])):
            col.markdown(f"**{title}**")
            col.dataframe(table_rows(resp), hide_index=True)
        edited = res["edited"]
        st.caption(f"Accuracy per key character, {edited['key_chars_per_cell']} key characters a cell; chance is "
                   f"{edited['chance']:.3f}. A 4-character key follows a 4-character cue in random filler; the cue "
                   "comes again and the key must follow it. A head whose window is ≤ d cannot see the key from there. "
                   f"“{NO_FIT}”: the distance does not fit after that start. Measured in "
                   f"{(edited['elapsed_ms'] + res['own']['elapsed_ms']) / 1000:.1f} s.")
