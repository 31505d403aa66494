"""From a plan to a served model: a rounded plan written as a folder that serving engines load.

- A Hugging Face folder (granularity `transformers`): config.json with the rounded `layer_types` and
  `sliding_window` (aah_core/hf/export.py says which families can), the weights hard-linked (copied
  across file systems; never re-saved), the tokenizer files and a README.md.
- An AAH Studio checkpoint (the demo's family, any granularity): its config and weights with the rounded
  plan as plan.json; for `layer` and `transformers` also serving.json, one window per layer (for engines
  that take per-layer windows: vLLM, TensorRT-LLM).

The folder is written beside `out` and renamed into place, so a failed export leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aah_core.errors import AAHError, ExportRefused
from aah_core.inference.cost import ModelShape, plan_cost
from aah_core.inference.serving import Rounding, round_plan
from aah_core.model_files import AAH_FAMILY, describe_model, open_model
from aah_core.windows import encode_window, plan_to_json, validate_plan, window_label

EVAL_SEQS = 4  # the evaluation batch the service uses (backend registry), so losses agree
WEIGHTS = ("*.safetensors", "*.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "generation_config.json", "chat_template.jinja")
SERVING_FORMAT = "aah-studio/serving-v1"


@dataclass(frozen=True)
class ExportFacts:
    """What the README reports beside the plan."""

    loss: float  # the rounded plan's, on the evaluation batch
    plan_loss: float  # the per-head plan's
    eval_set: str
    how: str  # the command or request that made the export


def _link(src: Path, dst: Path) -> None:
    """Hard-link a file (the bytes are not touched); copy when linking is impossible (another file system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _layer_windows(plan: torch.Tensor, seq_len: int) -> list[int | None]:
    """One window per layer (each layer's heads share it at these grains), full as None."""
    return [encode_window(int(row.max()), seq_len) for row in plan]


def _readme(name: str, family: str, rounding: Rounding, shape: ModelShape, facts: ExportFacts,
            notes: list[str]) -> str:
    T = shape.seq_len
    cost = plan_cost(rounding.plan, T, shape)
    rows = "\n".join(f"| {layer} | {', '.join(window_label(w) for w in row)} |"
                     for layer, row in enumerate(plan_to_json(rounding.plan, T)))
    load = ('```python\nfrom transformers import AutoModelForCausalLM\n\n'
            f'model = AutoModelForCausalLM.from_pretrained("{name}")\n```' if family != AAH_FAMILY
            else f"```\naah eval {name}\n```\n\nor register the folder with the studio (its plan is plan.json).")
    sinks_note = (f", and every head also the first {shape.sinks} keys (sink tokens: j < {shape.sinks}, the "
                  "KV figures count them; transformers' `sliding_window` has no sinks)") if shape.sinks else ""
    return f"""# {name}: a window plan rounded to `{rounding.granularity}`

Made by AAH Studio ({facts.how}) from a per-head window plan.

- Rounding: {rounding.note}
- Loss on the `{facts.eval_set}` evaluation batch: {facts.loss:.6f} (per-head plan: {facts.plan_loss:.6f};
  delta {facts.loss - facts.plan_loss:+.6f}).
- KV cache at {T} tokens, one sequence: {cost.kv_bytes:,} bytes = {100 * cost.kv_ratio:.1f} % of full
  attention ({cost.kv_bytes_full:,}); the per-head plan: {rounding.kv_bytes_plan:,} bytes.
- Windows: query i attends keys j with i - w < j <= i (transformers' `sliding_window = w`){sinks_note}.

| layer | window per head |
|---|---|
{rows}
{"".join(f"{chr(10)}Caveat: {n}.{chr(10)}" for n in notes)}
## Load

{load}
"""


def _write_hf(source: Path, tmp: Path, rounding: Rounding, shape: ModelShape) -> list[str]:
    """The Hugging Face folder; returns the config's caveats for the README."""
    from aah_core.hf import read_hf_config
    from aah_core.hf.export import caveats, layer_types, serving_config

    if rounding.granularity != "transformers":
        raise ExportRefused(f"a Hugging Face folder is exported at granularity 'transformers' (its config holds one "
                       f"sliding window for the model); got {rounding.granularity!r}")
    config_json = json.loads((source / "config.json").read_text())
    windows = [int(row.max()) for row in rounding.plan]
    config = serving_config(config_json, read_hf_config(source), windows, rounding.chosen.window, shape.seq_len)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for pattern in WEIGHTS:
        for file in sorted(source.glob(pattern)):
            _link(file, tmp / file.name)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tmp / name)
    return caveats(config_json, layer_types(windows, shape.seq_len))


def _write_aah(source: Path, tmp: Path, rounding: Rounding, shape: ModelShape) -> list[str]:
    T = shape.seq_len
    shutil.copy2(source / "config.json", tmp / "config.json")
    _link(source / "model.safetensors", tmp / "model.safetensors")
    plan_doc = {"seq_len": T, "windows": plan_to_json(rounding.plan, T), "controller": {}}
    (tmp / "plan.json").write_text(json.dumps(plan_doc))
    if rounding.granularity in ("layer", "transformers"):
        serving = {"format": SERVING_FORMAT, "granularity": rounding.granularity, "seq_len": T,
                   "layer_windows": _layer_windows(rounding.plan, T), "note": rounding.note,
                   **({"sinks": shape.sinks} if shape.sinks else {})}  # sink tokens beside each window
        (tmp / "serving.json").write_text(json.dumps(serving, indent=2))
    return []


def write_export(source: Path, family: str, rounding: Rounding, shape: ModelShape, out: Path,
                 facts: ExportFacts) -> Path:
    """Write the rounded plan of the model folder `source` (family "aah" or a Hugging Face model_type) as a
    new folder `out`, which must not exist yet. Raises AAHError (ExportRefused) with the reason."""
    out = Path(out)
    if out.exists():
        raise AAHError(f"{out} already exists; export into a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        notes = (_write_aah if family == AAH_FAMILY else _write_hf)(Path(source), tmp, rounding, shape)
        (tmp / "README.md").write_text(_readme(out.name, family, rounding, shape, facts, notes))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_plan(model_path: str | Path, windows: Any, granularity: str, mode: str, out: str | Path,
                eval_set: str = "mixed", seq_len: int | None = None, how: str = "aah export") -> Path:
    """Open a model folder, round `windows` (JSON plan) to the grain, evaluate, and write the export."""
    from aah_core.analysis.evaluate import PrefixCachedEvaluator

    model_path = Path(model_path)
    family = describe_model(model_path, seq_len).family
    opened = open_model(model_path, seq_len)
    model = opened.model
    plan = validate_plan(windows, model.n_layer, model.n_head, model.seq_len)
    evaluator = PrefixCachedEvaluator(model, opened.stream.eval_batch(eval_set, EVAL_SEQS))
    shape = ModelShape.of(model)
    rounding = round_plan(plan, shape, granularity, mode, model.buckets, evaluator.loss)
    facts = ExportFacts(evaluator.loss(rounding.plan), evaluator.loss(plan), eval_set, how)
    return write_export(model_path, family, rounding, shape, Path(out), facts)
