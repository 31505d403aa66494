"""Inference benchmark: what a window plan saves at long context, against the full plan.

    python -m bench.generate [--T 4096] [--batch 1] [--repeats 5] [--device cpu] [--threads N] [--out FILE]

A model of the demo's width and depth (4 layers x 4 heads x 128, RoPE) with seq_len T and
random weights; the plan is bench.engine's mixed plan (per layer windows T/64, T/32, T/8 and
full: causal_coverage ~0.33). Figures, each beside the full plan's:

- KV-cache bytes at context T: exact (aah_core.inference.cost.plan_cost), checked against the bytes the
  decoding cache really holds after T positions;
- prefill time of T tokens, decode-step time at context T (median of the last steps up to T)
  and decode tokens/s, measured by aah_core.inference.cost.measure_cost, the two plans interleaved.

Targets (issue 26, item 2; issue 16's decode target was 0.6x): KV <= 0.35x, decode step <= 0.5x,
prefill <= 0.55x of full, at batch 1 and 8. The result records torch's threads and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from aah_core.config import apply_overrides
from aah_core.inference.cost import ModelShape, measure_cost, plan_cost
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.windows import causal_coverage
from bench.common import write_result
from bench.engine import mixed_plan

TARGETS = {"kv_ratio": 0.35, "decode_step_ratio": 0.5, "prefill_ratio": 0.55}


def held_bytes(model: WindowedGPT, plan: torch.Tensor, T: int) -> int:
    """Bytes the decoding cache holds after a prompt of T-1 tokens and one step (context T)."""
    cache = new_cache(model, plan)
    idx = torch.randint(0, model.vocab_size, (1, T), device=plan.device)
    forward_cached(model, idx[:, : T - 1], cache, plan)
    forward_cached(model, idx[:, T - 1 :], cache, plan)
    return cache.nbytes()


@torch.no_grad()
def run(T: int, batch: int, repeats: int, steps: int, device: str) -> dict:
    config = apply_overrides(get_preset("demo"), {"model.seq_len": T})
    torch.manual_seed(0)
    model = WindowedGPT(config.model).to(device).eval()
    plan = mixed_plan(model.n_layer, model.n_head, T).to(device)
    exact = plan_cost(plan, T, ModelShape.of(model))
    held = held_bytes(model, plan, T)
    if held != exact.kv_bytes:
        raise RuntimeError(f"the cache holds {held} bytes; the exact figure says {exact.kv_bytes}")
    measured = measure_cost(model, plan, T, repeats=repeats, decode_steps=steps, batch=batch)
    ratios = {"kv_ratio": exact.kv_ratio, **measured.ratios()}
    return {
        "T": T, "batch": batch, "repeats": repeats, "decode_steps": steps, "device": device,
        "model": {"n_layer": model.n_layer, "n_head": model.n_head, "d_model": config.model.d_model},
        "plan": plan.tolist(), "causal_coverage": causal_coverage(plan, T),
        "kv_bytes": exact.kv_bytes, "kv_bytes_full": exact.kv_bytes_full, "kv_bytes_held": held,
        "attention_pairs_ratio": exact.pairs_ratio,
        **measured.to_dict(), **ratios,
        "targets": TARGETS, "met": {k: ratios[k] is not None and ratios[k] <= v for k, v in TARGETS.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=4096, help="seq_len and context (default 4096)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="decode batch sizes (default 1 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per repeat (the last up to T)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own, the cores)")
    parser.add_argument("--out", help="result file (default bench/results/generate-<machine>.json)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, load = [], os.getloadavg()
    for batch in args.batch:
        row = run(args.T, batch, args.repeats, args.steps, args.device) | {"threads": torch.get_num_threads()}
        rows.append(row)
        print(f"T={row['T']} batch={batch} causal_coverage={row['causal_coverage']:.3f}  "
              f"KV {row['kv_ratio']:.3f}x ({row['kv_bytes']:,} of {row['kv_bytes_full']:,} bytes)  "
              f"prefill {row['prefill_ms']:.1f} / {row['prefill_ms_full']:.1f} ms = {row['prefill_ratio']:.3f}x  "
              f"decode step {row['decode_step_ms']:.2f} / {row['decode_step_ms_full']:.2f} ms = "
              f"{row['decode_step_ratio']:.3f}x  ({row['tokens_per_s']:.0f} vs {row['tokens_per_s_full']:.0f} "
              f"tokens/s)  met: {row['met']}", flush=True)
    payload = {"bench": "generate", "loadavg_before": load, "loadavg_after": os.getloadavg(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.out}")
    else:
        print(f"wrote {write_result('generate', payload)}")


if __name__ == "__main__":
    main()
