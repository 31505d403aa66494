"""Issue 23: `aah serve` (make demo) warms the API up before it answers /health, so the first open of
the editor is served from the result cache: its own plan's evaluation and the opening sweep."""

from pathlib import Path

from fastapi.testclient import TestClient

from aah_launcher import serve
from backend.app import create_app
from backend.services import analysis
from frontend import cold_open
from tests.backend.conftest import make_settings


def _first_visit(client: TestClient) -> tuple[dict, dict, dict]:
    """What the editor asks first: the model, its own plan evaluated with per-token losses, the sweep."""
    model = client.get("/api/v1/models").json()[0]
    own = client.get(f"/api/v1/models/{model['id']}/windows").json()["windows"]
    ev = client.post(f"/api/v1/models/{model['id']}/evaluate",
                     json={"windows": own, "eval_set": "mixed", "per_token": True}).json()
    return model, ev, client.get(f"/api/v1/models/{model['id']}/sensitivity", params={"eval_set": "mixed"}).json()


def _warm_keys(client: TestClient) -> list:
    """The result-cache keys of what the editor's first visit asks (the service's own key format), for
    the keys that are there."""
    registry = client.app.state.registry
    lm = registry.get(client.get("/api/v1/models").json()[0]["id"])
    keys = [(lm.id, "eval", "mixed", tuple(lm.plan.flatten().tolist()), True, lm.model.sinks),
            (lm.id, "sensitivity", "mixed")]
    return [k for k in keys if registry.cached(k) is not None]


def test_a_warmed_api_serves_the_editors_first_visit_from_its_cache(tmp_path: Path, tiny_demo: Path):
    settings = make_settings(tmp_path / "data", tiny_demo, seed_paper=False, warm_up=True)
    with TestClient(create_app(settings)) as client:
        assert len(_warm_keys(client)) == 2  # before any request
        _, ev, sweep = _first_visit(client)
        assert sweep["pick"] is not None and sweep["pick"]["held_out_delta"] is not None
    # a server that was not warmed computes the same numbers on the first visit
    cold = make_settings(tmp_path / "data2", tiny_demo, seed_paper=False)
    with TestClient(create_app(cold)) as client:
        assert _warm_keys(client) == []
        _, cold_ev, cold_sweep = _first_visit(client)
        assert (cold_ev["loss"], cold_sweep["delta"], cold_sweep["pick"]) == (ev["loss"], sweep["delta"], sweep["pick"])


def test_aah_serve_turns_the_warm_up_on_and_sweeps_what_the_dashboard_sweeps(tmp_path: Path):
    api, _ = serve._children(tmp_path, "127.0.0.1", 8000, 8501, None)
    assert api.env["AAH_WARM_UP"] == "true"
    assert analysis.OPENING_SWEEP_HEADS == cold_open.SWEEP_LIMIT
    from backend.schemas.models import EvaluateRequest
    assert analysis.WARM_EVAL_SET == EvaluateRequest.model_fields["eval_set"].default  # the editor's default set
