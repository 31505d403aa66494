"""User text is shown as text in a real browser (issue 21 item 7): a run whose description holds a
Markdown image (and whose notes hold an HTML image) pointing at an HTTP server on loopback is opened on
the Runs page in Chromium; the description is on screen as its characters, and the server sees no
request. Against the real API and dashboard (the session's stack from conftest.py)."""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from aah_core.presets import get_preset
from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
SETTLE_MS = 2_000  # after the text shows: time for an image the page asked for to be fetched


class Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"seen")

    def log_message(self, *args: object) -> None:
        pass


def test_a_markdown_image_in_a_description_makes_no_request(live):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        created = httpx.post(f"{api}/tracking/runs", json={"run_key": uuid.uuid4().hex, "name": "pixel bait",
                                                           "config": get_preset("tiny").to_dict()}, timeout=30)
        assert created.status_code == 201, created.text
        run_id = created.json()["run"]["id"]
        description = f"![x](http://127.0.0.1:{port}/pixel)"
        patched = httpx.patch(f"{api}/runs/{run_id}", timeout=30, json={
            "description": description, "notes": f"<img src='http://127.0.0.1:{port}/notes'>", "tags": ["pixel"]})
        assert patched.status_code == 200, patched.text

        page = S.open_page(browser, f"{stack.ui_url}/runs?q=pixel")
        picker = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Selected runs")

        details = page.locator("details").filter(has_text=f"Run #{run_id} pixel bait")

        def shown() -> bool:  # the run picked in "Selected runs": its details open below the table
            if details.count():
                return True
            picker.locator("input").click(timeout=5_000)
            page.keyboard.type(f"#{run_id} pixel")
            page.keyboard.press("Enter")
            page.wait_for_timeout(1_000)
            return details.count() > 0
        S.wait_for(shown, timeout=120, interval=0.5, what="the run's details on the Runs page")
        page.wait_for_timeout(SETTLE_MS)
        assert Recorder.hits == [], f"the page fetched {Recorder.hits}"
        assert page.locator(f'img[src*="{port}"]').count() == 0
        assert details.get_by_text(description).count() == 1  # shown as its characters
        page.close()
        check = S.open_page(browser, f"http://127.0.0.1:{port}/reachable")  # the recorder does see a fetch
        S.wait_for(lambda: "/reachable" in Recorder.hits, what="the recorder to see the browser's request")
        check.close()
    finally:
        server.shutdown()
        server.server_close()
