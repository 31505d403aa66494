"""Engine benchmark: training tokens/s and eval latency, all-full vs a mixed plan, and the
latency of re-evaluating after a one-head edit of the last layer (prefix cache).

    python -m bench.engine [--quick]

Ratios are taken within one run, with the two plans interleaved (noisy shared machine).
"""

from __future__ import annotations

import argparse

import torch

from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.config import apply_overrides
from aah_core.data import DataStream
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.windows import causal_coverage
from bench.common import percentiles, time_ms, write_result


def mixed_plan(n_layer: int, n_head: int, T: int) -> torch.Tensor:
    """Per layer: windows T/64, T/32, T/8 and full (repeated over heads): causal_coverage ~0.33."""
    pattern = [T // 64, T // 32, T // 8, T]
    return torch.tensor([[pattern[h % 4] for h in range(n_head)] for _ in range(n_layer)])


def bench_seq_len(T: int, runs: int) -> dict:
    config = apply_overrides(get_preset("demo"), {"model.seq_len": T})
    torch.manual_seed(0)
    model = WindowedGPT(config.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B = 32 if T == 256 else 8
    x = torch.randint(0, 256, (B, T))
    plans = {"full": torch.full((4, 4), T), "mixed": mixed_plan(4, 4, T)}

    def train_step(plan):
        model.set_plan(plan)
        _, loss = model(x, x.roll(-1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def eval_step(plan):
        with torch.no_grad():
            model(x[:4], plan=plan)

    out = {"T": T, "batch": B, "mixed_causal_coverage": causal_coverage(plans["mixed"], T)}
    for name in plans:
        out[f"train_ms_{name}"], out[f"eval4_ms_{name}"] = [], []
    for _ in range(runs):  # interleave the plans so drift hits both alike
        for name, plan in plans.items():
            out[f"train_ms_{name}"].append(time_ms(lambda plan=plan: train_step(plan), runs=1, warmup=1)["median"])
            out[f"eval4_ms_{name}"].append(time_ms(lambda plan=plan: eval_step(plan), runs=3, warmup=1)["median"])
    for key in [k for k in out if k.endswith(("_full", "_mixed"))]:
        out[key] = sorted(out[key])[len(out[key]) // 2]
    out["train_tokens_per_s_full"] = B * T / out["train_ms_full"] * 1000
    out["train_tokens_per_s_mixed"] = B * T / out["train_ms_mixed"] * 1000
    out["train_speedup_mixed_vs_full"] = out["train_ms_full"] / out["train_ms_mixed"]
    out["eval_speedup_mixed_vs_full"] = out["eval4_ms_full"] / out["eval4_ms_mixed"]
    return out


def bench_edit_latency(n_edits: int) -> dict:
    """p50 latency of re-evaluating a 4x256 batch after editing one head of the last layer."""
    config = get_preset("demo")
    model = WindowedGPT(config.model).eval()
    batch = DataStream(config.data, 256).eval_batch("mixed", 4)
    evaluator = PrefixCachedEvaluator(model, batch)
    base = torch.full((4, 4), 256)
    evaluator.loss(base)
    cached, uncached = [], []
    windows = [4, 8, 16, 32, 64, 128, 256]
    for i in range(n_edits):
        plan = base.clone()
        plan[3, i % 4] = windows[i % len(windows)]
        cached.append(time_ms(lambda plan=plan: evaluator.loss(plan), runs=1, warmup=0)["median"])
        evaluator.loss(base)
        fresh = PrefixCachedEvaluator(model, batch)
        uncached.append(time_ms(lambda fresh=fresh, plan=plan: fresh.loss(plan), runs=1, warmup=0)["median"])
    return {"edit_last_layer_cached_ms": percentiles(cached), "edit_full_recompute_ms": percentiles(uncached)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    runs = 3 if args.quick else 9
    rows = [bench_seq_len(T, runs) for T in (256, 1024)]
    edits = bench_edit_latency(10 if args.quick else 40)
    print(f"{'T':>5} {'cov':>5} {'train full ms':>14} {'train mixed ms':>15} {'speedup':>8} "
          f"{'eval full':>10} {'eval mixed':>11} {'speedup':>8}")
    for r in rows:
        print(f"{r['T']:>5} {r['mixed_causal_coverage']:>5.2f} {r['train_ms_full']:>14.1f} {r['train_ms_mixed']:>15.1f} "
              f"{r['train_speedup_mixed_vs_full']:>8.2f} {r['eval4_ms_full']:>10.1f} {r['eval4_ms_mixed']:>11.1f} "
              f"{r['eval_speedup_mixed_vs_full']:>8.2f}")
    e = edits["edit_last_layer_cached_ms"]
    print(f"one-head edit of the last layer, 4x256, prefix-cached: p50 {e['p50']:.1f} ms, p95 {e['p95']:.1f} ms "
          f"(full recompute p50 {edits['edit_full_recompute_ms']['p50']:.1f} ms)")
    path = write_result("engine", {"threads": 2, "runs": runs, "seq_lens": rows, **edits})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
