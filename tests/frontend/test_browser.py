"""End to end in a real browser: the real API and the real dashboard on free loopback ports with a
temporary data dir, driven by Debian's Chromium through Playwright. Screenshots go to test-artifacts/
(the editor and heatmap ones are copied to docs/ for the README)."""

import re
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = S.ARTIFACTS


def test_edit_a_head_and_share_the_view(live, model):
    stack, browser = live
    own = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
    page = S.open_page(browser, f"{stack.ui_url}/")  # the editor is the default page
    before = S.editor_ready(page)
    choices = [str(b) for b in model["buckets"] if b is not None]
    target = choices[0] if str(own[0][0]) != choices[0] else choices[1]
    pills = page.get_by_role("radiogroup", name="Window of layer 0, head 0")
    pills.get_by_role("radio", name=target, exact=True).click()
    after = S.wait_for(lambda: (v := S.metric_value(page, "loss (nats)")) and v != before and v,
                       what="the loss to change after the edit")
    assert float(after) != float(before)
    delta = S.metric_value(page, "Δloss vs own plan")
    assert delta and float(delta) != 0.0
    S.wait_for(lambda: "plan=" in S.href(page), what="the plan in the URL")
    S.settled(page)  # the picture shows the page drawn to the end, not a fixed wait after the URL
    page.screenshot(path=str(ARTIFACTS / "editor.png"), full_page=True)
    S.copy_artifact(ARTIFACTS / "editor.png", S.ROOT / "docs" / "editor.png")

    link = S.href(page)
    plan = parse_qs(urlparse(link).query)["plan"][0]
    assert plan.split("_")[0].split(".")[0] == target
    shared = S.open_page(browser, link)  # a fresh session opened from the link
    same = S.wait_for(lambda: S.metric_value(shared, "loss (nats)"), what="the loss on the shared link")
    assert same == after
    assert "plan=" + plan in S.href(shared)
    shared.close()

    # clicking a cell of the window map picks that head for the pills (in the browser: no rerun needed)
    last = (model["n_layer"] - 1, model["n_head"] - 1)
    page.get_by_role("button", name=f"layer {last[0]}, head {last[1]}", exact=True).click()
    page.get_by_role("radiogroup", name=f"Window of layer {last[0]}, head {last[1]}").wait_for(timeout=5_000)
    page.close()


def test_heatmap_link_and_offline_export(live, model, tmp_path):
    stack, browser = live
    layer, head = model["n_layer"] - 1, model["n_head"] - 1
    windows = [b for b in model["buckets"] if b is not None]
    window = windows[len(windows) // 2]  # a middle bucket, so the band, the cut mass and the difference show
    page = S.open_page(browser, f"{stack.ui_url}/attention?model={model['id']}&layer={layer}&head={head}&window={window}")
    title = f"L{layer}H{head} full causal attention"
    S.wait_for(lambda: title in " ".join(page.locator(".gtitle").all_text_contents()), what="the heatmap")
    S.wait_for(lambda: page.locator(".js-plotly-plot").count() >= 5, what="all attention figures")
    S.settled(page)
    page.screenshot(path=str(ARTIFACTS / "attention.png"), full_page=True)
    S.copy_artifact(ARTIFACTS / "attention.png", S.ROOT / "docs" / "attention.png")
    query = parse_qs(urlparse(S.href(page)).query)
    assert query["layer"] == [str(layer)] and query["head"] == [str(head)] and query["window"] == [str(window)]
    assert f"L{layer}H{head} with window {window}" in page.locator(".gtitle").all_text_contents()

    button = page.get_by_role("button", name=re.compile("Download HTML"))
    prepare = page.get_by_role("button", name="Prepare offline HTML")
    S.prepare_download(page, "Share · save · export", prepare, button, build_s=60)
    with page.expect_download() as info:
        button.click()
    html_path = tmp_path / "attention.html"
    info.value.save_as(html_path)
    (ARTIFACTS / "attention-export.html").write_bytes(html_path.read_bytes())
    doc = html_path.read_text()
    assert not re.search(r"<script[^>]+src=", doc, re.I)

    offline = browser.new_context(offline=True)
    requests = []
    offline.on("request", lambda r: requests.append(r.url))
    view = offline.new_page()
    # hang detectors: "load" waits for the inlined plotly.js and each figure's script (the maps' data is
    # megabytes), which passed Playwright's 30 s default on a loaded machine (test_browser_present)
    view.goto(html_path.as_uri(), timeout=120_000)
    view.wait_for_selector(".js-plotly-plot .main-svg", timeout=120_000)
    assert view.evaluate("typeof Plotly") == "object"
    assert view.locator(".js-plotly-plot").count() >= 4
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []
    view.screenshot(path=str(ARTIFACTS / "attention-export.png"))
    offline.close()
    page.close()


def test_runs_table_lists_the_paper_reference(live):
    stack, browser = live
    page = S.open_page(browser, f"{stack.ui_url}/runs?experiment=paper%20(reported)")
    S.wait_for(lambda: page.locator('[data-testid="stDataFrame"]').count() >= 1, what="the runs table")
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()
