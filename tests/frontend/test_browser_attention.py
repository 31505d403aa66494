"""The Attention page in a real browser (issue 13): a long pasted text says what of it is shown and the
span can be moved. Chromium through Playwright against the real API and dashboard (the session's
stack from conftest.py)."""

import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WARNING = '[data-testid="stAlertContentWarning"]'


def _note(page) -> str:
    return " ".join(t for t in page.locator(WARNING).all_inner_texts() if "Showing tokens" in t)


def test_a_long_pasted_text_says_what_is_shown_and_the_span_moves(live, model):
    stack, browser = live
    sentence = "The quick brown fox jumps over the lazy dog. "
    text = (sentence * (100_000 // len(sentence) + 1))[:100_000]
    page = S.open_page(browser, f"{stack.ui_url}/attention?text=own")
    area = page.get_by_role("textbox", name="Your text")
    area.fill(text)
    area.press("Control+Enter")
    note = S.wait_for(lambda: _note(page), timeout=120, what="the note on what of the text is shown")
    seq = model["seq_len"]
    assert f"Showing tokens 1–{seq:,} of " in note and "0 token(s) before" in note
    total = int(note.split(" of ")[1].split(":")[0].replace(",", ""))
    assert total > seq and f"{total - seq:,} after" in note
    heat = S.wait_for(lambda: S.plot(page, "full causal attention"), what="the heatmap")
    assert 0 < len(heat["data"][0]["z"]) <= seq

    # the slider moves the span: End puts it at the end of the text
    page.get_by_role("slider", name="Tokens skipped before the span").press("End")
    S.wait_for(lambda: f"Showing tokens {total - seq + 1:,}–{total:,} of {total:,}" in _note(page), timeout=120,
               what="the span at the end of the text")
    assert f"{total - seq:,} token(s) before and 0 after" in _note(page)
    page.close()
