"""Saved views managed from the Present page: rename, move up or down (the stored order, PUT
/views/order) and delete, one row per view. Each change goes to the API and the page redraws."""

from __future__ import annotations

import streamlit as st

from frontend import api, user_text


def moved(ids: list[int], index: int, step: int) -> list[int]:
    """`ids` with the item at `index` moved by `step` places (kept within the list)."""
    out = list(ids)
    target = min(max(index + step, 0), len(out) - 1)
    out.insert(target, out.pop(index))
    return out


def _apply(what: str, method: str, *args, order: list[int] | None = None) -> None:
    """A button's callback: the call, or its error, said on the redraw. With `order` (the views' ids
    after the call), the deck's slides take that order."""
    try:
        api.call(method, *args)
        st.session_state["present._managed"] = what
        if order is not None:
            deck = st.session_state.get("present.deck") or order
            st.session_state["present.deck"] = [i for i in order if i in deck]
    except api.ApiError as exc:
        st.session_state["present._managed"] = f"Could not do it ({what}): {api.error_text(exc)}"


def _rename(view_id: int) -> None:
    name = (st.session_state.get(f"present._name.{view_id}") or "").strip()
    if name:
        _apply(f"Renamed view #{view_id} to “{user_text.md(name)}”.", "rename_view", view_id, name)


def manager(saved: list[dict]) -> None:
    """An expander listing the saved views in their stored order, with rename, ↑, ↓ and delete."""
    with st.expander("Manage saved views (rename, reorder, delete)", expanded=False):
        note = st.session_state.pop("present._managed", None)
        if note:
            st.caption(note)
        ids = [v["id"] for v in saved]
        for i, v in enumerate(saved):
            c1, c2, c3, c4, c5 = st.columns([4, 1, 1, 1, 1], vertical_alignment="bottom")
            name = c1.text_input(f"Name of view #{v['id']} ({v['page']})", v["name"], key=f"present._name.{v['id']}",
                                 max_chars=120)
            c2.button("Rename", key=f"present._rename.{v['id']}", disabled=not name.strip(), on_click=_rename,
                      args=(v["id"],))
            c3.button("↑", key=f"present._up.{v['id']}", disabled=i == 0, help="earlier in the deck",
                      on_click=_apply, args=(f"Moved view #{v['id']} up.", "order_views", moved(ids, i, -1)),
                      kwargs={"order": moved(ids, i, -1)})
            c4.button("↓", key=f"present._down.{v['id']}", disabled=i == len(ids) - 1, help="later in the deck",
                      on_click=_apply, args=(f"Moved view #{v['id']} down.", "order_views", moved(ids, i, 1)),
                      kwargs={"order": moved(ids, i, 1)})
            c5.button("Delete", key=f"present._delete.{v['id']}", on_click=_apply,
                      args=(f"Deleted view #{v['id']} “{v['name']}”.", "delete_view", v["id"]),
                      kwargs={"order": [j for j in ids if j != v["id"]]})
