"""Attention benchmark: does wall-clock shrink with coverage? (`python -m bench.attention [--quick]`)

For every T, every window plan and every backend, forward and forward+backward are timed
interleaved with SDPA causal (`is_causal=True`, the full-attention baseline) in the same
loop, so each ratio compares runs taken under the same machine load. Times are medians
after warm-up; `ratio` is the ratio of medians, `ratio_paired` the median of per-round
ratios (more robust when the machine's load drifts), `ratio_of_mins` the ratio of minima;
`auto_picks` the backend `auto` runs for such a call here (the per-shape choice).
The table is printed and the full run is written to bench/results/attention-<machine>.json
(`--quick` prints only, unless --out is given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from operator import truediv
from pathlib import Path

import torch
import torch.nn.functional as F

from aah_core.attention import backend_status, flex, resolve_backend, windowed_attention
from aah_core.windows import causal_coverage, tile_coverage
from bench.common import machine_slug

RESULTS = Path(__file__).parent / "results"
REFERENCE_MAX_T = {"cpu": 2048, "cuda": 8192}  # dense [B, H, T, T] scores beyond this: too slow / too big
TARGETS = [  # (device type, T, plan, backend, mode, max ratio to SDPA causal), from issues 2 and 26
    ("cpu", 2048, "mix-cov0.28", "banded", "fwd", 0.42),
    ("cpu", 2048, "mix-cov0.28", "banded", "fwd+bwd", 0.47),
    ("cpu", 2048, "mix-cov0.32", "banded", "fwd", 0.50),
    ("cpu", 2048, "mix-cov0.32", "banded", "fwd+bwd", 0.55),
    ("cpu", 4096, "w=256", "banded", "fwd", 0.25),
    ("cpu", 4096, "w=256", "banded", "fwd+bwd", 0.25),
    ("cuda", 4096, "mix-cov0.32", "flash", "fwd", 0.45),
    ("cuda", 4096, "mix-cov0.32", "flex", "fwd", 0.45),
    ("cuda", 4096, "mix-cov0.32", "flash", "fwd+bwd", 0.45),
]


def plans(T: int) -> dict[str, list[int]]:
    """Single windows 64..T/2 for all 8 heads, and three mixed per-head plans."""
    out = {}
    w = 64
    while w <= T // 2:
        out[f"w={w}"] = [w] * 8
        w *= 2
    # windows scaled with T, so causal_coverage is ~0.32 at every T; contiguous buckets
    out["mix-cov0.32"] = [T // 32, T // 32, T // 16, T // 16, T // 8, T // 8, T // 2, T]
    # issue 26's plan: causal_coverage ~0.28 at every T
    out["mix-cov0.28"] = [T // 64, T // 32, T // 32, T // 16, T // 16, T // 16, T // 2, T]
    # the same windows scattered over heads: exercises the gather / reorder path
    out["mix-cov0.32-scattered"] = [T, T // 32, T // 8, T // 16, T // 2, T // 32, T // 16, T // 8]
    out["mix-fixed"] = [64, 64, 128, 128, 256, 256, 1024, T]  # fixed windows: coverage falls with T
    return out


def selected(name: str, T: int, wanted: list[str] | None) -> bool:
    """The --plans filter; `w=T/16` names the single window T/16 at every T."""
    return not wanted or name in {n.replace("w=T/16", f"w={T // 16}") for n in wanted}


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    def run(fn: Callable[[], object]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    return run


def _step(backend: str, q, k, v, windows: list[int], grad_out, sinks: int = 0) -> Callable[[], object]:
    """One forward (grad_out None, under no_grad) or forward+backward of a backend."""

    def forward():
        if backend == "sdpa-causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return windowed_attention(q, k, v, windows, backend=backend, sinks=sinks)

    if grad_out is None:
        return lambda: _no_grad(forward)
    return lambda: torch.autograd.grad(forward(), (q, k, v), grad_out)


def _no_grad(fn: Callable[[], object]) -> object:
    with torch.no_grad():
        return fn()


def measure(
    T: int, windows: list[int], backends: list[str], mode: str, args: argparse.Namespace, device: torch.device
) -> dict[str, list[float]]:
    """ms of every timed run per backend, all interleaved with sdpa-causal in one loop."""
    g = torch.Generator(device="cpu").manual_seed(T)
    shape = (args.batch, len(windows), T, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).to(device, args.dtype) for _ in range(3))
    grad_out = None
    if mode == "fwd+bwd":
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        grad_out = torch.randn(shape, generator=g).to(device, args.dtype)
    steps = {b: _step(b, q, k, v, windows, grad_out, args.sinks) for b in ["sdpa-causal", *backends]}
    timer = _timer(device)
    times: dict[str, list[float]] = {b: [] for b in steps}
    for rep in range(args.warmup + args.runs):
        for b, fn in steps.items():
            ms = timer(fn)
            if rep >= args.warmup:
                times[b].append(ms)
    return times


def backends_for(mode: str, name: str, T: int, args, device) -> tuple[list[str], dict[str, str]]:
    """Backends to time for one cell, and the reason for each one left out."""
    status = backend_status(device)
    chosen, skipped = [], {}
    for b in args.backends:
        if status.get(b):
            skipped[b] = status[b]
        elif b == "flex" and mode == "fwd+bwd" and device.type == "cpu":
            skipped[b] = "forward-only on CPU"
        elif b == "flash" and args.dtype not in (torch.float16, torch.bfloat16):
            skipped[b] = "flash kernels take float16/bfloat16"
        elif b == "reference" and T > REFERENCE_MAX_T.get(device.type, 2048):
            skipped[b] = f"dense [B,H,T,T] scores ({args.batch * 8 * T * T * 4 >> 20} MiB each) at T={T}"
        elif b == "reference" and name != "mix-cov0.32":
            skipped[b] = "cost does not depend on the plan: timed on mix-cov0.32 only"
        else:
            chosen.append(b)
    return chosen, skipped


def warm_flex(T: int, args, device) -> float | None:
    """Compile flex for this shape (not timed in the table); returns seconds, None if unused."""
    if "flex" not in args.backends or backend_status(device)["flex"]:
        return None
    x = torch.zeros(args.batch, 8, T, args.head_dim, device=device, dtype=args.dtype)
    t0 = time.perf_counter()
    with torch.no_grad():
        windowed_attention(x, x, x, [64] * 8, backend="flex")
    return time.perf_counter() - t0


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    rows, compile_s = [], {}
    load_before = os.getloadavg()
    for T in args.T:
        compile_s[T] = warm_flex(T, args, device)
        missing = [n for n in args.plans or [] if not any(selected(name, T, [n]) for name in plans(T))]
        if missing:
            raise SystemExit(f"bench.attention: no plan {missing} at T={T}; plans there: {list(plans(T))}")
        for name, windows in plans(T).items():
            plan = torch.tensor([windows])
            cov, tile = causal_coverage(plan, T), tile_coverage(plan, T)
            if not selected(name, T, args.plans):
                continue
            for mode in args.modes:
                chosen, skipped = backends_for(mode, name, T, args, device)
                times = measure(T, windows, chosen, mode, args, device)
                base = times["sdpa-causal"]
                auto = resolve_backend("auto", device, mode == "fwd+bwd", args.dtype, 0.0, args.head_dim,
                                       scores=args.batch * 8 * T * T).NAME  # (8 heads, as timed)
                for b, ts in times.items():
                    rows.append(dict(T=T, plan=name, windows=windows, causal_coverage=round(cov, 4),
                                     tile_coverage=round(tile, 4), mode=mode, backend=b,
                                     median_ms=round(statistics.median(ts), 3), min_ms=round(min(ts), 3),
                                     ratio=round(statistics.median(ts) / statistics.median(base), 3),
                                     ratio_of_mins=round(min(ts) / min(base), 3),
                                     ratio_paired=round(statistics.median(map(truediv, ts, base)), 3),
                                     auto_picks=auto))
                for b, why in skipped.items():
                    rows.append(dict(T=T, plan=name, windows=windows, causal_coverage=round(cov, 4),
                                     tile_coverage=round(tile, 4), mode=mode, backend=b, skipped=why))
                print_cell(rows, T, name, mode, cov)
    return dict(
        machine=machine_slug(), device=str(device), dtype=str(args.dtype).replace("torch.", ""),
        torch=torch.__version__, threads=torch.get_num_threads(), batch=args.batch, n_head=8,
        head_dim=args.head_dim, runs=args.runs, warmup=args.warmup, statistic="median",
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
        loadavg_before=load_before, loadavg_after=os.getloadavg(),
        flex_compile_s={str(T): (round(s, 1) if s is not None else None) for T, s in compile_s.items()},
        flex_compiled_path=dict(flex.stats, verified=flex_verdict()),
        sinks=args.sinks, targets=check_targets(rows, device) if not args.sinks else [], rows=rows,
    )


def flex_verdict() -> str:
    """'yes' when every flex call ran the compiled graph (see aah_core.attention.flex)."""
    if flex.stats["eager_calls"]:
        return f"NO: {flex.stats['eager_calls']} calls fell back to eager"
    return "yes" if flex.stats["compiled_calls"] else "flex not run"


def print_cell(rows: list[dict], T: int, name: str, mode: str, cov: float) -> None:
    cell = [r for r in rows if r["T"] == T and r["plan"] == name and r["mode"] == mode and "ratio" in r]
    parts = [f"{r['backend']} {r['median_ms']:.1f}ms"
             + ("" if r["backend"] == "sdpa-causal"
                else f" ({r['ratio']:.2f}x, paired {r['ratio_paired']:.2f}x)")
             for r in cell]
    auto = cell[0]["auto_picks"] if cell else "?"
    print(f"T={T:<5} {name:<22} cov={cov:.3f} {mode:<8} " + "  ".join(parts) + f"  (auto: {auto})", flush=True)


def check_targets(rows: list[dict], device: torch.device) -> list[dict]:
    out = []
    for dev, T, plan, backend, mode, limit in TARGETS:
        key = (T, plan, backend, mode)
        hit = [r for r in rows if (r["T"], r["plan"], r["backend"], r["mode"]) == key and "ratio" in r]
        if dev != device.type:
            continue
        if hit:
            out.append(dict(T=T, plan=plan, backend=backend, mode=mode, target=limit, ratio=hit[0]["ratio"],
                            met=hit[0]["ratio"] <= limit))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="T=512,1024 (unless --T), 3 runs; prints only unless --out")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--T", type=int, nargs="+", help="sequence lengths (default 512 1024 2048 4096)")
    p.add_argument("--backends", nargs="+", default=["banded", "flex", "flash", "reference"])
    p.add_argument("--plans", nargs="+", help="only these plan names (e.g. w=256 mix-cov0.32; w=T/16 at every T)")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    p.add_argument("--sinks", type=int, default=0, help="sink keys every query also sees (the targets assume none)")
    p.add_argument("--out", type=Path, help="default: bench/results/attention-<machine>[-<dtype>].json")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.warmup = 3, 1
    args.T = args.T or ([512, 1024] if args.quick else [512, 1024, 2048, 4096])
    args.dtype = getattr(torch, args.dtype)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    result = run(args)
    for t in result["targets"]:
        print(f"target T={t['T']} {t['plan']} {t['backend']} {t['mode']}: {t['ratio']:.2f}x "
              f"(target <= {t['target']:.2f}x) {'met' if t['met'] else 'MISSED'}")
    fp = result["flex_compiled_path"]
    print(f"flex: {fp['compiled_calls']} compiled calls, {fp['eager_calls']} eager; compiled path verified: "
          f"{fp['verified']}; compile s per T: {result['flex_compile_s']}")
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}")
    if args.quick and args.out is None:
        return
    suffix = "" if args.dtype == torch.float32 else "-" + result["dtype"]
    path = args.out or RESULTS / f"attention-{result['machine']}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
