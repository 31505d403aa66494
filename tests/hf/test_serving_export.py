"""Exported Hugging Face folders (tiny random Qwen3, Gemma 3 text, Mistral): transformers loads them, and
their logits equal transformers' own forward with that layer_types / sliding_window and our engine under
the rounded plan (float32, 1e-4). Families whose config cannot say the plan are refused with the reason."""

from __future__ import annotations

import io
import json
import os
import zipfile

import pytest
import torch

from aah_core.analysis.evaluate import PrefixCachedEvaluator, evaluate_loss
from aah_core.errors import ExportRefused
from aah_core.hf import open_hf_model
from aah_core.inference.cost import ModelShape
from aah_core.inference.export import EVAL_SEQS, export_plan
from aah_core.inference.serving import candidates, round_plan
from aah_core.model_files import open_model
from tests.hf.tiny import own_forward_model

T = 24
N = None  # full
# per family: a per-head plan, and what rounding it `up` to the transformers grain gives by hand
CASES = {
    # layer maxima 4, full, 8, 5 (2 kv heads): w=4 -> 2x(4+24+24+24) = 152 entries, w=5 -> 116,
    # w=8 -> 96 (layers 0, 2, 3 slide), w=16 -> 144: w=8
    "qwen3": ([[2, 4, 1, 3], [N] * 4, [8, 2, 2, 2], [5] * 4], 8, [True, False, True, True]),
    # maxima 4, 3, full: w=3 -> layer 1 slides (2x(24+3+24) = 102), w=4 -> layers 0, 1 (2x(4+4+24) = 64)
    "gemma3": ([[2, 3, 4, 1], [3] * 4, [N] * 4], 4, [True, True, False]),
    # maxima 4, 5 (1 kv head): w=5 -> both slide (10 entries), w=8 -> 16: w=5
    "mistral": ([[3, 1, 2, 4], [5, 5, 2, 1]], 5, [True, True]),
}


def _theirs(folder, window: int | None, sliding: list[bool]):
    """transformers' own model from the original folder, its config set to the rounded layer types here."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if config.model_type == "mistral":
        config.sliding_window = window
    else:
        config.layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
        config.sliding_window = window or config.sliding_window  # Gemma 3 needs one even with no sliding layer
    return AutoModelForCausalLM.from_pretrained(str(folder), config=config, local_files_only=True,
                                                attn_implementation="eager", dtype=torch.float32).eval()


@pytest.mark.parametrize("family", sorted(CASES))
def test_exported_folder_loads_and_matches_transformers_and_our_engine(hf_root, tmp_path, family):
    plan, window, sliding = CASES[family]
    out = export_plan(hf_root / family, plan, "transformers", "up", tmp_path / "export", seq_len=T)
    config = json.loads((out / "config.json").read_text())
    assert config["sliding_window"] == window
    if family != "mistral":
        assert config["layer_types"] == ["sliding_attention" if s else "full_attention" for s in sliding]
    # weights linked, not re-saved; tokenizer and README beside them
    assert os.stat(out / "model.safetensors").st_ino == os.stat(hf_root / family / "model.safetensors").st_ino
    assert (out / "tokenizer.json").is_file()
    readme = (out / "README.md").read_text()
    assert "Loss on the `mixed` evaluation batch" in readme and f"w={window}" in readme
    # Qwen3's sliding layers 0, 2, 3 are not a suffix: max_window_layers cannot say it, and the README warns
    assert ("Caveat: `max_window_layers`" in readme) == (family == "qwen3")

    idx = torch.randint(0, 300, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exported = own_forward_model(out, "eager")(idx).logits
        theirs = _theirs(hf_root / family, window, sliding)(idx).logits
    ours_model = open_hf_model(hf_root / family, seq_len=T, dtype="float32")
    rounded = torch.tensor([[window if s else T] * ours_model.n_head for s in sliding])
    ours = ours_model.logits(ours_model.run_layers(ours_model.embed(idx), rounded))
    torch.testing.assert_close(exported, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(exported, ours, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # the windows do cut at T, so the comparisons test the masks
        full = _theirs(hf_root / family, None, [False] * len(sliding))(idx).logits
    assert (full - exported).abs().max() > 1e-3


def test_a_family_without_layer_types_is_refused_with_the_reason(hf_root, tmp_path):
    with pytest.raises(ExportRefused, match="llama: transformers reads no per-layer attention types"):
        export_plan(hf_root / "llama", [[2, 2, 2, 2], [N] * 4], "transformers", "up", tmp_path / "x", seq_len=T)
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


def test_mistral_refuses_full_layers_beside_sliding_ones(hf_root, tmp_path):
    with pytest.raises(ExportRefused, match="one sliding_window for every layer"):
        export_plan(hf_root / "mistral", [[2, 2, 2, 2], [N] * 4], "transformers", "up", tmp_path / "x", seq_len=T)


def test_budget_on_a_gqa_model_picks_the_lowest_loss_of_all_candidates(hf_root):
    """Qwen3 here: 4 query heads on 2 kv heads; every candidate evaluated independently of the choice."""
    opened = open_model(hf_root / "qwen3", seq_len=T)
    model, batch = opened.model, opened.stream.eval_batch("mixed", EVAL_SEQS)
    plan = torch.tensor([[2, 8, 1, 4], [T, 2, 4, 4], [8, 8, 2, 1], [1, 1, 16, 2]])
    shape = ModelShape.of(model)
    for grain in ("kv_group", "layer", "transformers"):
        rounding = round_plan(plan, shape, grain, "budget", model.buckets, PrefixCachedEvaluator(model, batch).loss)
        found = candidates(plan, shape, grain, "budget", model.buckets)
        losses = [evaluate_loss(model, batch, c.plan) for c in found]
        assert len(found) > 1, grain
        assert evaluate_loss(model, batch, rounding.plan) == pytest.approx(min(losses), abs=1e-6), grain
        assert rounding.chosen.kv_bytes <= rounding.kv_bytes_plan


def test_the_service_exports_a_registered_qwen3_as_a_zip_transformers_loads(hf_root, tmp_path):
    from fastapi.testclient import TestClient

    from backend.app import create_app
    from backend.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", model_dirs=str(hf_root), api_token="t", seed_demo=False,
                        seed_paper=False, seed_suite=False, preload_models=False)
    auth = {"Authorization": "Bearer t"}
    plan, window, _ = CASES["qwen3"]
    with TestClient(create_app(settings)) as client:
        model = client.post("/api/v1/models", json={"path": str(hf_root / "qwen3"), "seq_len": T}, headers=auth)
        model_id = model.json()["id"]
        body = {"windows": plan, "granularity": "transformers"}
        rounded = client.post(f"/api/v1/models/{model_id}/round", json=body, headers=auth).json()
        assert rounded["window"] == window
        r = client.post(f"/api/v1/models/{model_id}/export", json=body, headers=auth)
        assert r.status_code == 200, r.text
        refused = client.post(f"/api/v1/models/{model_id}/export", json={**body, "granularity": "layer"},
                              headers=auth)
        assert refused.status_code == 422 and "granularity 'transformers'" in refused.json()["detail"]
    folder = tmp_path / "unzipped"
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        z.extractall(folder)
    (exported,) = folder.iterdir()
    config = json.loads((exported / "config.json").read_text())
    assert config["layer_types"] == ["full_attention" if w is None else "sliding_attention"
                                     for w in (row[0] for row in rounded["windows"])]
    idx = torch.randint(0, 300, (1, T), generator=torch.Generator().manual_seed(1))
    ours = open_hf_model(hf_root / "qwen3", seq_len=T, dtype="float32")
    rounded_plan = torch.tensor([[T if w is None else w for w in row] for row in rounded["windows"]])
    with torch.no_grad():
        torch.testing.assert_close(own_forward_model(exported, "eager")(idx).logits,
                                   ours.logits(ours.run_layers(ours.embed(idx), rounded_plan)), rtol=1e-4, atol=1e-4)


def test_gemma3_refuses_a_layer_type_change_when_the_types_rope_differ():
    """Gemma 3 picks a layer's rotary embedding by its type: with different RoPE bases per type, turning
    the full layer 1 into a sliding one would change the model, so the export says so."""
    from aah_core.hf.export import serving_config
    from tests.hf.tiny import make_config

    config = make_config("gemma3")
    config.rope_parameters["full_attention"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    native = [4, T, 4]  # sliding, full, sliding: the native types
    assert serving_config(config.to_dict(), config, native, 4, T)["layer_types"] == config.layer_types
    with pytest.raises(ExportRefused, match=r"changing layers \[1\] would change the model"):
        serving_config(config.to_dict(), config, [4, 4, 4], 4, T)
