import httpx
import pytest
import streamlit as st

from tests.frontend import stack as S
from tests.frontend.fake_api import FakeApi


@pytest.fixture(scope="package", autouse=True)
def _component_scan_once():
    """Every AppTest scans the installed packages' metadata for Streamlit components (~0.2 s of CPU: 40 % of
    test_pages.py's time); a server scans once at start. The installed packages do not change during a run,
    so the first scan's answer is kept for the package's tests (each AppTest still registers what it finds)."""
    from streamlit.components.v2 import manifest_scanner

    found = manifest_scanner.scan_component_manifests()
    with pytest.MonkeyPatch.context() as patch:  # looked up on the module at each AppTest's first run
        patch.setattr(manifest_scanner, "scan_component_manifests", lambda max_workers=None: list(found))
        yield


@pytest.fixture
def fake_api(monkeypatch):
    """Route every dashboard API call to a FakeApi (caches cleared so no test sees another's data)."""
    from frontend import api

    fake = FakeApi()
    monkeypatch.setattr(api, "get_client", lambda: fake)
    st.cache_data.clear()
    st.cache_resource.clear()
    yield fake
    st.cache_data.clear()


@pytest.fixture(scope="package")
def live(tmp_path_factory):
    """The real API and dashboard and one Chromium, started once for every browser test module.

    Package-wide, not session-wide: Playwright's sync API marks its event loop as running in the main thread
    while it is open, so a later test's asyncio.run() would fail. The browser tests run one after another
    (on one pytest-xdist worker: tests/conftest.py), and this stops when the worker leaves tests/frontend."""
    reason = S.browser_missing()
    if reason:
        pytest.skip(reason)
    with S.running_stack(tmp_path_factory.mktemp("e2e")) as st_, S.chromium() as browser:
        S.ARTIFACTS.mkdir(exist_ok=True)
        yield st_, browser


@pytest.fixture(scope="package")
def model(live):
    models = httpx.get(f"{live[0].api_url}/api/v1/models", timeout=30).json()
    if not models:
        pytest.skip("the API registered no model (is the demo checkpoint data/demo missing?)")
    return models[0]
