"""Charts that zoom like a tracker's (issue 23), in a real Chromium against the real API and dashboard:
a range dragged on the ACR page's metrics chart re-asks the server for that range, and the chart then
draws the server's full-resolution points of the range (more than the downsampled overview had)."""

import math

import httpx
import pytest

from frontend import views, zoom_chart
from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _in(xs, lo, hi):
    return [x for x in xs if lo <= x <= hi]


POINTS = 3 * views.CURVE_POINTS  # a long run: its overview is downsampled


def _long_run(api: str) -> int:
    """A tracked run with POINTS train_loss points (a wiggly curve, so the buckets' min and max differ)."""
    made = httpx.post(f"{api}/tracking/runs", json={"run_key": "zoom-test-run", "name": "zoom test",
                                                    "config": {}, "total_steps": POINTS}, timeout=30).json()
    rid, secret = made["run"]["id"], {"X-AAH-Run-Secret": made["write_secret"]}
    steps = list(range(1, POINTS + 1))
    values = [2.0 + math.sin(s / 7.0) / (1 + s / 1000) for s in steps]
    httpx.post(f"{api}/tracking/runs/{rid}/log", headers=secret, json={"series": {"train_loss": {
        "step": steps, "value": values, "time": [1.7e9 + s for s in steps]}}}, timeout=60).raise_for_status()
    httpx.post(f"{api}/tracking/runs/{rid}/status", headers=secret, json={"status": "FINISHED"},
               timeout=30).raise_for_status()
    return rid


def test_a_dragged_range_re_asks_the_server_and_draws_the_finer_points(live):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    run_id = _long_run(api)
    overview = httpx.get(f"{api}/runs/{run_id}/metrics", params={"keys": "train_loss", "max_points": views.CURVE_POINTS},
                         timeout=30).json()
    page = S.open_page(browser, f"{stack.ui_url}/acr?run={run_id}&keys=train_loss&smooth=0")
    before = S.wait_for(lambda: S.plot(page, "metrics by step"), what="the metrics chart")
    xs = next(t for t in before["data"] if t["name"] == "train_loss")["x"]
    S.settled(page)
    # no wait for the zoom listener to find the chart (it polls every 300 ms): a drag before that is reported
    # when it does (the test below), so the page must re-ask whenever the drag comes
    # what the listener reads from a chart it finds already zoomed (the test below): Plotly's layout after a drag,
    # kept as the drag ends (the listener may find the chart then, report the range and the page redraw it)
    page.evaluate("""() => { const div = document.querySelector('.st-key-acr-_metrics .js-plotly-plot');
        div.on('plotly_relayout', () => { const x = div.layout.xaxis;
            window.aahDragged = {autorange: x.autorange, range: x.range ? x.range.slice() : null}; }); }""")
    box = page.locator(".st-key-acr-_metrics .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.40, y)  # one drag: 40 % to 43 % of the x axis
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.43, y, steps=8)
    page.mouse.up()
    dragged = page.evaluate("() => window.aahDragged || null")
    assert dragged is not None and dragged["autorange"] is False and len(dragged["range"]) == 2, dragged
    page.get_by_text("Zoomed to steps").wait_for(timeout=90_000)
    after = S.wait_for(lambda: (p := S.plot(page, "metrics by step")) and
                       next(t for t in p["data"] if t["name"] == "train_loss")["x"] != xs and p,
                       timeout=90, what="the chart redrawn for the range")
    lo, hi = after["xaxis"]["range"]
    first, last = max(0, math.floor(lo)), math.ceil(hi)
    asked = httpx.get(f"{api}/runs/{run_id}/metrics", params={
        "keys": "train_loss", "min_step": first, "max_step": last, "max_points": views.CURVE_POINTS},
        timeout=30).json()["series"]["train_loss"]
    drawn = next(t for t in after["data"] if t["name"] == "train_loss")
    assert drawn["x"] == asked["step"] and drawn["y"] == pytest.approx(asked["value"])
    assert len(_in(drawn["x"], first, last)) > len(_in(xs, first, last)), "the zoom drew no finer points"
    assert "train_loss" in overview.get("downsampled", [])  # the overview is a downsampled one
    page.close()


LISTENER_ON_A_STAND_IN = """async ([code, layout]) => {
    // zoom_chart's listener, run on a stand-in for the chart st.plotly_chart draws: a div of the chart's key
    // whose `on` records the handlers Plotly would call, holding `layout`
    document.body.innerHTML = "<div class='st-key-acr-_metrics'><div class='js-plotly-plot'></div></div>";
    const div = document.querySelector('.js-plotly-plot');
    const handlers = [];
    div.on = (name, fn) => handlers.push([name, fn]);
    div.layout = layout;
    const sent = [];
    const url = URL.createObjectURL(new Blob([code], {type: 'text/javascript'}));
    const stop = (await import(url)).default({data: {chart: 'acr._metrics'}, setStateValue: (k, v) => sent.push([k, v])});
    const atAttach = sent.length;
    for (const [name, fn] of handlers) if (name === 'plotly_relayout') fn({'xaxis.range[0]': 200, 'xaxis.range[1]': 300});
    stop();
    return {sent, atAttach, bound: handlers.map(h => h[0])};
}"""


@pytest.mark.parametrize(("layout", "at_attach"), [
    ({"xaxis": {"autorange": False, "range": [120.5, 480.25]}}, [["range", [120.5, 480.25]]]),  # zoomed already
    ({"xaxis": {"autorange": True, "range": [0, 900]}}, []),  # as drawn
])
def test_a_range_dragged_before_the_listener_found_the_chart_is_reported_when_it_does(live, layout, at_attach):
    """The listener finds its chart by polling (every 300 ms): a drag in between zooms the chart locally and
    no event reports it, so the coarse overview would pass for the range. On finding the chart the listener
    reports a range the chart already shows; after that the chart's own relayout events do."""
    _, browser = live
    page = browser.new_page()
    result = page.evaluate(LISTENER_ON_A_STAND_IN, [zoom_chart._JS, layout])
    page.close()
    assert result["bound"] == ["plotly_relayout"]
    assert result["sent"][:result["atAttach"]] == at_attach
    assert result["sent"][result["atAttach"]:] == [["range", [200, 300]]]
