"""The Attention page's map panel: the head's large zoomable maps on a chosen colour scale, the layer's
heads as small multiples (click one to open it), and one query's attention as coloured text. Kept out
of the page file so the page stays layout; figures come from `frontend.attention_figures`."""

from __future__ import annotations

import functools

import streamlit as st

from frontend import api, attention_figures, components, plans, views

PAGE = "attention"


def maps(data: dict, scale: str) -> None:
    """The head's full and windowed maps, each as wide as the page (or side by side, smaller; drag to
    zoom, double-click to reset), then the difference and the mass cut off per query."""
    figs = views.attention_section_figures(data, scale)
    pooled = f", average-pooled by {data['pool']}" if data.get("pool", 1) > 1 else ""
    st.caption(f"{data['n_tokens']} tokens{pooled} · window {plans.window_label(data['window'])} · colour: "
               f"{attention_figures.SCALES[scale]} · rows = query, columns = key; the orange staircase is the window's far edge "
               "(keys left of it are cut off). Drag a box to zoom: the axes then name every token; "
               "double-click to zoom out.")
    if st.toggle("Full and windowed side by side (smaller)", key=components.key(PAGE, "side")):
        left, right = st.columns(2)
    else:  # one above the other, each as wide as the page
        left = right = st.container()
    with left:
        components.show_figure(figs["full"], "attention._full")
    with right:
        components.show_figure(figs["windowed"], "attention._windowed")
    left, right = st.columns([3, 2])
    with left:
        components.show_figure(figs["diff"], "attention._diff")
    with right:
        components.show_figure(figs["cut"], "attention._cut")


def _open_head(fkey: str, n_head: int) -> None:
    head = attention_figures.clicked_head(components.clicked_points(st.session_state.get(fkey)), n_head)
    if head is not None:
        st.session_state[components.key(PAGE, "head")] = head


def multiples(state: dict, model: dict, own_text: str | None, offset: int, scale: str) -> None:
    """Every head of the state's layer as a small map; a click opens that head above."""
    n_head, layer = model["n_head"], state["layer"]
    with st.expander(f"All {n_head} heads of layer {layer}", expanded=n_head <= views.MULTIPLES_OPEN_UP_TO):
        if n_head > views.MULTIPLES_OPEN_UP_TO and not st.toggle(f"Draw all {n_head} heads ({n_head} maps to compute)",
                                                           key="attention._multi"):
            return
        with api.guard("the layer's heads"), st.spinner(f"Computing the {n_head} heads of layer {layer}..."):
            fig = views.multiples_figure(state, model, own_text, offset, scale)
            fkey = f"attention._multiples.{layer}.{state['head']}"
            components.click_figure(fig, fkey, functools.partial(_open_head, fkey, n_head))
            st.caption("Each head under its window (as in the maps above), on the chosen colour scale.")


def query_text(data: dict) -> None:
    """One query's attention over the text before it, as the text coloured by weight."""
    with st.expander("One query's attention as text", expanded=False):
        n = len(data["tokens"])
        pool, offset = data.get("pool", 1), data.get("offset", 0)
        c1, c2 = st.columns([3, 1])
        qkey = components.key(PAGE, "query")
        if not 0 <= st.session_state.get(qkey, -1) < n:  # -1 (the default) or past this text: the last token
            st.session_state[qkey] = n - 1
        q = c1.slider("Query token", 0, n - 1, key=qkey,
                      format="%d", help="its position in the map (pooled blocks when the map is pooled)")
        components.ensure_option(PAGE, "querymap", ["windowed", "full"])
        which = c2.radio("Map", ["windowed", "full"], horizontal=True, key=components.key(PAGE, "querymap"))
        st.markdown(attention_figures.query_text_html(data["tokens"], data[which][q], q, offset=offset, pool=pool),
                    unsafe_allow_html=True)
        st.caption(f"Query ({offset + q * pool}) outlined; darker = more of its attention (relative to its largest "
                   "weight; hover a token for the exact weight); grey tokens come after it and are never attended.")
