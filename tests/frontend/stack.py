"""Start the real API (uvicorn backend.app:app) and the real dashboard (streamlit run frontend/app.py)
on free loopback ports with a temporary data dir, and drive Debian's Chromium with Playwright.
Used by the browser test and by bench/ui.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# Playwright 1.65's own --disable-features list. Chromium keeps only the last --disable-features switch
# it is given, so ours repeats Playwright's before adding to it (test_browser_chromium.py checks that none
# is dropped, which catches a Playwright upgrade that changes the list).
PLAYWRIGHT_DISABLED_FEATURES = [
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding", "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect", "TcpPortRandomizationWin", "OptimizationHints",
    "NetworkTimeServiceQuerying", "AimEnabled", "PreconnectToSearch", "msForceBrowserSignIn",
    "msEdgeUpdateLaunchServicesPreferredVersion"]
# Headless Chromium 156 starts a renderer for the address bar's popup (a "top chrome" WebUI) with every
# browser context, beside the page's own: one to two seconds of CPU a context that no test or
# measurement looks at, taken from the page on a 2-core box. A user's browser has one per window, not
# one per opened page, so the cold opens of bench/ui.py measured it where a user never pays it.
# Likewise the spare renderer it starts ahead of a profile's next navigation: every context is a new
# profile that a test navigates once, so the spare one is never used.
NO_EXTRA_RENDERERS = ["WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "SpareRendererForSitePerProcess"]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-features=" + ",".join(PLAYWRIGHT_DISABLED_FEATURES + NO_EXTRA_RENDERERS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser_missing() -> str | None:
    """Why the browser cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (run `make browser`, which installs Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    return None


@dataclass
class Stack:
    api_url: str
    ui_url: str
    data_dir: Path
    log_dir: Path


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # a start is seconds of imports; each poll costs about a millisecond
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def api_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The API's command line, as the launchers run it."""
    return [sys.executable, "-m", "uvicorn", "backend.app:app", "--host", host, "--port", str(port),
            "--http", "backend.api.protocol:TimedH11Protocol"]


@contextlib.contextmanager
def running_api(data: Path, log: Path, env: dict[str, str | None] | None = None,
                timeout: float = 120.0) -> Iterator[str]:
    """Only the API, on a free loopback port with ``data`` as its data dir; yields its base URL."""
    with running_api_process(data, log, env, timeout) as (url, _):
        yield url


@contextlib.contextmanager
def running_api_process(data: Path, log: Path, env: dict[str, str | None] | None = None,
                        timeout: float = 120.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """As running_api; yields (its base URL, its process). A variable set to None in ``env`` is removed."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if k not in ("AAH_API_TOKEN", "AAH_ALLOWED_HOSTS")}
    full_env.update({"AAH_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), **(env or {})})
    full_env = {k: v for k, v in full_env.items() if v is not None}
    proc = subprocess.Popen(api_command(port), cwd=ROOT, env=full_env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/api/v1/health", proc, log, timeout)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process(proc)


@contextlib.contextmanager
def running_stack(work: Path, timeout: float = 120.0, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """Both services up and healthy for the duration of the block (with `env` added to theirs); both
    stopped afterwards."""
    data, logs = work / "data", work / "logs"
    data.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    api_port, ui_port = free_port(), free_port()
    api_url, ui_url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}"
    env = {**os.environ, **(env or {}), "AAH_DATA_DIR": str(data), "AAH_API_URL": api_url, "PYTHONPATH": str(ROOT)}
    env.pop("AAH_API_TOKEN", None)
    procs = []
    try:
        api_log = logs / "api.log"
        procs.append(subprocess.Popen(
            api_command(api_port), cwd=ROOT, env=env, stdout=api_log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        ui_log = logs / "ui.log"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "frontend/app.py", "--server.headless", "true",
             "--server.port", str(ui_port), "--server.address", "127.0.0.1",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=ui_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_ready(f"{api_url}/api/v1/health", procs[0], api_log, timeout)
        wait_ready(f"{ui_url}/_stcore/health", procs[1], ui_log, timeout)
        yield Stack(api_url, ui_url, data, logs)
    finally:
        for p in procs:
            stop_process(p)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, url: str, context=None):
    """A new page (in `context` if given) at a desktop size, navigated to `url`."""
    page = (context or browser).new_page()
    page.set_viewport_size({"width": 1440, "height": 1100})
    page.set_default_timeout(60_000)
    page.goto(url)
    return page


def href(page) -> str:
    """The address bar as the app left it (Streamlit updates it with history.replaceState)."""
    return page.evaluate("location.href")


_PLOT = """(title) => {
  const div = [...document.querySelectorAll('.js-plotly-plot')]
    .find(e => ((e.layout && e.layout.title && e.layout.title.text) || '').includes(title));
  if (!div || !div._fullLayout) return null;
  const arr = (v) => v == null ? null : ArrayBuffer.isView(v) ? Array.from(v)
    : Array.isArray(v) ? v.map(r => ArrayBuffer.isView(r) ? Array.from(r) : r) : v;
  const ax = (a) => a ? {range: a.range, type: a.type, title: a.title && a.title.text} : null;
  return {title: div.layout.title.text, xaxis: ax(div._fullLayout.xaxis), yaxis: ax(div._fullLayout.yaxis),
          data: div.data.map(d => ({name: d.name, x: arr(d.x), y: arr(d.y), z: arr(d.z), zmin: d.zmin, zmax: d.zmax, type: d.type,
                           color: d.line && d.line.color, fill: d.fillcolor,
                           error_y: d.error_y ? arr(d.error_y.array) : null}))};
}"""


def plot(page, title: str) -> dict | None:
    """What Plotly drew in the chart whose title contains `title`: traces (name, x, y, z) and the
    axes' drawn ranges, read from the page's own graph div; None while no such chart is on screen."""
    return page.evaluate(_PLOT, title)


def metric_value(page, label: str) -> str:
    """The value of the number badge (frontend/badges.py) labelled `label` ('' while it is not on screen)."""
    texts = page.locator(f'.aah-badge[data-label="{label}"] .aah-value').all_inner_texts()  # now; never waits
    return texts[0].strip() if texts else ""


def editor_ready(page, timeout: float = 60.0) -> str:
    """Wait until the editor is fully drawn: the loss, then its charts (a new session draws them once
    the browser has shown the loss, in a rerun of the charts' own fragment); returns the loss."""
    loss = wait_for(lambda: metric_value(page, "loss (nats)"), timeout, what="the first loss")
    wait_for(lambda: page.locator('[data-testid="stPlotlyChart"] .main-svg').count() >= 1, timeout,
             what="the window map")
    return loss


# Quiet: no script running, nothing stale, no element waiting for its code, and no finite animation
# running. The last: opening an expander starts a 500 ms height animation (Web Animations API) whose end
# resets the details' inline height and overflow; the page's script state says nothing about it. The lost
# deck click (below) was made 560 ms after the expander's click, as that animation ended (not proven the
# cause: in the same loop clicks made in its last frames were not lost; but a moving page is not quiet).
# Infinite ones (a spinner) are left to the running icon and the skeleton.
_SETTLED = """() => !document.querySelector('[data-testid="stStatusWidgetRunningIcon"],'
  + '[data-testid="stStatusWidgetRunningManIcon"],[data-stale="true"],[data-testid="stSkeleton"]')
  && !document.getAnimations().some(a => a.playState === 'running'
                                         && a.effect && a.effect.getComputedTiming().iterations !== Infinity)"""


def settled(page, quiet_ms: int = 400, timeout: float = 120.0) -> None:
    """Wait until no script runs, nothing on the page is stale and nothing animates, for `quiet_ms` in a
    row: a click then meets a page that is not being redrawn or moved. Waiting only; nothing is clicked."""
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        if page.evaluate(_SETTLED):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_ms / 1000:
                return
        else:
            quiet_since = None
        time.sleep(0.05)
    raise TimeoutError(f"the page kept rerunning for {timeout:.0f} s")


def expand(page, label: str, shows, timeout: float = 60.0) -> None:
    """Open the expander whose label holds `label` (one click on a settled page) and wait for `shows`."""
    settled(page)
    box = page.locator("details").filter(has_text=label).first
    assert box.get_attribute("open") is None, f"the {label!r} expander is open already"
    box.locator("summary").click()
    shows.wait_for(timeout=timeout * 1000)


# What a click did, for the report of a click that came to nothing: every pointer and mouse event from now
# on (capture phase) with the element it hit, the watched button's box and the scroll position of
# Streamlit's scroller (stMain: the window itself never scrolls), and the layout shifts (Chromium's Layout
# Instability API) with the elements that moved. The one lost deck click caught with such a log (1 of about
# 210 deck clicks made in a loop, issue 23) was split: mousedown on the button's label, mouseup 4 ms later
# at the same point on stMainBlockContainer, so the browser fired no click on the button (no BackMsg went
# out, no node holding the button was removed). What moved it in those 4 ms is what a next failure shows.
_RECORD = """(name) => {
  const box = () => { const b = [...document.querySelectorAll('button')].find(e => (e.innerText || '').trim() === name);
    if (!b) return 'gone'; const r = b.getBoundingClientRect(); return `y ${Math.round(r.y)} h ${Math.round(r.height)}`; };
  const scroller = () => { const m = document.querySelector('[data-testid="stMain"]');
    return m ? `${Math.round(m.scrollTop)}/${m.scrollHeight}` : '?'; };
  const log = window.__clickLog = [];
  const what = (t) => t ? t.nodeName + (t.dataset && t.dataset.testid ? `[${t.dataset.testid}]` : '')
    + ` "${(t.innerText || '').slice(0, 24).replace(/\\s+/g, ' ')}"` : '?';
  for (const type of ['pointerdown', 'mousedown', 'pointerup', 'mouseup', 'click']) {
    document.addEventListener(type, (e) => log.push(`${Math.round(performance.now())} ${type} ${what(e.target)}`
      + ` at ${Math.round(e.clientX)},${Math.round(e.clientY)}; button ${box()}; scroll ${scroller()}`), true);
  }
  new PerformanceObserver(list => { for (const e of list.getEntries()) log.push(`${Math.round(e.startTime)} shift `
    + (e.sources || []).map(s => (s.node ? what(s.node) : '?')
                                 + ` y ${Math.round(s.previousRect.y)}->${Math.round(s.currentRect.y)}`)
    .join(', ')); }).observe({type: 'layout-shift'});
  return `button ${box()}; scroll ${scroller()}`;
}"""


def prepare_download(page, expander: str, prepare, download, build_s: float = 90.0) -> None:
    """Open `expander`, click `prepare` once and wait for the `download` button it builds."""
    expand(page, expander, prepare)
    settled(page)
    before = page.evaluate(_RECORD, prepare.inner_text().strip())
    prepare.click()
    try:
        download.wait_for(timeout=build_s * 1000)
    except Exception as exc:  # the click has come to nothing (no rerun): say what happened around it
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "prepare-download-timeout.png"), full_page=True)
        raise AssertionError(f"no {download} {build_s:.0f} s after one click on {prepare} (before it: {before}); "
                             f"events since: {page.evaluate('window.__clickLog')}") from exc


def download_deck(page, path: Path) -> Path:
    """On the Present page: prepare the offline HTML deck, download it once and save it to `path`."""
    button = page.get_by_role("button", name="Download deck (HTML, plotly.js inlined, opens offline)")
    prepare = page.get_by_role("button", name="Prepare offline HTML deck")
    prepare_download(page, "Export the deck", prepare, button)
    with page.expect_download() as info:
        button.click()
    info.value.save_as(path)
    return path


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.02, what: str = "condition"):
    """Poll a read-only `predicate()` until it is truthy; returns its value. Only Playwright's errors
    (an element not there yet, or redrawn by a rerun between finding and reading it) count as "not
    yet"; any other exception (a wrong key, a bad index: the test's own bug) propagates at once."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except PlaywrightError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def copy_artifact(src: Path, dst: Path) -> None:
    """Refresh a committed screenshot (docs/) only when asked: AAH_UPDATE_SCREENSHOTS=1.

    Otherwise a test run would leave tracked files modified; the artifact stays in test-artifacts/.
    """
    if os.environ.get("AAH_UPDATE_SCREENSHOTS") != "1":
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
