"""Browser-measured latency of the window editor: from a click on a head's window (the pill under
the grid) to the updated loss on screen, and from opening the app in a fresh session (cold open) to
the first loss on screen, in Chromium driven by Playwright against the real API and the real
dashboard on this machine.

Each measured edit goes to a head not edited before, so every plan is new (no cache hit on either
side). The clock is the page's own `performance.now()`: taken just before the click is dispatched,
and again on the first animation frame where the metrics caption names the new plan (the loss is
rendered in the same fragment update). Chromium runs as tests/frontend/stack.py starts it: without the
address-bar popup and spare renderers that headless Chromium starts with every new context (a user's
browser has them once, not once per opened page). Writes bench/results/ui-<machine>.json.

    python -m bench.ui [--edits 15] [--warmup 2] [--opens 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
from pathlib import Path

import httpx

from bench.common import percentiles, write_result
from frontend.plans import encode_plan, parse_window, window_label
from tests.frontend import stack as S

_CLICK = """([label]) => {
  const group = document.querySelector('[role=radiogroup][aria-label^="Window of layer"]');
  const pill = [...group.querySelectorAll('button')].find(b => b.textContent.trim() === label);
  const t0 = performance.now();
  pill.click();
  return t0;
}"""
_DONE = """([plan]) => {
  const hit = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
    .some(e => e.textContent.includes('evaluated plan ' + plan + ' ') || e.textContent.endsWith('evaluated plan ' + plan));
  return hit ? performance.now() : false;
}"""


_FIRST_LOSS = """() => {
  const v = document.querySelector('.aah-badge[data-label="loss (nats)"] .aah-value');
  return v && v.textContent.trim() ? performance.now() : false;
}"""


# every chart of the editor drawn: the loss plot and the token strip (Plotly's SVG in each), and no
# element still waiting for its code
_ALL_CHARTS = """([n]) => {
  const drawn = document.querySelectorAll('[data-testid="stPlotlyChart"] .main-svg').length;
  return drawn >= n && !document.querySelector('[data-testid="stSkeleton"]') ? performance.now() : false;
}"""
EDITOR_CHARTS = 2


def cold_opens(browser, url: str, n: int) -> list[tuple[float, float]]:
    """(ms to the first frame showing the loss, ms to the first frame with every chart drawn), both from
    navigation start (performance.timeOrigin), for `n` opens of `url`, each in a fresh browser context
    (a new Streamlit session, empty browser cache)."""
    out = []
    for _ in range(n):
        context = browser.new_context(viewport={"width": 1440, "height": 1100})
        page = context.new_page()
        page.goto(url, wait_until="commit")
        loss = page.wait_for_function(_FIRST_LOSS, polling="raf", timeout=120_000).json_value()
        charts = page.wait_for_function(_ALL_CHARTS, arg=[EDITOR_CHARTS], polling="raf", timeout=120_000).json_value()
        out.append((loss, charts))
        context.close()
    return out


def measure(edits: int, warmup: int, opens: int) -> dict | None:
    """The measurement, or None when the API registered no model (no demo checkpoint)."""
    # started as `aah serve` (make demo) starts them: the API warmed up before it answers /health
    with tempfile.TemporaryDirectory() as tmp, S.running_stack(Path(tmp), env={"AAH_WARM_UP": "true"}) as stack, \
            S.chromium() as browser:
        models = httpx.get(f"{stack.api_url}/api/v1/models", timeout=30).json()
        if not models:
            return None
        model = models[0]
        # the first open after the services start loads the model in the API; later ones find it loaded
        first, *warm = cold_opens(browser, stack.ui_url + "/", opens + 1)
        plan = httpx.get(f"{stack.api_url}/api/v1/models/{model['id']}/windows", timeout=30).json()["windows"]
        labels = [window_label(b) for b in model["buckets"]]
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        page.set_default_timeout(60_000)
        page.goto(stack.ui_url + "/")
        S.editor_ready(page)  # the loss and, a moment later, the charts: the timed clicks start after
        cells = [(l, h) for l in range(model["n_layer"]) for h in range(model["n_head"])]
        samples, server_ms, losses = [], [], []
        for i in range(warmup + edits):
            layer, head = cells[i % len(cells)]
            if i >= len(cells):  # more edits than heads: later rounds pick other windows, so plans stay new
                labels = labels[1:] + labels[:1]
            if (layer, head) != (0, 0) or i > 0:  # pick the head on the window map (in the browser: no rerun)
                page.get_by_role("button", name=f"layer {layer}, head {head}", exact=True).click()
                page.get_by_role("radiogroup", name=f"Window of layer {layer}, head {head}").wait_for()
            target = next(lb for lb in labels if parse_window(lb) != plan[layer][head])
            plan = copy.deepcopy(plan)
            plan[layer][head] = parse_window(target)
            t0 = page.evaluate(_CLICK, [target])
            try:
                t1 = page.wait_for_function(_DONE, arg=[encode_plan(plan)], polling="raf", timeout=120_000).json_value()
            except Exception:
                S.ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(S.ARTIFACTS / "bench-ui-timeout.png"))  # what the page showed instead
                raise
            if i >= warmup:
                samples.append(t1 - t0)
                losses.append(S.metric_value(page, "loss (nats)"))
                cap = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="server time").first
                server_ms.append(float(cap.inner_text().split("server time ")[1].split(" ms")[0]))
        return {"model": {k: model[k] for k in ("id", "n_layer", "n_head", "seq_len")},
                "edit_to_loss_ms": percentiles(samples), "samples_ms": [round(s, 1) for s in samples],
                "cold_open_first_ms": round(first[0], 1), "cold_open_first_charts_ms": round(first[1], 1),
                "cold_open_ms": percentiles([w[0] for w in warm]), "cold_open_charts_ms": percentiles([w[1] for w in warm]),
                "cold_open_samples_ms": [round(w[0], 1) for w in warm],
                "cold_open_charts_samples_ms": [round(w[1], 1) for w in warm],
                "server_eval_ms_p50": statistics.median(server_ms), "losses": losses,
                "method": "Chromium + Playwright; performance.now() from pill click to the frame showing the "
                          "new plan's metrics; each edit a new plan (no cache hits). Cold open: a fresh browser "
                          "context per open, performance.now() (from navigation start) at the first frame "
                          "showing the loss; the first open after the services start is reported apart"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--opens", type=int, default=5, help="cold opens measured after the first one")
    args = parser.parse_args()
    reason = S.browser_missing()
    if reason:
        print(f"bench.ui skipped: {reason}")  # noqa: T201
        return
    load_before = os.getloadavg()[0]
    result = measure(args.edits, args.warmup, args.opens)
    if result is None:
        print("bench.ui skipped: the API registered no model (is the demo checkpoint data/demo missing?)")  # noqa: T201
        return
    result["load_avg_1min"] = {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)}
    path = write_result("ui", result)
    p = result["edit_to_loss_ms"]
    print(f"edit -> loss on screen: p50 {p['p50']:.0f} ms, p95 {p['p95']:.0f} ms over {p['n']} edits "  # noqa: T201
          f"(server eval p50 {result['server_eval_ms_p50']:.0f} ms); cold open -> first loss: p50 "
          f"{result['cold_open_ms']['p50']:.0f} ms, every chart p50 {result['cold_open_charts_ms']['p50']:.0f} ms "
          f"(first after start {result['cold_open_first_ms']:.0f} ms, charts {result['cold_open_first_charts_ms']:.0f} ms)"
          f" -> {path}")


if __name__ == "__main__":
    main()
