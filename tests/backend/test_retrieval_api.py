"""POST /models/{id}/retrieval: the engine's passkey table under a plan, over HTTP, and its bad inputs."""

from __future__ import annotations

import pytest

from aah_core.analysis.retrieval import retrieval_table
from aah_core.checkpoint import load_checkpoint
from aah_core.windows import validate_plan
from tests.backend.conftest import TINY_PLAN

API = "/api/v1"
T = 64  # the tiny demo's seq_len


def test_the_table_is_the_engines_for_the_plan_asked(client, tiny_demo):
    model = load_checkpoint(tiny_demo).model.eval()
    shorter = [[4, 4], [4, 4]]
    for windows, plan in ((None, validate_plan(TINY_PLAN, 2, 2, T)), (shorter, validate_plan(shorter, 2, 2, T))):
        r = client.post(f"{API}/models/demo/retrieval", json={"windows": windows, "per_cell": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        want = retrieval_table(model, plan, n=4)
        assert body["windows"] == (TINY_PLAN if windows is None else shorter)
        assert (body["distances"], body["starts"]) == (want.distances, want.starts) == ([8, 16, 32, 48, 57],
                                                                                       [0, 16, 32, 48])
        assert body["end"] == pytest.approx(want.end) and body["key_chars_per_cell"] == 16
        assert [[c is None for c in row] for row in body["by_start"]] == \
            [[s + d + 8 > T + 1 for d in body["distances"]] for s in body["starts"]]
        assert [c for row in body["by_start"] for c in row] == \
            pytest.approx([c for row in want.by_start for c in row])
        assert body["chance"] == pytest.approx(1 / 62) and body["cached"] is False
    again = client.post(f"{API}/models/demo/retrieval", json={"windows": shorter, "per_cell": 4}).json()
    assert again["cached"] is True and again["end"] == body["end"]


@pytest.mark.parametrize("body, message", [
    ({"per_cell": 1}, "per_cell"),
    ({"per_cell": 65}, "per_cell"),
    ({"windows": [[4, 4]]}, "windows"),
    ({"windows": [[0, 4], [4, 4]]}, "windows"),
    ({"windows": None, "extra": 1}, "extra"),
])
def test_bad_requests_are_422_naming_the_field(client, body, message):
    r = client.post(f"{API}/models/demo/retrieval", json=body)
    assert r.status_code == 422 and message in r.text


def test_an_unknown_model_is_404(client):
    assert client.post(f"{API}/models/nope/retrieval", json={}).status_code == 404
