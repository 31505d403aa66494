"""A rounded plan as a Hugging Face config: which families can say it, and the config.json that does.

transformers (checked against 5.23's configuration and modeling code) reads windows per family:

- Qwen2 / Qwen3: `layer_types` ("full_attention" / "sliding_attention") with one `sliding_window`; the
  older fields `use_sliding_window` (False makes `sliding_window` None) and `max_window_layers` (layers
  >= it slide when `layer_types` is absent) are written to agree.
- Gemma 3 text: `layer_types` with one `sliding_window`. Its rotary embedding is chosen by layer type
  (`rope_parameters[layer_type]`), so a layer may change type only when both types' RoPE agree.
- Mistral: one `sliding_window` for every layer and no `layer_types` (MistralModel builds one mask for
  all layers): only plans whose layers all slide with w, or are all full.

`sliding_window = w` lets query i see keys i - w < j <= i (transformers' masking_utils; the test
tests/hf/test_hf_adapter.py checks it against the installed version), which is our window w.
"""

from __future__ import annotations

from typing import Any

from aah_core.errors import ExportRefused

LAYER_TYPE_FAMILIES = {"qwen2", "qwen3", "gemma3_text"}
QWEN_FIELDS = {"qwen2", "qwen3"}  # also read use_sliding_window and max_window_layers
ONE_WINDOW_FAMILIES = {"mistral"}
SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(windows: list[int], seq_len: int) -> list[str]:
    """Per layer: full when its window covers the evaluation context, else sliding."""
    return [FULL if w >= seq_len else SLIDING for w in windows]


def _check_rope(config: Any, types: list[str]) -> None:
    """Gemma 3: refuse a type change when the two types' rotary embeddings differ."""
    rope = getattr(config, "rope_parameters", None)
    native = list(getattr(config, "layer_types", None) or [])
    if not isinstance(rope, dict) or SLIDING not in rope or FULL not in rope or rope[SLIDING] == rope[FULL]:
        return
    changed = [i for i, (a, b) in enumerate(zip(native, types, strict=True)) if a != b]
    if changed:
        raise ExportRefused(
            f"{config.model_type}: a layer's attention type also picks its rotary embedding "
            f"(sliding {rope[SLIDING]} vs full {rope[FULL]}), so changing layers {changed} would change the model, "
            f"not only its windows; round a plan that keeps the native layer types {native}")


def caveats(config_json: dict[str, Any], types: list[str]) -> list[str]:
    """What a reader of an exported config may get wrong (said in the export's README)."""
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    if config_json.get("model_type") in QWEN_FIELDS and sliding and sliding != list(range(sliding[0], len(types))):
        return [(f"`max_window_layers` ({sliding[0]}) can only say \"layers from here on slide\"; the sliding layers "
                 f"{sliding} are not the last ones, so only readers of `layer_types` (transformers 5.23, against "
                 f"which this export is tested) see this plan exactly")]
    return []


def serving_config(config_json: dict[str, Any], config: Any, windows: list[int], window: int | None,
                   seq_len: int) -> dict[str, Any]:
    """config.json for the rounded plan: `windows` is each layer's window (>= seq_len: full), `window` the
    one sliding window (None when no layer slides). `config` is transformers' reading of config_json."""
    family = str(config.model_type)
    types = layer_types(windows, seq_len)
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    out = dict(config_json)
    if family in ONE_WINDOW_FAMILIES:
        if sliding and len(sliding) < len(types):
            raise ExportRefused(
                f"{family}: its config has one sliding_window for every layer and no layer_types, so it cannot "
                f"express full layers beside sliding ones (layers {sliding} slide); round a plan whose layers "
                f"all slide, or all are full")
        out["sliding_window"] = window if sliding else None
        return out
    if family not in LAYER_TYPE_FAMILIES:
        raise ExportRefused(
            f"{family}: transformers reads no per-layer attention types (layer_types) for this family, so its "
            f"config.json cannot say which layers slide; export is possible for "
            f"{', '.join(sorted(LAYER_TYPE_FAMILIES | ONE_WINDOW_FAMILIES))}")
    _check_rope(config, types)
    out["layer_types"] = types
    if sliding:  # else the source's value stays: unused, but Gemma 3 builds its sliding mask regardless
        out["sliding_window"] = window
    if family in QWEN_FIELDS:
        out["use_sliding_window"] = bool(sliding)
        # layers >= max_window_layers slide in configs without layer_types (exact when the sliding layers
        # are the last ones; layer_types, written above, is what transformers 5 reads)
        out["max_window_layers"] = sliding[0] if sliding else len(types)
    return out
