"""AAH Studio dashboard entry: `streamlit run frontend/app.py` (reads AAH_API_URL, see frontend/api.py).

Builds the page navigation and nothing else. `?mode=present` hides the sidebar for slides."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # `streamlit run frontend/app.py` puts frontend/ first, not the repo root
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

# Not "pages/": Streamlit runs a directory of that name as a legacy multipage app and never executes
# this file (so no st.navigation, no page config). See docs/frontend.md.
_PAGES = Path(__file__).resolve().parent / "app_pages"
_ICON = Path(__file__).resolve().parent / "icon.png"
PAGES = [
    ("editor", "Window editor", ":material/grid_on:"),
    ("attention", "Attention", ":material/blur_on:"),
    ("runs", "Runs", ":material/table_rows:"),
    ("acr", "ACR curves", ":material/show_chart:"),
    ("compare", "Compare", ":material/compare_arrows:"),
    ("present", "Present", ":material/slideshow:"),
]


def run() -> None:
    # the URL for links; session state for the run right after the Present button (the URL follows)
    presenting = "present" in (st.query_params.get("mode"), st.session_state.get("present.mode"))
    # a local file: a ":material/...:" page icon makes the browser fetch the favicon from a font CDN
    st.set_page_config(page_title="AAH Studio", page_icon=str(_ICON), layout="wide",
                       initial_sidebar_state="collapsed" if presenting else "auto")
    pages = [st.Page(str(_PAGES / f"{name}.py"), title=title, icon=icon, url_path=name, default=(i == 0))
             for i, (name, title, icon) in enumerate(PAGES)]
    nav = st.navigation(pages, position="hidden" if presenting else "sidebar")
    if not presenting:
        from frontend.api import API_URL

        st.sidebar.caption(f"API: {API_URL}")
    nav.run()


run()
