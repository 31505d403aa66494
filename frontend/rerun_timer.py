"""A rerun the browser asks for after a delay (Streamlit Components v2, inline code): used when the API
is busy (429), so the script never sleeps while the session waits. The rerun is of the fragment the
timer is drawn in, or of the page outside fragments."""

from __future__ import annotations

import itertools

import streamlit as st

_TIMER = st.components.v2.component("aah_rerun_timer", js="""
export default function ({ data, setTriggerValue }) {
  const t = setTimeout(() => setTriggerValue("due", true), data.ms);
  return () => clearTimeout(t);
}
""")
_IDS = itertools.count()  # each timer is a new element: a rerun that is still busy starts a new wait


def _due() -> None:
    """Nothing to do: the trigger's rerun is the point."""


def rerun_after(seconds: float) -> None:
    """Rerun (this fragment, or the page) `seconds` from now, from the browser."""
    _TIMER(data={"ms": int(seconds * 1000), "id": next(_IDS)}, height=0, on_due_change=_due)
