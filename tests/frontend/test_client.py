"""aah_client.ApiClient against an httpx.MockTransport: paths, bodies, auth, errors."""

import json

import httpx
import pytest

from aah_client import ApiClient, ApiError, ServerBusy, ServiceUnavailable
from aah_client import client as client_module


def make(handler, token=None):
    return ApiClient("http://api.test/", token=token, transport=httpx.MockTransport(handler))


def recorder(payload=None, status=200):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=payload if payload is not None else {})

    return seen, handler


def test_get_paths_and_query_params():
    seen, handler = recorder([])
    api = make(handler)
    api.runs(experiment="demo", status="RUNNING", limit=5)
    api.run_metrics(3, keys=["val_loss", "acr"], min_step=10, max_points=2000)
    api.attention("demo", 1, 2, text_id="t1")
    api.retained_mass("demo")
    api.run_windows(4, step=20)
    api.attention("demo", 1, 2, window=None)
    api.attention("demo", 1, 2, window=8)
    api.unavailable_models()
    urls = [str(r.url) for r in seen]
    assert urls[0] == "http://api.test/api/v1/runs?experiment=demo&status=RUNNING&limit=5&offset=0"
    assert urls[1] == "http://api.test/api/v1/runs/3/metrics?keys=val_loss%2Cacr&min_step=10&max_points=2000"
    assert urls[2] == "http://api.test/api/v1/models/demo/attention?layer=1&head=2&text_id=t1&window=own"
    assert urls[3] == "http://api.test/api/v1/models/demo/retained-mass"
    assert urls[4] == "http://api.test/api/v1/runs/4/windows?step=20"
    assert urls[5] == "http://api.test/api/v1/models/demo/attention?layer=1&head=2&window=full"  # None = full
    assert urls[6].endswith("attention?layer=1&head=2&window=8")
    assert urls[7] == "http://api.test/api/v1/models/unavailable"
    assert all(r.method == "GET" for r in seen)


def test_post_bodies_follow_the_contract():
    seen, handler = recorder({"id": 1})
    api = make(handler)
    api.evaluate("demo", [[4, None]], eval_set="copy", per_token=True)
    api.allocate("demo", 0.5)
    api.create_run("demo", overrides={"train.max_steps": 50})
    api.compare_runs([1, 2], agg="at_step", step=100)
    api.windows_diff({"run_id": 1, "step": None}, {"model_id": "demo"})
    api.create_view("v", "editor", {"plan": "4.full"})
    api.attention("demo", 0, 1, text="hello there", window=8, offset=3)
    api.cancel_run(7)
    api.register_model("my-llama", name="My Llama")
    bodies = [(r.method, r.url.path, json.loads(r.content or b"null")) for r in seen]
    assert bodies[0] == ("POST", "/api/v1/models/demo/evaluate",
                         {"windows": [[4, None]], "eval_set": "copy", "per_token": True})
    assert bodies[1][2] == {"budget": 0.5, "metric": "causal_coverage", "eval_set": "mixed"}
    assert bodies[2][2] == {"preset": "demo", "overrides": {"train.max_steps": 50}, "name": None, "experiment": None,
                            "target": "local", "resources": {}}
    assert bodies[3][2] == {"run_ids": [1, 2], "keys": None, "agg": "at_step", "step": 100}
    assert bodies[4] == ("POST", "/api/v1/windows/diff", {"a": {"run_id": 1, "step": None}, "b": {"model_id": "demo"}})
    assert bodies[5][2] == {"name": "v", "page": "editor", "state": {"plan": "4.full"}}
    assert bodies[6] == ("POST", "/api/v1/models/demo/attention",
                         {"layer": 0, "head": 1, "text": "hello there", "text_id": None, "window": 8, "offset": 3})
    assert bodies[7][:2] == ("POST", "/api/v1/runs/7/cancel")
    assert bodies[8] == ("POST", "/api/v1/models", {"path": "my-llama", "name": "My Llama", "seq_len": None})


def test_token_is_sent_as_bearer():
    seen, handler = recorder({"status": "ok"})
    make(handler, token="s3cret").health()
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    make(handler).health()
    assert "authorization" not in seen[1].headers


def test_delete_view_returns_none_on_204():
    api = make(lambda r: httpx.Response(204))
    assert api.delete_view(3) is None


@pytest.mark.parametrize("status", [401, 404, 409, 413, 422, 503])
def test_error_status_carries_the_servers_detail(status):
    api = make(lambda r: httpx.Response(status, json={"detail": "layer 2, head 5: window 0 is invalid"}))
    with pytest.raises(ApiError) as info:
        api.evaluate("demo", [[0]])
    assert info.value.status == status
    assert info.value.detail == "layer 2, head 5: window 0 is invalid"
    assert not isinstance(info.value, ServiceUnavailable)


def test_fastapi_validation_list_detail_is_flattened():
    body = {"detail": [{"loc": ["body", "windows", 0], "msg": "bad window", "type": "x"}]}
    api = make(lambda r: httpx.Response(422, json=body))
    with pytest.raises(ApiError, match="windows.0: bad window"):
        api.evaluate("demo", [[0]])


def test_non_json_error_body():
    api = make(lambda r: httpx.Response(502, text="Bad gateway from proxy"))
    with pytest.raises(ApiError) as info:
        api.models()
    assert info.value.status == 502 and "Bad gateway" in info.value.detail


def test_unreachable_server_raises_service_unavailable():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ServiceUnavailable) as info:
        make(refuse).health()
    assert info.value.status is None and "api.test" in info.value.detail


def test_timeout_raises_service_unavailable():
    def slow(request):
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ServiceUnavailable, match="timed out"):
        make(slow).models()


def test_real_refused_port_is_service_unavailable():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServiceUnavailable):
        ApiClient(f"http://127.0.0.1:{port}", timeout=2).health()


def test_cost_and_generate_post_their_bodies():
    seen, handler = recorder({})
    api = make(handler)
    api.cost("demo", [[4, None]], 128, measure=True)
    api.generate("demo", "Hi", windows=[[4, None]], max_new_tokens=9)
    assert [str(r.url) for r in seen] == ["http://api.test/api/v1/models/demo/cost",
                                          "http://api.test/api/v1/models/demo/generate"]
    assert json.loads(seen[0].content) == {"windows": [[4, None]], "context": 128, "measure": True}
    assert json.loads(seen[1].content) == {"prompt": "Hi", "windows": [[4, None]], "max_new_tokens": 9,
                                           "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}


def busy_then_ok(n_busy, retry_after="2"):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) <= n_busy:
            return httpx.Response(429, json={"detail": "the server is busy"}, headers={"Retry-After": retry_after})
        return httpx.Response(200, json={"loss": 1.0})

    return seen, handler


def test_busy_server_is_retried_after_its_retry_after(monkeypatch):
    slept = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    seen, handler = busy_then_ok(2)
    assert make(handler).evaluate("demo", [[None]]) == {"loss": 1.0}
    assert len(seen) == 3 and slept == [2.0, 2.0]
    assert json.loads(seen[2].content) == json.loads(seen[0].content)  # the same request again


def test_still_busy_after_the_retries_raises_server_busy(monkeypatch):
    slept = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    seen, handler = busy_then_ok(10, retry_after="600")
    api = ApiClient("http://api.test/", busy_retries=2, transport=httpx.MockTransport(handler))
    with pytest.raises(ServerBusy) as info:
        api.sensitivity("demo")
    assert info.value.status == 429 and info.value.retry_after == 600 and "busy" in info.value.detail
    assert len(seen) == 3 and slept == [client_module.BUSY_WAIT_MAX_S] * 2  # long waits are capped
    seen.clear()
    with pytest.raises(ServerBusy):  # busy_retries=0: at once, for callers that retry themselves
        ApiClient("http://api.test/", busy_retries=0, transport=httpx.MockTransport(handler)).sensitivity("demo")
    assert len(seen) == 1


def test_round_plan_posts_its_body_and_export_returns_the_zip_bytes():
    seen = []
    archive = b"PK\x05\x06" + bytes(18)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/export"):
            if json.loads(request.content)["granularity"] == "layer":
                return httpx.Response(422, json={"detail": "a Hugging Face folder is exported at 'transformers'"})
            return httpx.Response(200, content=archive, headers={"content-type": "application/zip"})
        return httpx.Response(200, json={"loss": 1.0})

    api = make(handler, token="t")
    assert api.round_plan("demo", [[4, None]], granularity="layer", mode="budget") == {"loss": 1.0}
    assert api.export("demo", [[4, None]], name="mine") == archive
    assert json.loads(seen[0].content) == {"windows": [[4, None]], "granularity": "layer", "mode": "budget",
                                           "eval_set": "mixed"}
    assert str(seen[0].url).endswith("/api/v1/models/demo/round")
    assert json.loads(seen[1].content) == {"windows": [[4, None]], "granularity": "transformers", "mode": "up",
                                           "eval_set": "mixed", "name": "mine"}
    assert seen[1].headers["authorization"] == "Bearer t"
    with pytest.raises(ApiError, match="exported at 'transformers'") as err:
        api.export("demo", [[4, None]], granularity="layer")
    assert err.value.status == 422
