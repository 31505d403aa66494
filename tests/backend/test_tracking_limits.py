"""Checkpoint uploads bypass the small-body limit for one of their own, and tracking writes need the token."""

from __future__ import annotations

from fastapi.testclient import TestClient

from backend.app import create_app
from tests.backend.conftest import make_settings
from tests.backend.test_tracking_api import API, create, tracked, upload


def test_uploads_have_their_own_limit_and_writes_need_the_token(tmp_path, tiny_demo):
    weights = (tiny_demo / "model.safetensors").stat().st_size
    assert weights > 4096
    settings = make_settings(tmp_path, None, max_body_bytes=4096, max_upload_bytes=weights, api_token="s3cret",
                             seed_paper=False)
    with TestClient(create_app(settings)) as app:
        r = create(app, tiny_demo)
        assert r.status_code == 401 and "AAH_API_TOKEN" in r.json()["detail"]
        app.headers["Authorization"] = "Bearer s3cret"
        run_id, auth = tracked(app, tiny_demo)
        r = app.put(f"{API}/{run_id}/checkpoint/model.safetensors", content=b"x" * (weights + 1), headers=auth)
        assert r.status_code == 413 and "AAH_MAX_UPLOAD_BYTES" in r.json()["detail"]
        assert upload(app, run_id, tiny_demo, auth).status_code == 200  # weights > max_body_bytes, <= the upload limit
