"""A new session of the editor asks for Streamlit's Plotly code as soon as it reports its first paint, not
when the charts' rerun arrives (frontend/components.py, first_paint_done): in Chromium against the real
API and dashboard. The report is the message the browser sends with the first-paint component's key; the
chunk's request must start before the first message the server sends after it (the rerun that brings
the charts comes later still)."""

from __future__ import annotations

import pytest

from frontend import components
from tests.frontend import stack as S

pytestmark = [pytest.mark.browser]

# Times (performance.now) of the first-paint report leaving the browser and of the first server message
# after it. The report is a protobuf BackMsg that carries the component's key as text.
_WATCH = """
window.__ws = { report: null, reply: null };
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
    : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer) : null;
  if (bytes && window.__ws.report === null && new TextDecoder('latin1').decode(bytes).includes('%s')) {
    window.__ws.report = performance.now();
    this.addEventListener('message', () => { if (window.__ws.reply === null) window.__ws.reply = performance.now(); });
  }
  return send.call(this, data);
};
"""


def test_a_cold_open_asks_for_the_chart_code_before_the_charts_rerun_arrives(live, model):
    stack, browser = live
    chunk = components.PLOTLY_CHUNK
    assert chunk, "this Streamlit names its Plotly chunk otherwise: the editor no longer loads it early"
    context = browser.new_context(viewport={"width": 1440, "height": 1100})
    try:
        context.add_init_script(_WATCH % "_painted.editor.signal")
        page = context.new_page()
        page.goto(stack.ui_url + "/")
        S.editor_ready(page)
        times = page.evaluate("window.__ws")
        started = page.evaluate("(name) => (performance.getEntriesByType('resource')"
                                ".find(r => r.name.endsWith('/static/js/' + name)) || {}).startTime", chunk)
        assert times["report"] is not None, "the first paint was never reported"
        assert times["reply"] is not None and started is not None, (times, started)
        assert started < times["reply"], (times, started)  # the report goes out after the frame that asks
    finally:
        context.close()
