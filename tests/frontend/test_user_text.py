"""User text is shown as text, never rendered (issue 21 item 7): a run's name, description and tags on
the Runs page and a saved view's name on Present hold Markdown that would fetch an image; every element
Streamlit renders as Markdown must carry them as literal text (parsed here by CommonMark: no image,
link or tag comes out), and the figures and the exported deck escape them too."""

from __future__ import annotations

import html

import markdown_it
import pytest

from frontend import export, figures, user_text
from tests.frontend.stack import free_port
from tests.frontend.test_pages import page

PORT = free_port()
PIXEL = f"![x](http://127.0.0.1:{PORT}/pixel)"
NAME = f"[run](http://127.0.0.1:{PORT}/link) **bold** <img src=http://127.0.0.1:{PORT}/tag>"
MARKUP = ("image", "link_open", "html_inline", "html_block", "strong_open", "em_open")


def rendered(source: str) -> tuple[list[str], str]:
    """(markup token types, text) of `source` as CommonMark renders it."""
    kinds, text = [], []
    for block in markdown_it.MarkdownIt("commonmark").parse(source):
        kinds.append(block.type)
        for tok in block.children or []:
            kinds.append(tok.type)
            text.append(tok.content if tok.type in ("text", "code_inline") else "")
    return [k for k in kinds if k in MARKUP], "".join(text)


def markdown_sources(at) -> list[str]:
    """Every string the page hands Streamlit to render as Markdown (bodies, captions, headers, alerts,
    expander labels)."""
    out = [el.value for kind in ("markdown", "caption", "header", "subheader", "title", "info", "success",
                                 "warning", "error") for el in getattr(at, kind)]
    return out + [e.label for e in at.expander]


# ids that do not hold PORT: pytest-xdist's workers must collect the same test names
@pytest.mark.parametrize("text", [PIXEL, NAME, "$x^2$ :red[red] # heading\n- item | a | b |", "\\*a\\*"],
                         ids=["image", "link-bold-html", "math-colour-heading-list-table", "escaped"])
def test_md_shows_any_text_character_for_character(text):
    kinds, shown = rendered(user_text.md(text))
    assert kinds == [] and shown.replace("\n", "") == text.replace("\n", "")


def test_a_markdown_image_in_a_description_is_shown_as_text_on_the_runs_page(fake_api):
    run = fake_api.runs_store[0]
    run.update(name=NAME, description=PIXEL, tags=["*t*"])
    at = page("runs")
    at.multiselect(key="runs._chosen").set_value([run["id"]]).run()
    assert not at.exception
    sources = [s for s in markdown_sources(at) if str(PORT) in s]
    assert sources, "the run's identity (name, description) should be on the page"
    for source in sources:  # the page's own bold field names aside, nothing is markup
        assert {"image", "link_open", "html_inline", "html_block", "em_open"}.isdisjoint(rendered(source)[0])
    shown = "".join(rendered(s)[1] for s in sources)
    assert PIXEL in shown and NAME in shown and "*t*" in shown  # literally, "**bold**" and "*t*" included


def test_a_view_title_is_shown_as_text_on_present_and_in_the_exported_deck(fake_api):
    fake_api.create_view(PIXEL, "editor", {})
    at = page("present")
    assert not at.exception
    (header,) = [h.value for h in at.header if str(PORT) in h.value]
    assert rendered(header) == ([], PIXEL)
    deck = export.html_document("deck", [export.Section(PIXEL, lines=[NAME])], slides=True)
    assert f"<h2>{html.escape(PIXEL)}</h2>" in deck and "<img" not in deck.replace(html.escape("<img"), "")


def test_figures_show_run_names_and_keys_as_text():
    fig = figures.metric_curves_figure({NAME: ([0, 1], [1.0, "nan"])}, 0.0, title=NAME, nonfinite={NAME: [(1, "nan")]})
    names = [t.name for t in fig.data]
    assert all("<img" not in n and "&lt;img" in n for n in names) and "<img" not in fig.layout.title.text
