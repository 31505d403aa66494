"""The garbage collector while the app serves (backend.app.serving_gc): startup's objects frozen out of
full passes, rarer first-generation passes, and both put back on shutdown (tests share one process)."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from backend.app import GC_THRESHOLDS, create_app
from tests.backend.conftest import make_settings


def test_serving_freezes_what_startup_loaded_and_puts_the_collector_back(tmp_path):
    original = gc.get_threshold()
    gc.set_threshold(1234, 11, 12)
    frozen = gc.get_freeze_count()
    try:
        with TestClient(create_app(make_settings(tmp_path / "data", None))) as client:
            assert client.get("/api/v1/health").status_code == 200
            assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > frozen
        assert gc.get_threshold() == (1234, 11, 12) and gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*original)
