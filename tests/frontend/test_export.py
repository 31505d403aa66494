"""Offline HTML export and the PNG/SVG path."""

import re

import pytest

from frontend import export, figures as F


def sections():
    grid = F.window_grid_figure([[4, None]])
    strip = F.token_delta_figure(["a", "b"], [0.1, -0.1])
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
        export.figure_image(F.token_delta_figure(["a"], [0.0]), "png")
    with pytest.raises(ValueError):
        export.figure_image(F.token_delta_figure(["a"], [0.0]), "gif")


@pytest.mark.slow
def test_png_and_svg_render_with_the_local_chromium():
    ok, reason = export.image_export_status()
    if not ok:
        pytest.skip(reason)
    fig = F.window_grid_figure([[4, None]])
    assert export.figure_image(fig, "png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in export.figure_image(fig, "svg")[:200]
