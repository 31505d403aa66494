"""User text (run names, descriptions, notes, tags, view titles, metric keys, model names, server
messages that quote them) is shown as text, never rendered.

Streamlit renders Markdown in `st.markdown`, captions, headers, alerts, toasts, spinners, progress
texts and widget labels; a description holding `![x](http://host/pixel)` would make every viewer's
browser fetch that URL. `md` escapes every ASCII punctuation character with a backslash (CommonMark
allows exactly these), so Markdown shows the characters themselves: no image, link, emphasis,
heading, list, table, HTML tag, math or directive can come out of user text. Plotly renders a few
HTML tags in trace names, titles and hover texts (`<b>`, `<a href>`): `svg` escapes them there.
`unsafe_allow_html` is never used with user data (only with the app's own CSS).
"""

from __future__ import annotations

import html
import re

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # ASCII punctuation: ! to /, : to @, [ to `, { to ~


def md(text: object) -> str:
    """``text`` for a Streamlit element that renders Markdown: shown character for character."""
    return _PUNCTUATION.sub(r"\\\1", str(text))


def svg(text: object) -> str:
    """``text`` for a Plotly name, title or hover text: its tags shown, not applied."""
    return html.escape(str(text), quote=False)
