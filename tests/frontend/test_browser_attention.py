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


_ZOOM = """([title, lo, hi]) => {
  const div = [...document.querySelectorAll('.js-plotly-plot')].find(e => (e.layout.title.text || '').includes(title));
  const before = div.querySelectorAll('.xtick text').length;
  return Plotly.relayout(div, {'xaxis.range': [lo - 0.5, hi + 0.5], 'yaxis.range': [hi + 0.5, lo - 0.5]})
    .then(() => ({before, after: [...div.querySelectorAll('.xtick text')].map(t => t.textContent)}));
}"""
_MARKER = """([title, head]) => {
  const div = [...document.querySelectorAll('.js-plotly-plot')].find(e => (e.layout.title.text || '').includes(title));
  div.scrollIntoView({block: 'center'});
  const fl = div._fullLayout, s = head ? String(head + 1) : '';
  const xa = fl['xaxis' + s], ya = fl['yaxis' + s], tr = div._fullData.find(t => t.name === 'H' + head);
  const r = div.getBoundingClientRect();
  return {x: r.left + xa._offset + xa.l2p(tr.x[27]), y: r.top + ya._offset + ya.l2p(tr.y[27])};
}"""


def test_maps_take_a_colour_scale_zoom_to_token_text_and_open_a_head_by_click(live, model):
    stack, browser = live
    layer = model["n_layer"] - 1
    page = S.open_page(browser, f"{stack.ui_url}/attention?layer={layer}&head=0&scale=log")
    title = f"L{layer}H0 with window"
    drawn = S.wait_for(lambda: S.plot(page, title), what="the windowed map")
    heat = drawn["data"][0]
    assert (heat["zmin"], heat["zmax"]) == (-4, 0) and drawn["xaxis"]["type"] == "category"
    n = len(heat["x"])
    zoom = page.evaluate(_ZOOM, [title, 100, 111])
    assert zoom["before"] < n  # the whole map: labels thinned to fit
    assert [t for t in zoom["after"]] == heat["x"][100:112]  # zoomed in: every token's own label

    if model["n_head"] > 1:
        S.wait_for(lambda: S.plot(page, "every head"), what="the layer's heads as small multiples")
        page.wait_for_timeout(500)
        at = page.evaluate(_MARKER, ["every head", 1])
        page.mouse.click(at["x"], at["y"])
        S.wait_for(lambda: S.plot(page, f"L{layer}H1 with window"), timeout=90, what="head 1 opened by a click")
    page.close()
