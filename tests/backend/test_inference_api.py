"""Cost of a plan and generation over HTTP: exact figures equal the formula; bad input is a 422."""

from __future__ import annotations

import pytest
import torch

from aah_core.checkpoint import load_checkpoint
from aah_core.inference.generate import generate
from tests.backend.conftest import TINY_PLAN

API = "/api/v1"
HEAD_DIM, T = 16, 64  # the tiny demo: 2 layers x 2 heads, d_model 32, seq_len 64, float32
PER_ENTRY = 2 * HEAD_DIM * 4  # a key and a value


def _windows(plan):
    return [T if w is None else w for row in plan for w in row]


@pytest.mark.parametrize("context", [1, 3, 8, 15, 16, 17, 64])
def test_exact_cost_equals_the_formula(client, context):
    r = client.post(f"{API}/models/demo/cost", json={"windows": TINY_PLAN, "context": context})
    assert r.status_code == 200, r.text
    body = r.json()
    ws = _windows(TINY_PLAN)
    assert body["context"] == context
    assert body["kv_windows"] == [[min(4, context), min(T, context)], [min(16, context), min(8, context)]]
    assert body["kv_entries"] == sum(min(w, context) for w in ws)  # one head, window w: min(w, N) positions
    assert body["kv_bytes"] == body["kv_entries"] * PER_ENTRY
    assert body["kv_bytes_full"] == 4 * context * PER_ENTRY
    pairs = sum(min(w, context) * context - min(w, context) * (min(w, context) - 1) // 2 for w in ws)
    assert body["attention_pairs"] == pairs
    assert body["attention_pairs_full"] == 4 * context * (context + 1) // 2
    assert body["kv_ratio"] == body["kv_bytes"] / body["kv_bytes_full"]
    assert body["measured"] is None


@pytest.mark.parametrize("body", [
    {"windows": TINY_PLAN, "context": 0},
    {"windows": TINY_PLAN, "context": T + 1},
    {"windows": TINY_PLAN, "context": -3},
    {"windows": TINY_PLAN, "context": 2.5},
    {"windows": TINY_PLAN, "context": "8"},
    {"windows": TINY_PLAN, "context": True},
    {"windows": TINY_PLAN},
    {"windows": [[4, None]], "context": 8},
    {"windows": [[0, None], [16, 8]], "context": 8},
    {"windows": [[4, "x"], [16, 8]], "context": 8},
    {"windows": TINY_PLAN, "context": 8, "measured": True},
], ids=["zero", "beyond-seq-len", "negative", "float", "string", "bool", "missing", "shape", "window-0",
        "window-str", "unknown-field"])
def test_a_bad_plan_or_context_is_422(client, body):
    r = client.post(f"{API}/models/demo/cost", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_beyond_seq_len_names_the_limit(client):
    r = client.post(f"{API}/models/demo/cost", json={"windows": TINY_PLAN, "context": T + 1})
    assert "context must be an integer in [1, 64]" in r.json()["detail"]


def test_measured_cost_compares_with_the_full_plan_in_the_same_run(client):
    req = {"windows": TINY_PLAN, "context": 32, "measure": True}
    body = client.post(f"{API}/models/demo/cost", json=req).json()
    m = body["measured"]
    assert m["prefill_ms"] > 0 and m["prefill_ms_full"] > 0 and m["decode_step_ms"] > 0
    assert m["prefill_ratio"] == pytest.approx(m["prefill_ms"] / m["prefill_ms_full"])
    assert m["decode_step_ratio"] == pytest.approx(m["decode_step_ms"] / m["decode_step_ms_full"])
    assert m["tokens_per_s"] == pytest.approx(1000.0 / m["decode_step_ms"])
    assert m["device"] == "cpu" and m["peak_memory_bytes"] is None


def test_evaluate_reports_the_cost_at_the_model_context(client):
    body = client.post(f"{API}/models/demo/evaluate", json={"windows": [[1, None], [16, 8]]}).json()
    assert body["context"] == T
    assert body["kv_bytes"] == (1 + 64 + 16 + 8) * PER_ENTRY
    assert body["kv_bytes_full"] == 4 * T * PER_ENTRY
    assert body["attention_pairs"] / body["attention_pairs_full"] == pytest.approx(body["causal_coverage"])


def test_generate_stops_at_max_new_tokens(client, tiny_demo):
    r = client.post(f"{API}/models/demo/generate", json={"prompt": "The cat", "max_new_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (len(body["tokens"]), body["stop_reason"], body["prompt_tokens"]) == (5, "max_new_tokens", 7)
    ckpt = load_checkpoint(tiny_demo)
    expected = generate(ckpt.model, torch.tensor([list(b"The cat")]), max_new_tokens=5)  # greedy, own plan
    assert body["text"] == ckpt.model.tokenizer.decode(expected.tokens[0].tolist())
    assert body["windows"] == TINY_PLAN
    held = [sum(min(t, w) for w in _windows(TINY_PLAN)) * PER_ENTRY for t in range(7, 12)]
    assert body["cache_bytes"] == held
    assert body["kv_bytes_full"] == 4 * 11 * PER_ENTRY


def test_generate_stops_at_the_context_and_says_so(client):
    prompt = "x" * (T - 3)
    body = client.post(f"{API}/models/demo/generate",
                       json={"prompt": prompt, "max_new_tokens": 50, "windows": [[1, 2], [3, None]]}).json()
    assert (len(body["tokens"]), body["stop_reason"]) == (3, "context")
    assert body["windows"] == [[1, 2], [3, None]]


@pytest.mark.parametrize("body", [
    {"prompt": ""},
    {"prompt": "x" * T},
    {"prompt": "hi", "max_new_tokens": 0},
    {"prompt": "hi", "top_p": 0.0},
    {"prompt": "hi", "temperature": -1},
    {"prompt": "hi", "windows": [[1, 2]]},
], ids=["empty", "fills-context", "zero-tokens", "top-p-0", "negative-temperature", "bad-plan"])
def test_bad_generate_requests_are_422(client, body):
    r = client.post(f"{API}/models/demo/generate", json=body)
    assert r.status_code == 422, r.text


def test_seeded_sampling_repeats_over_http(client):
    req = {"prompt": "ab", "max_new_tokens": 8, "temperature": 1.0, "top_k": 50, "seed": 11}
    first = client.post(f"{API}/models/demo/generate", json=req).json()
    again = client.post(f"{API}/models/demo/generate", json=req).json()
    assert first["tokens"] == again["tokens"]


def test_unknown_model_is_404_for_cost_and_generate(client):
    req = {"windows": TINY_PLAN, "context": 4}
    assert client.post(f"{API}/models/nope/cost", json=req).status_code == 404
    assert client.post(f"{API}/models/nope/generate", json={"prompt": "a"}).status_code == 404


def test_own_windows_carry_the_exact_cost_at_seq_len(client):
    body = client.get(f"{API}/models/demo/windows").json()
    assert body["context"] == T
    assert body["kv_bytes"] == sum(min(w, T) for w in _windows(TINY_PLAN)) * PER_ENTRY
    assert body["attention_pairs_full"] == 4 * T * (T + 1) // 2
