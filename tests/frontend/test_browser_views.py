"""Views keep everything they show (issue 23), in a real Chromium against the real API and dashboard: a
saved ACR view with a group band is drawn on Present and in the exported deck with the band and the
page's own colours (not Streamlit's placeholder colourway)."""

import math

import httpx
import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
GROUP = "band-test"


def _seeded_group(api: str) -> int:
    """Two tracked seeds of one setting (a group), each with a val_loss series; returns the first run."""
    ids = []
    for seed in (0, 1):
        made = httpx.post(f"{api}/tracking/runs", json={
            "run_key": f"band-test-seed-{seed}", "name": f"band seed {seed}", "experiment": "band test",
            "group": GROUP, "seed": seed, "config": {}, "total_steps": 40}, timeout=30).json()
        rid, secret = made["run"]["id"], {"X-AAH-Run-Secret": made["write_secret"]}
        steps = list(range(0, 41, 10))
        values = [3.0 - 0.2 * k + 0.05 * seed + 0.01 * math.sin(k) for k in range(len(steps))]
        httpx.post(f"{api}/tracking/runs/{rid}/log", headers=secret, json={"series": {"val_loss": {
            "step": steps, "value": values, "time": [1.7e9 + s for s in steps]}}}, timeout=30).raise_for_status()
        httpx.post(f"{api}/tracking/runs/{rid}/status", headers=secret, json={"status": "FINISHED"},
                   timeout=30).raise_for_status()
        ids.append(rid)
    return ids[0]


def _colours(drawn: dict) -> list:
    return [(t["color"], t["fill"]) for t in drawn["data"]]


def test_a_saved_view_with_a_band_survives_into_present_and_the_deck(live, tmp_path):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    rid = _seeded_group(api)
    view = httpx.post(f"{api}/views", json={"name": "with a band", "page": "acr", "state": {
        "run": str(rid), "keys": "val_loss", "band": "std", "smooth": "0"}}, timeout=30).json()

    page = S.open_page(browser, f"{stack.ui_url}/acr?run={rid}&keys=val_loss&band=std&smooth=0")
    on_page = S.wait_for(lambda: S.plot(page, f"group {GROUP}"), timeout=120, what="the band on the ACR page")
    page.close()

    page = S.open_page(browser, f"{stack.ui_url}/present?deck={view['id']}")
    slide = S.wait_for(lambda: S.plot(page, f"group {GROUP}"), timeout=120, what="the band on the slide")
    assert _colours(slide) == _colours(on_page) and any(fill for _, fill in _colours(slide))
    assert all(not str(c).startswith("#00000") for c, _ in _colours(slide) if c)
    assert [t["y"] for t in slide["data"]] == [t["y"] for t in on_page["data"]]

    path = S.download_deck(page, tmp_path / "deck.html")
    page.close()
    assert "#000001" not in path.read_text()

    offline = browser.new_context(offline=True, viewport={"width": 1440, "height": 1100})
    deck = offline.new_page()
    deck.goto(path.as_uri(), timeout=120_000)
    in_deck = S.wait_for(lambda: S.plot(deck, f"group {GROUP}"), timeout=120, what="the band in the deck")
    assert _colours(in_deck) == _colours(on_page)
    offline.close()
