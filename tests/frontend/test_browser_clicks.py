"""Every click counts, on the head the user sees (issue 23), in a real Chromium against the real API and
dashboard (the session's stack from conftest.py). Each click is made once, at a fixed pace, and the
test then waits (one assertion with a timeout) for the server's history and plan: no click is repeated."""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from frontend import plans
from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CAPTION = r"head\(s\) differ from the model's own plan · step {n} of {n}$"


def _open_editor(browser, stack, model: dict):
    page = S.open_page(browser, f"{stack.ui_url}/?model={model['id']}")
    page.get_by_role("radiogroup", name="Window of layer 0, head 0").wait_for()
    S.editor_ready(page)
    return page


def _steps(page, n: int, timeout_s: float = 120) -> None:
    """The history caption (drawn by the script) says step n of n: the server applied n edits."""
    import re
    expect(page.get_by_text(re.compile(CAPTION.format(n=n)))).to_be_visible(timeout=timeout_s * 1000)


def _url_plan(page, own: list) -> list:
    query = parse_qs(urlparse(S.href(page)).query)
    return plans.decode_plan(query["plan"][0]) if "plan" in query else own


def _assert_url_plan(page, own: list, wanted: list) -> None:
    """The address bar comes to hold `wanted` (the script writes it after drawing the caption, so it may
    arrive a moment later); a different plan there at the timeout fails with both shown."""
    try:
        S.wait_for(lambda: _url_plan(page, own) == wanted, timeout=30, what="the plan in the URL")
    except TimeoutError:
        assert _url_plan(page, own) == wanted


def _labels(model: dict) -> list[str]:
    return [plans.window_label(w) for w in model["buckets"]]


def test_forty_quick_pill_clicks_each_count_once(live, model):
    stack, browser = live
    own = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
    page = _open_editor(browser, stack, model)
    a, b = [lab for lab in _labels(model) if lab != plans.window_label(own[0][0])][:2]
    pills = page.get_by_role("radiogroup", name="Window of layer 0, head 0")
    grid = page.locator(".he .grid").first  # the map's grid element (its cells are redrawn inside it)
    tops = [grid.bounding_box()["y"]]
    start = time.monotonic()
    for i in range(40):  # alternate two windows, so every click changes the plan: 40 steps
        time.sleep(max(0.0, start + 0.35 * i - time.monotonic()))
        pills.get_by_role("radio", name=a if i % 2 == 0 else b, exact=True).click()
        tops.append(grid.bounding_box()["y"])  # while reruns come and go, and the Δ chip appears
    _steps(page, 40)
    tops.append(grid.bounding_box()["y"])
    wanted = [list(row) for row in own]
    wanted[0][0] = plans.parse_window(b)
    _assert_url_plan(page, own, wanted)
    assert max(tops) - min(tops) < 1, f"the window map moved: {sorted(set(tops))}"
    page.close()


def test_a_bad_head_in_the_link_stays_reported_while_the_user_edits(live, model):
    """Issue 23: the warning for a link's bad layer disappeared within seconds (a fragment's rerun
    cleared it); it stays through an edit and the page's later reruns."""
    stack, browser = live
    own = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
    page = S.open_page(browser, f"{stack.ui_url}/?model={model['id']}&layer=99&head=1")
    S.editor_ready(page)
    warning = page.locator('[data-testid="stAlertContentWarning"]').filter(has_text="layer=99 (this model has layers")
    expect(warning).to_be_visible()
    other = next(lab for lab in _labels(model) if lab != plans.window_label(own[0][1]))
    page.get_by_role("radiogroup", name="Window of layer 0, head 1").get_by_role("radio", name=other, exact=True).click()
    _steps(page, 1)
    S.settled(page)
    expect(warning).to_be_visible()
    page.close()


_ACKED = """([n]) => [...(globalThis.__aahHeadEditor || new Map()).values()].some(s => s.data && s.data.ack >= n)"""


def test_a_click_pressed_before_a_redraw_and_released_after_it_lands(live, model):
    """A click whose press comes before a redraw of the map (the script's answer to an edit) and whose
    release comes after it picks the head pressed: the press is made, the redraw waited for, then the
    release."""
    stack, browser = live
    own = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
    page = _open_editor(browser, stack, model)
    other = next(lab for lab in _labels(model) if lab != plans.window_label(own[0][0]))
    page.get_by_role("radiogroup", name="Window of layer 0, head 0").get_by_role("radio", name=other, exact=True).click()
    box = page.get_by_role("button", name="layer 1, head 1", exact=True).bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.wait_for_function(_ACKED, arg=[1])  # the script applied the edit and the map was drawn with it
    page.mouse.up()
    expect(page.get_by_role("radiogroup", name="Window of layer 1, head 1")).to_be_visible(timeout=5000)
    page.close()


_MAP_STATE = """() => [...(globalThis.__aahHeadEditor || new Map()).values()].map(s => ({sel: s.sel, seq: s.seq,
  sent: s.sent, log: s.log, ack: s.data && s.data.ack, data_sel: s.data && s.data.sel}))"""


def _map_then_pill_edits(page, model: dict, own: list, pace_s: float = 0.7) -> list:
    """12 edits of 12 different heads: click the head on the map, then a window pill, one edit every
    `pace_s`. Returns the plan asked for."""
    labels = _labels(model)
    heads = [(l, h) for l in range(model["n_layer"]) for h in range(model["n_head"])]
    random.Random(23).shuffle(heads)
    wanted = [list(row) for row in own]
    start = time.monotonic()
    for i, (l, h) in enumerate(heads[:12]):
        time.sleep(max(0.0, start + pace_s * i - time.monotonic()))
        target = next(lab for lab in labels[i % len(labels):] + labels if lab != plans.window_label(own[l][h]))
        page.get_by_role("button", name=f"layer {l}, head {h}", exact=True).click()
        try:
            page.get_by_role("radiogroup", name=f"Window of layer {l}, head {h}").get_by_role(
                "radio", name=target, exact=True).click(timeout=30_000)
        except PlaywrightTimeout:  # say what the map held: its selection, what it sent, what the script acked
            raise AssertionError(f"edit {i}: no pills for layer {l}, head {h}; map state "
                                 f"{page.evaluate(_MAP_STATE)}") from None
        wanted[l][h] = plans.parse_window(target)
    return wanted


def test_twelve_map_then_pill_edits_land_on_the_heads_asked_for(live, model):
    stack, browser = live
    own = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
    page = _open_editor(browser, stack, model)
    wanted = _map_then_pill_edits(page, model, own)
    _steps(page, 12)
    _assert_url_plan(page, own, wanted)
    page.close()


@contextlib.contextmanager
def _busy_api(api: str, model: dict):
    """Keep the API's heavy queue full (distinct evaluations from 24 threads) so that requests beyond
    it are answered 429; yields a list that collects the status codes the flood itself received."""
    codes: list[int] = []
    stop = threading.Event()
    counter = itertools.count()

    def flood() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                k = next(counter)
                plan = [[4 + (k + l * 7 + h) % 120 for h in range(model["n_head"])] for l in range(model["n_layer"])]
                codes.append(client.post(f"{api}/models/{model['id']}/evaluate", json={"windows": plan}).status_code)
    threads = [threading.Thread(target=flood, daemon=True) for _ in range(24)]
    for t in threads:
        t.start()
    try:
        yield codes
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)


def test_twelve_edits_while_a_job_trains_and_the_api_answers_429(live, model):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    own = httpx.get(f"{api}/models/{model['id']}/windows", timeout=30).json()["windows"]
    run = httpx.post(f"{api}/runs", json={"preset": "tiny", "name": "clicks-while-training",
                                          "overrides": {"train.max_steps": 400}}, timeout=60).json()
    try:
        page = _open_editor(browser, stack, model)
        wanted = _map_then_pill_edits(page, model, own)
        _steps(page, 12)
        _assert_url_plan(page, own, wanted)
        assert httpx.get(f"{api}/runs/{run['id']}", timeout=30).json()["status"] in ("SCHEDULED", "RUNNING", "FINISHED")
        page.close()

        page = _open_editor(browser, stack, model)
        with _busy_api(api, model) as codes:
            time.sleep(1.0)  # let the flood fill the queue first
            wanted = _map_then_pill_edits(page, model, own)
            _steps(page, 12)
            _assert_url_plan(page, own, wanted)
        assert 429 in codes, "the API never answered 429: the test did not test a busy API"
        page.close()
    finally:
        httpx.post(f"{api}/runs/{run['id']}/cancel", timeout=60)
