"""The dashboard never misleads, checked in a real browser (issue 13): Chromium through Playwright against
the real API and dashboard (the session's stack from conftest.py). Each test reads what Plotly actually
drew (the graph div's data and axis ranges) or what the page says, and compares it with the API."""

import re
from urllib.parse import urlparse

import httpx
import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PAGES = ["", "attention", "runs", "acr", "compare?paper=1", "present", "present?mode=present"]
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def _no_error_on_screen(page, where: str) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, where
    errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
    assert errors == [], f"{where}: {errors}"


def test_every_page_loads_with_no_request_outside_loopback(live, model):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    if not httpx.get(f"{api}/views", timeout=30).json():
        httpx.post(f"{api}/views", json={"name": "tour", "page": "attention", "state": {"layer": "0"}}, timeout=30)
    context = browser.new_context()
    outside: list[str] = []

    # observed, not intercepted: a route turns the browser's cache off and sends every request through
    # this process (a quarter of this test's time); an outside request fails the test either way
    def seen(request):
        host = urlparse(request.url).hostname or ""
        if not (request.url.startswith(("data:", "blob:")) or host in LOOPBACK or host == "::1"):
            outside.append(request.url)

    context.on("request", seen)
    for path in PAGES:
        page = S.open_page(browser, f"{stack.ui_url}/{path}", context)
        ready = '[data-testid="stDataFrame"]' if path == "runs" else ".js-plotly-plot .main-svg"
        S.wait_for(lambda page=page, ready=ready: page.locator(ready).count() >= 1, what=f"the content of /{path}")
        S.settled(page)  # the script ran to its end: an error it writes late is on screen by now
        _no_error_on_screen(page, f"/{path}")
        name = re.sub(r"[^a-z]+", "-", path).strip("-") or "editor"
        page.screenshot(path=str(S.ARTIFACTS / f"tour-{name}.png"), full_page=True)
        page.close()
    context.close()
    assert outside == [], f"requests outside loopback: {outside}"


def test_eval_series_are_drawn_raw_and_end_at_the_stored_value(live, model):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    run_id = model["run_id"]
    series = httpx.get(f"{api}/runs/{run_id}/metrics", timeout=30).json()["series"]
    stored = series["val_loss"]
    assert len(stored["step"]) >= 2, "the demo run should have several evaluations"
    # the default smoothing (0.6) is on: it must not touch the sparse eval series
    page = S.open_page(browser, f"{stack.ui_url}/acr?run={run_id}&keys=val_loss,train_loss")
    drawn = S.wait_for(lambda: S.plot(page, "metrics by step"), what="the metrics chart")
    by_name = {t["name"]: t for t in drawn["data"]}
    val = by_name["val_loss"]
    assert val["x"] == stored["step"] and val["y"] == pytest.approx(stored["value"])
    assert val["y"][-1] == pytest.approx(stored["value"][-1])
    assert not any(name.startswith("val_loss (EMA") for name in by_name)
    # a dense series keeps its raw line and gets the smoothed one beside it, named as such
    train = series["train_loss"]
    assert by_name["train_loss"]["y"][-1] == pytest.approx(train["value"][-1])
    if len(train["step"]) >= 50:
        assert "train_loss (EMA 0.6)" in by_name
    page.close()


def test_retained_mass_axis_stays_within_the_models_context(live, model):
    stack, browser = live
    layer, head = model["n_layer"] - 1, 0
    page = S.open_page(browser, f"{stack.ui_url}/attention?layer={layer}&head={head}")
    drawn = S.wait_for(lambda: S.plot(page, "mass within w keys"), timeout=150, what="the retained-mass chart")
    assert drawn["xaxis"]["type"] == "log"
    lo, hi = (10 ** v for v in drawn["xaxis"]["range"])
    assert 1 - 1e-6 <= lo and hi <= model["seq_len"] * (1 + 1e-6)
    xs = [x for t in drawn["data"] for x in (t["x"] or [])]
    assert xs and all(1 <= x <= model["seq_len"] for x in xs)
    lo, hi = drawn["yaxis"]["range"]
    assert 0 <= lo and hi <= 1.05
    page.close()


def test_bulk_edit_and_preset_enable_undo_at_once(live, model):
    stack, browser = live
    n_head = model["n_head"]
    page = S.open_page(browser, f"{stack.ui_url}/")
    S.editor_ready(page)
    undo = page.get_by_role("button", name="↶ Undo")
    assert undo.is_disabled()
    S.expand(page, "Bulk edits and presets", page.get_by_role("button", name="Set layer"))
    caption = page.get_by_text(re.compile(r"head\(s\) differ from the model's own plan"))

    def click_once(button, after: str, what: str) -> None:
        # one click on a settled page; the caption is drawn in the same run as the loss, so it must
        # follow the click without a second one
        S.settled(page)
        button.click()
        S.wait_for(lambda: after in caption.inner_text(), timeout=90, what=what)

    click_once(page.get_by_role("button", name="Set layer"), "step 1 of 1",  # layer 0 to the smallest window
               "the history caption after Set layer")
    differ = int(caption.inner_text().split(" head(s)")[0])
    assert 0 < differ <= n_head and undo.is_enabled()
    # a preset changes the plan again and is one more step
    page.get_by_role("combobox", name="Preset").click()
    page.get_by_role("option", name="all full", exact=True).click()
    click_once(page.get_by_role("button", name="Apply preset"), "step 2 of 2", "the history caption after a preset")
    assert undo.is_enabled()

    click_once(undo, "step 1 of 2", "the caption after Undo")
    assert page.get_by_role("button", name="↷ Redo").is_enabled()
    page.close()


def test_a_bad_link_keeps_what_is_valid_and_says_what_was_ignored(live, model):
    stack, browser = live
    warning = '[data-testid="stAlertContentWarning"]'

    def ignored(page) -> str:
        return " ".join(t for t in page.locator(warning).all_inner_texts() if "Ignored from the link" in t)

    page = S.open_page(browser, f"{stack.ui_url}/attention?layer=abc&head=1&window=16")
    S.wait_for(lambda: "L0H1 with window 16" in " ".join(page.locator(".gtitle").all_text_contents()),
               what="the heatmap of the link's valid head and window")
    assert "layer=abc (not an integer)" in ignored(page)
    page.goto(f"{stack.ui_url}/acr?run=99999")
    S.wait_for(lambda: "run=99999 (no such run" in ignored(page), what="the ignored run")
    page.goto(f"{stack.ui_url}/?plan=0.x")
    S.wait_for(lambda: "not a plan for this model" in ignored(page), what="the ignored plan")
    S.wait_for(lambda: S.metric_value(page, "loss (nats)"), what="the own plan's loss")
    _no_error_on_screen(page, "a bad plan link")
    page.close()
