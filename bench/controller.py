"""Controller overhead per training step (`python -m bench.controller [--quick]`).

Trains the demo model (4L x 4H x 128, T=256, batch 32) for a few dozen steps under
`baseline`, `full_adaptive` and `control_off` (the paper's worst case: features and a
re-clustering on every step) and times, inside each step, what the controller adds:
on_step_start (schedule, clustering, scoring, plan) plus the observer that records head
features during the forward. Steps are split into control steps (a decision), armed steps
(the forward records features for the next decision) and cached steps (neither).

The target is <= 3% of step time. For contrast it also times the paper's feature path
(fp32 softmax over every T x T map, entropy and usage per head with a host sync each, §8.13).
Writes bench/results/controller-<machine>.json.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from aah_core.config import apply_overrides
from aah_core.controller import build_controller
from aah_core.controller.features import head_stats
from aah_core.data import DataStream
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from bench.common import machine_slug, time_ms, write_result

PRESETS = ("baseline", "full_adaptive", "control_off")


def run_preset(name: str, steps: int, warmup: int, interval: int, batch: int) -> dict:
    """Train `steps` steps and time the controller's share of each."""
    overrides = {"train.batch_size": batch, "train.seed": 0}
    if get_preset(name).controller.get("mode") == "aah":
        overrides.update({"controller.warmup_steps": warmup, "controller.control_interval": interval})
    cfg = apply_overrides(get_preset(name), overrides)
    torch.manual_seed(0)
    model = WindowedGPT(cfg.model).train()
    ctrl = build_controller(cfg, model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    data = DataStream(cfg.data, cfg.model.seq_len, seed=0)
    observer = getattr(ctrl, "observer", None)
    rows = []
    for step in range(steps):
        x, y = data.train_batch(batch)
        t0 = time.perf_counter()
        ctrl.on_step_start(step)
        t1 = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        obs_ms = 1e3 * observer.seconds if observer is not None else 0.0
        control = ctrl.metrics().get("ctrl/control_step", 0.0) == 1.0
        kind = "control" if control else ("armed" if obs_ms > 0 else "cached")
        rows.append({"step": step, "kind": kind, "step_ms": 1e3 * (t2 - t0), "controller_ms": 1e3 * (t1 - t0) + obs_ms})
    measured = [r for r in rows if r["step"] >= warmup + 1]  # after the controller's warmup
    return {"preset": name, "plan": model.plan.tolist(), "steps": _summarize(measured)}


def _summarize(rows: list[dict]) -> dict:
    out = {}
    for kind in ("control", "armed", "cached", "all"):
        sel = rows if kind == "all" else [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        step = sum(r["step_ms"] for r in sel)
        ctrl = sum(r["controller_ms"] for r in sel)
        out[kind] = {"n": len(sel), "step_ms_median": statistics.median(r["step_ms"] for r in sel),
                     "controller_ms_median": statistics.median(r["controller_ms"] for r in sel),
                     "overhead_fraction": ctrl / step}
    return out


@torch.no_grad()
def paper_feature_ms(batch: int, reps: int = 3) -> dict:
    """One layer's features the paper's way vs ours, on demo-sized q, k, v ([B, 4, 256, 32])."""
    torch.manual_seed(0)
    B, H, T, D = batch, 4, 256, 32
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    y = torch.randn(B, H, T, D)
    windows = torch.tensor([16, 64, 128, 256])

    def paper() -> None:
        i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
        mask = (j <= i) & (j > i - windows.view(H, 1, 1))
        p = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~mask, float("-inf")).softmax(-1).float()
        ent = -(p * (p + 1e-9).log()).sum(-1).mean(dim=(0, 2)) / math.log(T)
        usage = p[..., T - 1].mean(dim=(0, 2))
        norm = (p @ v).norm(dim=-1).mean(dim=(0, 2))
        _ = [(float(ent[h]), float(usage[h]), float(norm[h])) for h in range(H)]  # per-head host syncs

    def ours() -> None:
        head_stats(q, k, v, y, windows)

    return {"paper_ms": time_ms(paper, runs=reps, warmup=1)["median"], "ours_ms": time_ms(ours, runs=reps, warmup=1)["median"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and a smaller batch (smoke run)")
    parser.add_argument("--steps", type=int, default=36)
    args = parser.parse_args(argv)
    steps, batch = (12, 8) if args.quick else (args.steps, 32)
    warmup, interval = 5, 5
    results = [run_preset(name, steps, warmup, interval, batch) for name in PRESETS]
    base = results[0]["steps"]["all"]["step_ms_median"]
    for r in results:
        all_ = r["steps"]["all"]
        r["step_time_vs_baseline"] = all_["step_ms_median"] / base
        parts = ", ".join(f"{k} {v['overhead_fraction'] * 100:.2f}% (n={v['n']})" for k, v in r["steps"].items())
        print(f"{r['preset']:>14}: step {all_['step_ms_median']:.0f} ms median; controller share {parts}")
    features = paper_feature_ms(batch)
    print(f"one layer's features: paper-style {features['paper_ms']:.1f} ms, ours {features['ours_ms']:.1f} ms")
    payload = {"model": "demo (4L x 4H x 128, T=256)", "batch": batch, "steps": steps, "controller_warmup": warmup,
               "control_interval": interval, "threads": torch.get_num_threads(), "results": results,
               "feature_path_one_layer": features, "target_overhead_fraction": 0.03}
    if not args.quick:
        print(f"wrote {write_result('controller', payload)}")
    else:
        print(f"(quick run on {machine_slug()}: nothing written)")


if __name__ == "__main__":
    main()
