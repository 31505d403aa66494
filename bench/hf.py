"""Hugging Face adapter benchmark: a GPT-2-small-shaped model (124 M parameters, random weights,
built here, saved as a local safetensors folder) at T=1024, through the service's path
(aah_core.model_files.open_model -> HFWindowedLM -> PrefixCachedEvaluator):

- full evaluation: every layer under a plan, then logits and the loss;
- a one-head edit of the last layer with prefix caching (layers before it reused), p50 over
  several heads, which is what a live edit in the window editor costs;
- float32 and bfloat16; batch = the service's fixed evaluation batch (4 sequences) and 1 sequence;
- the bfloat16 / float32 speed of a product of the model's width here (what the service's dtype
  choice measures, aah_core/hf/precision.py) and the load average before and after (a shared box).

    python -m bench.hf [--quick] [--dtypes bfloat16] [--batches 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.data import EvalBatch
from aah_core.hf.precision import bf16_speedup
from bench.common import percentiles, write_result

T = 1024


def build_folder(folder: Path) -> int:
    """GPT2Config() defaults (12 layers, 12 heads, 768 wide, vocab 50257, 1024 positions), random
    weights, plus a small byte-level BPE tokenizer.json; returns the parameter count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    from aah_core.data import ENGLISH_TEXT

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    model.save_pretrained(str(folder), safe_serialization=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([ENGLISH_TEXT.read_text()], trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(folder / "tokenizer.json"))
    return sum(p.numel() for p in model.parameters())


def bench_dtype(folder: Path, dtype: str, batch: int, edits: int, full_runs: int) -> dict:
    from aah_core.hf import open_hf_model

    t0 = time.perf_counter()
    model = open_hf_model(folder, seq_len=T, dtype=dtype)
    load_s = time.perf_counter() - t0
    ids = torch.randint(0, 1000, (batch, T + 1), generator=torch.Generator().manual_seed(0))
    data = EvalBatch(ids[:, :-1], ids[:, 1:], ["text"] * batch)
    plan = model.plan.clone()
    full_ms = []
    for _ in range(full_runs):  # a fresh evaluator: nothing cached, every layer runs
        ev = PrefixCachedEvaluator(model, data)
        t = time.perf_counter()
        ev.loss(plan)
        full_ms.append((time.perf_counter() - t) * 1000)
    ev = PrefixCachedEvaluator(model, data)
    ev.loss(plan)
    last = model.n_layer - 1
    edit_ms = []
    for i in range(edits):  # one head of the last layer to a new window each time
        edited = plan.clone()
        edited[last, i % model.n_head] = 2 ** (4 + i % 6)
        t = time.perf_counter()
        ev.loss(edited)
        edit_ms.append((time.perf_counter() - t) * 1000)
        assert ev.layers_recomputed == 1
    return {"dtype": dtype, "batch": batch, "load_s": load_s, "full_eval_ms": percentiles(full_ms),
            "last_layer_one_head_edit_ms": percentiles(edit_ms)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[4, 1], help="sequences per evaluation")
    args = parser.parse_args()
    full_runs, edits = (1, 3) if args.quick else (3, 7)
    load_at_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="aah-bench-hf-") as tmp:
        folder = Path(tmp) / "gpt2-small-random"
        n_params = build_folder(folder)
        for dtype in args.dtypes:
            for batch in args.batches:
                row = bench_dtype(folder, dtype, batch, edits, full_runs)
                rows.append(row)
                print(f"{dtype:9s} batch {batch}: full eval p50 {row['full_eval_ms']['p50']:8.0f} ms, "
                      f"one-head edit (last layer) p50 {row['last_layer_one_head_edit_ms']['p50']:7.0f} ms "
                      f"p95 {row['last_layer_one_head_edit_ms']['p95']:7.0f} ms", flush=True)
    path = write_result("hf", {"model": "GPT-2-small shape, random weights", "n_params": n_params, "T": T,
                               "threads": torch.get_num_threads(), "quick": args.quick,
                               "target_edit_p50_ms": 1500, "target_full_eval_ms": 6000, "rows": rows,
                               "bf16_speedup": bf16_speedup(768),
                               # a shared machine: the load says how much the numbers can be trusted
                               "load_average_1m_at_start": load_at_start,
                               "load_average_1m_at_end": os.getloadavg()[0]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
