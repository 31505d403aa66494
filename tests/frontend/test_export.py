"""Offline HTML export and the PNG/SVG path."""

import re
import threading

import pytest

from frontend import export, figures


def sections():
    grid = figures.window_grid_figure([[4, None]])
    strip = figures.token_delta_figure(["a", "b"], [0.1, -0.1])
    return [export.Section("one", {"grid": grid}, ["loss 2.0"]), export.Section("two <b>", {"strip": strip})]


def test_html_is_self_contained_with_plotly_inlined_once():
    doc = export.html_document("deck", sections(), slides=True)
    assert not re.search(r"<script[^>]+src=", doc, re.I)  # no CDN or any external script
    assert not re.search(r"<link[^>]+href=[\"']https?:", doc, re.I)  # no external stylesheet
    assert doc.count("plotly.js v") <= 2 and len(doc) > 1_000_000  # the library itself is embedded
    assert doc.count("Plotly.newPlot") == 2 and "two &lt;b&gt;" in doc and "loss 2.0" in doc


def test_image_export_reports_why_when_unavailable(monkeypatch):
    monkeypatch.setattr(export, "image_export_status", lambda: (False, "no Chromium here"))
    with pytest.raises(export.ExportUnavailable, match="no Chromium here"):
        export.figure_image(figures.token_delta_figure(["a"], [0.0]), "png")
    with pytest.raises(ValueError):
        export.figure_image(figures.token_delta_figure(["a"], [0.0]), "gif")


def test_an_image_that_never_comes_is_reported_by_the_deadline(monkeypatch):
    """Under load a Kaleido render once waited for good (in its Chromium's start, tab or close, which its own
    90 s limit does not cover) and held the page with it: now the page gets an error by the deadline."""
    monkeypatch.setattr(export, "image_export_status", lambda: (True, ""))
    monkeypatch.setattr(export, "RENDER_DEADLINE_S", 0.2)
    release = threading.Event()
    fig = figures.token_delta_figure(["a"], [0.0])
    monkeypatch.setattr(type(fig), "to_image", lambda self, **kw: release.wait(30) and b"late")
    try:
        with pytest.raises(export.ExportUnavailable, match="gave no image within"):
            export.figure_image(fig, "png")
    finally:
        release.set()
    # a render that fails says why, and one that works returns its bytes
    monkeypatch.setattr(type(fig), "to_image", lambda self, **kw: (_ for _ in ()).throw(OSError("pipe closed")))
    with pytest.raises(export.ExportUnavailable, match="could not render the figure here: pipe closed"):
        export.figure_image(fig, "png")
    monkeypatch.setattr(type(fig), "to_image", lambda self, **kw: b"\x89PNG")
    assert export.figure_image(fig, "png") == b"\x89PNG"


@pytest.mark.slow
def test_png_and_svg_render_with_the_local_chromium():
    ok, reason = export.image_export_status()
    if not ok:
        pytest.skip(reason)
    fig = figures.window_grid_figure([[4, None]])
    assert export.figure_image(fig, "png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in export.figure_image(fig, "svg")[:200]


def test_a_deck_is_one_slide_per_screen_with_arrow_keys():
    figs = {f"g{i}": figures.window_grid_figure([[4, None]]) for i in range(3)}
    doc = export.html_document("deck", [export.Section("three", figs), *sections()], slides=True)
    assert "<html class=deck>" in doc and "section.slide{height:100vh" in doc and "scroll-snap-type:y mandatory" in doc
    # three figures share the screen: 2 columns x 2 rows, each figure sized by its cell (no fixed height)
    assert doc.count("class='figs'") == 3 and "grid-template-columns:repeat(2,1fr);grid-template-rows:repeat(2,1fr)" in doc
    first_slide = doc.split("class='figs'")[1].split("</section>")[0]
    assert first_slide.count('"autosize":true') == 3
    assert "var fwd = ['ArrowRight'" in doc and "slides[next].scrollIntoView()" in doc
    view = export.html_document("view", sections())  # a single view keeps its figures' own heights
    assert "<html class=deck>" not in view and "var fwd = " not in view and "class='figs'" not in view


def test_a_slide_table_is_as_high_as_its_rows(fake_api, monkeypatch):
    """Present's Runs slide: a one-row table is sized to its rows, not drawn at the slide's full height with
    empty grid rows below it; a table longer than the slide keeps the slide's height and scrolls."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    drawn = []
    dataframe = st.dataframe
    monkeypatch.setattr(st, "dataframe", lambda data, **kw: drawn.append((len(data), kw)) or dataframe(data, **kw))
    fake_api.create_view("one run", "runs", {"source": "paper"})
    at = AppTest.from_file("../../frontend/app_pages/present.py", default_timeout=30).run()
    assert not at.exception and [rows for rows, _ in drawn] == [1]
    assert drawn[0][1]["height"] == "content" and drawn[0][1]["row_height"] == export.TABLE_ROW_PX
    slide = export.slide_figure_height(1, 2)
    assert export.slide_table_height(1, slide) == "content"
    assert export.slide_table_height(200, slide) == slide
    fits = (slide - 3) // export.TABLE_ROW_PX - 1  # the most rows whose header, rows and border fit
    assert export.slide_table_height(fits, slide) == "content" and export.slide_table_height(fits + 1, slide) == slide
