"""Present in a real browser (issue 13): arrow keys move between slides, and the exported deck shows
one slide per screen (opened offline). Chromium through Playwright against the real API and dashboard
(the session's stack from conftest.py)."""

import httpx
import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _caption(page) -> str:
    return " ".join(t for t in page.locator('[data-testid="stCaptionContainer"]').all_inner_texts() if "slide " in t)


def test_arrow_keys_move_between_slides_and_the_deck_is_one_slide_per_screen(live, tmp_path):
    """The deck is the test's own views (?deck=), whatever other tests saved: two Runs views of the demo's
    imported run (a one-row table: the slides stepped through draw quickly on a loaded machine), then an
    Attention view with all its charts (6: the maps, the layer's heads, the retained mass), exported only."""
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    views = [("arrow one", "runs", {"source": "imported"}), ("arrow two", "runs", {"source": "imported"}),
             ("every chart", "attention", {"layer": "1"})]
    ids = [httpx.post(f"{api}/views", json={"name": name, "page": p, "state": state}, timeout=30).json()["id"]
           for name, p, state in views]
    n = len(ids)
    page = S.open_page(browser, f"{stack.ui_url}/present?deck={','.join(map(str, ids))}")
    S.wait_for(lambda: f"slide 1 of {n}" in _caption(page), what="the first slide")
    page.locator('kbd[aria-label="Shortcut →"]').wait_for()  # the shortcut is registered

    S.settled(page)
    page.keyboard.press("ArrowRight")  # once: the assertion waits for its effect
    S.wait_for(lambda: f"slide 2 of {n}" in _caption(page), timeout=90, what="the next slide after →")
    S.settled(page)
    page.keyboard.press("ArrowLeft")
    S.wait_for(lambda: f"slide 1 of {n}" in _caption(page), timeout=90, what="the first slide again after ←")

    path = S.download_deck(page, tmp_path / "deck.html")
    page.close()

    offline = browser.new_context(offline=True, viewport={"width": 1280, "height": 800})
    view = offline.new_page()
    # hang detectors, not speed limits: "load" waits for the inlined plotly.js (4.8 MB) and every figure's
    # script to run, which took over 30 s on a loaded machine for a 10 MB deck
    view.goto(path.as_uri(), timeout=120_000)
    view.wait_for_selector("section.slide .js-plotly-plot .main-svg", timeout=120_000)
    heights = view.evaluate("[...document.querySelectorAll('section.slide')].map(s => s.getBoundingClientRect().height)")
    assert len(heights) == n and all(h == pytest.approx(800, abs=1) for h in heights)
    assert view.locator("section.slide#s3 .js-plotly-plot").count() == 6
    fits = view.evaluate("""[...document.querySelectorAll('section.slide')].every(s =>
        [...s.querySelectorAll('.js-plotly-plot')].every(p => p.getBoundingClientRect().bottom
                                                          <= s.getBoundingClientRect().bottom + 1))""")
    assert fits  # every figure of a slide is on its screen
    view.keyboard.press("ArrowRight")
    S.wait_for(lambda: view.evaluate("window.scrollY") == pytest.approx(800, abs=2), what="one screen down")
    offline.close()
