"""Present: saved views stepped through as slides (big fonts, no sidebar with ?mode=present) and
exported as one offline HTML deck."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from frontend import api, components, export, user_text, view_manager, views

PAGE = "present"
state = components.bind_state(PAGE)
presenting = state["mode"] == "present"
if presenting:
    st.markdown("<style>[data-testid='stMarkdownContainer'] p, [data-testid='stMarkdownContainer'] li"
                " {font-size: 1.5rem !important;} h2 {font-size: 2.8rem !important;}"
                " [data-testid='stSidebar'], [data-testid='stSidebarCollapsedControl'] {display: none;}</style>",
                unsafe_allow_html=True)
else:
    st.title("Present")

with api.guard("loading saved views", stop=True), st.spinner("Loading saved views..."):
    saved = api.call("views")
    if not saved:
        components.placeholder("No saved views yet. On any page open “Share · save · export” and press “Save view”.")
        st.stop()
    names = {v["id"]: f"#{v['id']} {v['name']} ({v['page']})" for v in saved}
    k = components.key(PAGE, "deck")
    st.session_state[k] = components.keep_known(PAGE, "deck", list(names), "no such saved view") or list(names)
    if not presenting:
        st.multiselect("Slides, in order", list(names), format_func=names.get, key=k)
    deck = st.session_state[k] or list(names)
    sk = components.key(PAGE, "slide")
    components.ensure_option(PAGE, "slide", list(range(len(deck))), f"the deck has {len(deck)} slides",
                             label=lambda i: f"slide {i + 1}")


def _step(delta: int) -> None:
    st.session_state[sk] = min(max(st.session_state[sk] + delta, 0), len(deck) - 1)


def _show(fig: go.Figure, height: int, key: str) -> None:
    """A chart, or a table (the Runs slide) as the page draws it: a dataframe. A Plotly table draws
    every cell as SVG: 60 runs x 20 columns took 3.5 s in Chromium, and tens of seconds on a loaded box."""
    if fig.data and all(isinstance(t, go.Table) for t in fig.data):
        t = fig.data[0]
        df = pd.DataFrame(list(zip(*t.cells.values)), columns=list(t.header.values))
        st.dataframe(df, hide_index=True, height=export.slide_table_height(len(df), height),
                     row_height=export.TABLE_ROW_PX, key=key)
    else:
        components.show_figure(export.exportable(fig).update_layout(height=height), key)


def _mode(m: str) -> None:
    st.session_state[components.key(PAGE, "mode")] = m


c1, c2, c3, c4 = st.columns([1, 1, 4, 2])
c1.button("◀ Prev", key="present._prev", on_click=_step, args=(-1,), disabled=st.session_state[sk] == 0,
          shortcut="Left")
c2.button("Next ▶", key="present._next", on_click=_step, args=(1,), disabled=st.session_state[sk] >= len(deck) - 1,
          shortcut="Right")
c3.caption(f"slide {st.session_state[sk] + 1} of {len(deck)} · ← → move between slides")
c4.button("Leave present mode" if presenting else "Present (full screen, no sidebar)", key="present._mode",
          on_click=_mode, args=("" if presenting else "present",))
state = components.current_state(PAGE)
components.publish(PAGE, state)

view = next(v for v in saved if v["id"] == deck[st.session_state[sk]])
with api.guard(f"slide “{view['name']}”"), st.spinner(f"Rendering “{user_text.md(view['name'])}”..."):
    sec = views.build_section(view["page"], view["state"])
    st.header(user_text.md(view["name"]))
    for line in sec.lines:  # they name runs and metric keys
        st.markdown(f"- {user_text.md(line)}")
    cols = st.columns(export.slide_columns(len(sec.figures)))
    height = export.slide_figure_height(len(sec.figures), len(sec.lines))  # the slide fits one 1100 px screen
    for i, (name, fig) in enumerate(sec.figures.items()):
        with cols[i % len(cols)]:
            _show(fig, height, f"present._fig.{view['id']}.{name}")

if not presenting:
    view_manager.manager(saved)
    with st.expander("Export the deck (one slide per screen; arrow keys move)"), api.guard("exporting the deck"):
        if st.button("Prepare offline HTML deck", key="present._html"):
            with st.spinner(f"Rendering {len(deck)} slides..."):
                chosen = [v for i in deck for v in saved if v["id"] == i]
                sections = []
                for v in chosen:
                    sec = views.build_section(v["page"], v["state"])
                    sec.title = v["name"]
                    sections.append(sec)
                st.session_state["present._doc"] = export.html_document("AAH Studio deck", sections, slides=True)
        if st.session_state.get("present._doc"):
            st.download_button("Download deck (HTML, plotly.js inlined, opens offline)",
                               st.session_state["present._doc"], file_name="aah-deck.html", mime="text/html",
                               key="present._dl")
