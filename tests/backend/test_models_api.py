"""Models: listing, own windows, texts, live evaluation, heatmaps, retained mass, sensitivity."""

from __future__ import annotations

import math

import pytest
import torch

from aah_core.analysis.evaluate import evaluate_loss, make_eval_batch
from aah_core.checkpoint import load_checkpoint
from tests.backend.conftest import TINY_PLAN

API = "/api/v1"


def test_models_lists_the_seeded_demo(client):
    models = client.get(f"{API}/models").json()
    assert [m["id"] for m in models] == ["demo"]
    demo = models[0]
    assert (demo["n_layer"], demo["n_head"], demo["seq_len"]) == (2, 2, 64)
    assert demo["buckets"] == [4, 16, None]
    assert demo["n_params"] > 0 and demo["run_id"] is not None
    assert client.get(f"{API}/models/demo").json() == demo


def test_unknown_model_is_404(client):
    for path in ("", "/windows", "/texts", "/attention", "/retained-mass", "/sensitivity"):
        r = client.get(f"{API}/models/nope{path}")
        assert r.status_code == 404, path
        assert "model 'nope' not found" in r.json()["detail"]
    r = client.post(f"{API}/models/nope/evaluate", json={"windows": TINY_PLAN})
    assert r.status_code == 404


def test_own_windows_with_coverage(client):
    body = client.get(f"{API}/models/demo/windows").json()
    assert body["windows"] == TINY_PLAN and body["seq_len"] == 64
    assert body["acr"] == pytest.approx((4 + 64 + 16 + 8) / 4 / 64)
    assert 0 < body["causal_coverage"] < 1 and 0 < body["tile_coverage"] <= 1


def test_texts(client):
    texts = client.get(f"{API}/models/demo/texts").json()
    assert [t["id"] for t in texts] == ["text-0", "text-1", "english-0", "english-1", "copy-0", "copy-1"]
    english = next(t for t in texts if t["id"] == "english-0")
    assert english["kind"] == "english" and english["preview"].startswith("The Keeper of the Northern Light")
    assert all(t["n_tokens"] == 64 and t["preview"] for t in texts)


def test_evaluate_own_plan_equals_aah_eval_exactly(client, tiny_demo):
    ckpt = load_checkpoint(tiny_demo)
    expected = evaluate_loss(ckpt.model, make_eval_batch(ckpt.config, "mixed", n_seq=4))
    body = client.post(f"{API}/models/demo/evaluate", json={"windows": TINY_PLAN}).json()
    assert body["loss"] == expected
    assert body["baseline_loss"] == expected
    assert body["delta"] == 0.0 and body["delta_pct"] == 0.0
    assert body["perplexity"] == pytest.approx(math.exp(expected))
    assert body["windows"] == TINY_PLAN and body["per_token"] is None


def test_evaluate_one_head_edit_and_result_cache(client, tiny_demo):
    edited = [[4, None], [16, 1]]
    first = client.post(f"{API}/models/demo/evaluate", json={"windows": edited, "eval_set": "text"}).json()
    ckpt = load_checkpoint(tiny_demo)
    plan = torch.tensor([[4, 64], [16, 1]])
    expected = evaluate_loss(ckpt.model, make_eval_batch(ckpt.config, "text", n_seq=4), plan)
    assert first["loss"] == pytest.approx(expected, abs=1e-6)
    assert first["delta"] == pytest.approx(first["loss"] - first["baseline_loss"])
    again = client.post(f"{API}/models/demo/evaluate", json={"windows": edited, "eval_set": "text"}).json()
    assert again["cached"] and again["loss"] == first["loss"]


def test_evaluate_per_token(client):
    body = client.post(f"{API}/models/demo/evaluate",
                       json={"windows": [[1, 1], [1, 1]], "eval_set": "copy", "per_token": True}).json()
    pt = body["per_token"]
    assert len(pt["tokens"]) == len(pt["loss"]) == len(pt["baseline"]) == len(pt["delta"]) == 64
    for loss, base, delta in zip(pt["loss"], pt["baseline"], pt["delta"], strict=True):
        assert (loss is None) == (base is None) == (delta is None)
        if loss is not None:
            assert delta == pytest.approx(loss - base)
    assert any(v is None for v in pt["loss"])  # copy prompts are not scored


def test_evaluate_full_written_as_null(client):
    body = client.post(f"{API}/models/demo/evaluate", json={"windows": [[64, 1000], [None, 8]]}).json()
    assert body["windows"] == [[None, None], [None, 8]]


@pytest.mark.parametrize(("windows", "message"), [
    ([[4, 0], [16, 8]], "windows: layer 0, head 1: window 0 is invalid"),
    ([[4, None], [16, -3]], "windows: layer 1, head 1: window -3 is invalid"),
    ([[4, 2.5], [16, 8]], "windows: layer 0, head 1"),
    ([[4, "8"], [16, 8]], "windows: layer 0, head 1"),
    ([[4, True], [16, 8]], "windows: layer 0, head 1"),
    ([[4, None]], "plan must be a list of 2 layers"),
    ([[4, None], [16, 8, 8]], "layer 1: expected 2 windows; got 3"),
    ("full", "windows"),
])
def test_evaluate_rejects_bad_plans(client, windows, message):
    r = client.post(f"{API}/models/demo/evaluate", json={"windows": windows})
    assert r.status_code == 422
    assert message in r.json()["detail"]


def test_evaluate_rejects_unknown_fields_and_sets(client):
    r = client.post(f"{API}/models/demo/evaluate", json={"windows": TINY_PLAN, "eval_set": "wiki"})
    assert r.status_code == 422 and "eval_set" in r.json()["detail"]
    r = client.post(f"{API}/models/demo/evaluate", json={"window": TINY_PLAN})
    assert r.status_code == 422 and "windows: Field required" in r.json()["detail"]


def _check_maps(body, window):
    full, windowed, cut = body["full"], body["windowed"], body["cut_mass"]
    T = len(full)
    for i in range(T):
        assert all(v is None for v in full[i][i + 1:]) and all(v is None for v in windowed[i][i + 1:])
        band = range(max(0, i - window + 1), i + 1)
        assert sum(windowed[i][j] for j in band) == pytest.approx(1.0, abs=1e-5)
        assert sum(windowed[i][: i + 1]) == pytest.approx(1.0, abs=1e-5)  # nothing outside the band
        assert sum(full[i][: i + 1]) == pytest.approx(1.0, abs=1e-5)
        assert cut[i] == pytest.approx(sum(full[i][j] for j in range(0, max(0, i - window + 1))), abs=1e-6)


def test_attention_default_window_is_the_models_own(client):
    body = client.get(f"{API}/models/demo/attention", params={"layer": 1, "head": 0, "text_id": "text-1"}).json()
    assert body["window"] == 16 and body["pool"] == 1 and body["n_tokens"] == 64
    assert len(body["tokens"]) == 64
    _check_maps(body, 16)
    assert body["cut_mass"][:16] == [0.0] * 16


def test_attention_with_window_and_posted_text(client):
    body = client.get(f"{API}/models/demo/attention", params={"layer": 0, "head": 1, "window": 3}).json()
    assert body["window"] == 3
    _check_maps(body, 3)
    body = client.post(f"{API}/models/demo/attention",
                       json={"layer": 0, "head": 0, "text": "def f(x):\n    return x", "window": 5}).json()
    assert body["n_tokens"] == 22 and body["tokens"][:3] == ["d", "e", "f"]
    _check_maps(body, 5)
    full = client.post(f"{API}/models/demo/attention", json={"layer": 0, "head": 0, "text": "abc", "window": 99})
    assert full.json()["window"] is None and full.json()["cut_mass"] == [0.0, 0.0, 0.0]


def test_attention_asks_for_own_and_full_explicitly(client):
    """null means full in a POST body, as in a plan; "own" (the default) is the head's window in the plan."""
    where = {"layer": 1, "head": 0, "text_id": "text-1"}
    own = client.get(f"{API}/models/demo/attention", params={**where, "window": "own"}).json()
    assert own["window"] == 16 and own == client.get(f"{API}/models/demo/attention", params=where).json()
    full = client.get(f"{API}/models/demo/attention", params={**where, "window": "full"}).json()
    assert full["window"] is None and set(full["cut_mass"]) == {0.0} and full["windowed"] == full["full"]
    posted = {"layer": 1, "head": 0, "text": "def f(x):\n    return x" * 2}
    as_null = client.post(f"{API}/models/demo/attention", json={**posted, "window": None}).json()
    assert as_null["window"] is None and set(as_null["cut_mass"]) == {0.0}
    as_own = client.post(f"{API}/models/demo/attention", json={**posted, "window": "own"}).json()
    assert as_own == client.post(f"{API}/models/demo/attention", json=posted).json()
    assert as_own["window"] == 16 and max(as_own["cut_mass"]) > 0


@pytest.mark.parametrize(("params", "status", "message"), [
    ({"layer": 2}, 422, "layer: 2 is out of range"),
    ({"head": 5}, 422, "head: 5 is out of range"),
    ({"layer": -1}, 422, "layer"),
    ({"window": 0}, 422, "window"),
    ({"window": "null"}, 422, "window"),
    ({"window": "3.5"}, 422, "window"),
    ({"text_id": "nope"}, 404, "text 'nope' not found"),
])
def test_attention_errors(client, params, status, message):
    r = client.get(f"{API}/models/demo/attention", params=params)
    assert r.status_code == status and message in r.json()["detail"]


def test_attention_post_errors(client):
    r = client.post(f"{API}/models/demo/attention", json={"layer": 0, "head": 0, "text": ""})
    assert r.status_code == 422 and "empty" in r.json()["detail"]
    r = client.post(f"{API}/models/demo/attention", json={"layer": 0, "head": 0, "text": "x" * 100_001})
    assert r.status_code == 422 and r.json()["detail"].startswith("text:")
    r = client.post(f"{API}/models/demo/attention", json={"layer": 0, "head": 0, "text": "x", "offset": -1})
    assert r.status_code == 422 and r.json()["detail"].startswith("offset")


def test_attention_on_a_long_text_shows_seq_len_tokens_from_the_offset(client):
    """A text longer than seq_len (64 here) is read whole; the maps cover the span chosen by `offset`,
    clipped to the text, and the answer says which span of how many tokens that is."""
    text = "".join(chr(97 + i % 26) for i in range(1000))  # 1000 byte tokens
    ask = {"layer": 0, "head": 0, "text": text}
    first = client.post(f"{API}/models/demo/attention", json=ask).json()
    assert (first["offset"], first["n_tokens"], first["text_tokens"]) == (0, 64, 1000)
    assert "".join(first["tokens"]) == text[:64]
    mid = client.post(f"{API}/models/demo/attention", json={**ask, "offset": 500, "window": 16}).json()
    assert (mid["offset"], mid["n_tokens"]) == (500, 64) and "".join(mid["tokens"]) == text[500:564]
    _check_maps(mid, 16)
    past = client.post(f"{API}/models/demo/attention", json={**ask, "offset": 990}).json()
    assert (past["offset"], past["n_tokens"]) == (936, 64) and "".join(past["tokens"]) == text[936:]
    short = client.post(f"{API}/models/demo/attention", json={**ask, "text": "abc", "offset": 7}).json()
    assert (short["offset"], short["n_tokens"], short["text_tokens"]) == (0, 3, 3)


def test_retained_mass_curves(client):
    body = client.get(f"{API}/models/demo/retained-mass", params={"text_id": "copy-0"}).json()
    assert body["buckets"] == [4, 16, None]
    mass = torch.tensor(body["mass"])
    assert mass.shape == (2, 2, 3)
    assert torch.all(mass[..., 1:] >= mass[..., :-1] - 1e-6)  # more keys keep more mass
    assert torch.allclose(mass[..., -1], torch.ones(2, 2), atol=1e-5)  # full keeps everything
    averaged = client.get(f"{API}/models/demo/retained-mass").json()
    assert torch.tensor(averaged["mass"]).shape == (2, 2, 3)


def test_retained_mass_on_a_posted_text_is_about_that_text(client):
    """Issue 23: the curve and τ on the attention page are computed on the text being shown."""
    a = client.post(f"{API}/models/demo/retained-mass", json={"text": "abcabcabc " * 20}).json()
    b = client.post(f"{API}/models/demo/retained-mass", json={"text": "the cat sat on the mat. " * 8}).json()
    ma, mb = torch.tensor(a["mass"]), torch.tensor(b["mass"])
    assert a["buckets"] == [4, 16, None] and ma.shape == mb.shape == (2, 2, 3)
    assert torch.allclose(ma[..., -1], torch.ones(2, 2), atol=1e-5) and not torch.allclose(ma, mb)
    shown = client.post(f"{API}/models/demo/attention", json={"layer": 0, "head": 0, "text": "x" * 500,
                                                               "offset": 10_000}).json()  # clipped to the end
    end = client.post(f"{API}/models/demo/retained-mass", json={"text": "x" * 500, "offset": 10_000}).json()
    at = client.post(f"{API}/models/demo/retained-mass", json={"text": "x" * 500, "offset": shown["offset"]}).json()
    assert end == at  # the same span as the heatmap shows
    assert client.post(f"{API}/models/demo/retained-mass", json={"text": ""}).status_code == 422


def test_sensitivity_sweep(client):
    body = client.get(f"{API}/models/demo/sensitivity", params={"eval_set": "text"}).json()
    assert body["buckets"] == [4, 16, None]
    delta = body["delta"]
    assert len(delta) == 2 and len(delta[0]) == 2 and len(delta[0][0]) == 3
    assert delta[0][0][0] == 0.0 and delta[1][0][1] == 0.0 and delta[0][1][2] == 0.0  # own windows
    edited = client.post(f"{API}/models/demo/evaluate", json={"windows": [[4, None], [4, 8]], "eval_set": "text"})
    assert delta[1][0][0] == pytest.approx(edited.json()["delta"], abs=1e-6)


def test_the_sweeps_pick_is_checked_on_a_held_out_set(client):
    """Issue 23: the head the sweep singles out (picked on eval_set) is scored on a held-out set too."""
    body = client.get(f"{API}/models/demo/sensitivity", params={"eval_set": "text"}).json()
    assert body["eval_set"] == "text" and body["held_out"] == "english"
    cells = [(d[0], layer, head) for layer, row in enumerate(body["delta"]) for head, d in enumerate(row)]
    worst = max(cells)
    pick = body["pick"]
    if worst[0] <= 0:
        assert pick is None
        return
    assert (pick["layer"], pick["head"], pick["window"]) == (worst[1], worst[2], 4) and pick["delta"] == worst[0]
    plan = [list(r) for r in TINY_PLAN]
    plan[pick["layer"]][pick["head"]] = 4
    held = client.post(f"{API}/models/demo/evaluate", json={"windows": plan, "eval_set": "english"}).json()
    assert pick["held_out_delta"] == pytest.approx(held["delta"], abs=1e-6)
    # both numbers, as the allocator gives them: the edited plan's held-out loss and the own plan's
    assert pick["held_out_loss"] == pytest.approx(held["loss"], abs=1e-6)
    assert pick["held_out_baseline_loss"] == pytest.approx(held["baseline_loss"], abs=1e-6)


def test_allocate_under_a_budget(client):
    r = client.post(f"{API}/models/demo/allocate", json={"budget": 0.5, "eval_set": "text"})
    body = r.json()
    assert r.status_code == 200 and body["causal_coverage"] <= 0.5 + 1e-9
    assert body["curve"][0]["causal_coverage"] == 1.0  # the walk starts from the full plan
    assert body["baseline_loss"] == client.post(f"{API}/models/demo/evaluate",
                                                json={"windows": TINY_PLAN, "eval_set": "text"}).json()["loss"]
    again = client.post(f"{API}/models/demo/evaluate", json={"windows": body["windows"], "eval_set": "text"}).json()
    assert again["loss"] == pytest.approx(body["loss"], abs=1e-6)
    acr = client.post(f"{API}/models/demo/allocate", json={"budget": 0.3, "metric": "acr", "eval_set": "text"})
    assert acr.status_code == 200 and acr.json()["acr"] <= 0.3 + 1e-9


def test_allocate_scores_its_choice_on_a_held_out_set(client):
    """Issue 23: the plan is chosen on eval_set and also scored on a set it was not chosen on."""
    body = client.post(f"{API}/models/demo/allocate", json={"budget": 0.5, "eval_set": "text"}).json()
    assert body["eval_set"] == "text" and body["held_out"] == "english"  # the default: no shared sequence
    held = client.post(f"{API}/models/demo/evaluate", json={"windows": body["windows"], "eval_set": "english"}).json()
    assert body["held_out_loss"] == pytest.approx(held["loss"], abs=1e-6)
    assert body["held_out_baseline_loss"] == pytest.approx(held["baseline_loss"], abs=1e-6)
    other = client.post(f"{API}/models/demo/allocate", json={"budget": 0.5, "eval_set": "english"}).json()
    assert other["held_out"] == "text"
    same = client.post(f"{API}/models/demo/allocate", json={"budget": 0.5, "eval_set": "text", "held_out": "text"})
    assert same.status_code == 422 and "held_out must differ" in str(same.json()["detail"])


@pytest.mark.parametrize("body", [{"budget": 0}, {"budget": 1.5}, {"budget": 0.5, "metric": "flops"}, {}])
def test_allocate_validation(client, body):
    assert client.post(f"{API}/models/demo/allocate", json=body).status_code == 422


def test_concurrent_evaluations_heatmaps_and_sweeps_agree_with_sequential_ones(client):
    """The evaluator is stateful (prefix cache): concurrent requests must not mix their plans."""
    from concurrent.futures import ThreadPoolExecutor

    plans = [[[w1, None], [16, w2]] for w1 in (1, 2, 3) for w2 in (2, 5, 7)]
    body = lambda plan: {"windows": plan, "eval_set": "copy"}  # noqa: E731

    def evaluate(plan):
        return client.post(f"{API}/models/demo/evaluate", json=body(plan)).json()["loss"]

    def heatmap(head):
        return client.get(f"{API}/models/demo/attention", params={"layer": 1, "head": head, "window": 3}).json()

    with ThreadPoolExecutor(8) as pool:
        losses = list(pool.map(evaluate, plans))
        maps = list(pool.map(heatmap, [0, 1] * 4))
        sweep = pool.submit(client.get, f"{API}/models/demo/sensitivity", params={"eval_set": "copy"})
        assert sweep.result().status_code == 200
    client.app.state.registry.results.clear()
    assert losses == [evaluate(plan) for plan in plans]
    assert maps[:2] == [heatmap(0), heatmap(1)] and maps[2:4] == maps[:2]


def test_every_cost_answer_names_the_kv_heads(client):
    """The dashboard draws KV groups and says when an edit cannot shrink the cache (issue 23)."""
    cost = client.post(f"{API}/models/demo/cost", json={"windows": TINY_PLAN, "context": 8}).json()
    evaluated = client.post(f"{API}/models/demo/evaluate", json={"windows": TINY_PLAN}).json()
    own = client.get(f"{API}/models/demo/windows").json()
    assert evaluated["n_kv_head"] == own["n_kv_head"] == cost["n_kv_head"] >= 1


def test_evaluate_with_sink_tokens_is_the_engine_loss_and_counts_the_sinks(client, tiny_demo):
    from aah_core.inference.cost import ModelShape, plan_cost
    from aah_core.windows import coverage_metrics

    assert client.get(f"{API}/models/demo").json()["sinks"] == 0  # the model's own count
    windows, plan = [[4, 4], [4, 1]], torch.tensor([[4, 4], [4, 1]])
    ckpt = load_checkpoint(tiny_demo)
    batch = make_eval_batch(ckpt.config, "text", n_seq=4)
    plain = client.post(f"{API}/models/demo/evaluate", json={"windows": windows, "eval_set": "text"}).json()
    sunk = client.post(f"{API}/models/demo/evaluate",
                       json={"windows": windows, "eval_set": "text", "sinks": 3}).json()
    assert plain["sinks"] == 0 and sunk["sinks"] == 3 and not sunk["cached"]  # another cache entry than sinks 0
    ckpt.model.eval()
    with torch.no_grad():  # the same model run with 3 sinks by the engine
        final = ckpt.model.run_layers(ckpt.model.embed(batch.idx), plan, sinks=3)
        losses = ckpt.model.token_losses(final, batch.targets)
    expected = float(losses.sum() / (batch.targets >= 0).sum())
    assert sunk["loss"] == pytest.approx(expected, abs=1e-6) and sunk["loss"] != plain["loss"]
    assert sunk["baseline_loss"] == plain["baseline_loss"]  # the baseline is the model as trained
    assert {k: sunk[k] for k in ("acr", "causal_coverage", "tile_coverage")} == coverage_metrics(plan, 64, 3)
    assert sunk["kv_bytes"] == plan_cost(plan, 64, ModelShape(**{**ModelShape.of(ckpt.model).__dict__,
                                                                  "sinks": 3})).kv_bytes > plain["kv_bytes"]
    # the plain plan after a sinks request is evaluated afresh (the prefix cache knows the sinks changed)
    again = client.post(f"{API}/models/demo/evaluate", json={"windows": [[4, 4], [4, 2]], "eval_set": "text"}).json()
    with torch.no_grad():
        expected_plain = evaluate_loss(ckpt.model, batch, torch.tensor([[4, 4], [4, 2]]))
    assert again["loss"] == pytest.approx(expected_plain, abs=1e-6)


@pytest.mark.parametrize("sinks, status, message", [(-1, 422, "greater than or equal to 0"),
                                                    (65, 422, "more than the model's seq_len=64"),
                                                    ("4", 422, "integer"), (1.5, 422, "integer"),
                                                    (True, 422, "integer")])
def test_evaluate_refuses_bad_sink_counts_with_a_json_detail(client, sinks, status, message):
    r = client.post(f"{API}/models/demo/evaluate", json={"windows": TINY_PLAN, "sinks": sinks})
    assert r.status_code == status
    assert message in str(r.json()["detail"])
