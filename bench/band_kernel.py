"""One head on the C kernel against ATen (`python -m bench.band_kernel [--T ...] [--D ...]`).

For each T, head size D and window w <= T: the forward of one head (batch 1, no gradient; with --grad forward and
backward, ATen's blocks then being as wide as banded.block_size gives under autograd) as the banded backend
runs it on ATen's CPU flash kernel (banded.windowed_bucket: for w < T a causal call for the first w rows, one call
over blocks of 32 queries and their c + w - 1 keys, the rows copied into place; for w = T causal attention, split
in two calls of equal work) and as native.band_attention runs it, timed interleaved, q, k and v laid out as the
model hands them (views of one fused [T, 3H, D] projection). `native_ratio` is the median of the native times over
the median of the ATen times; banded.NATIVE_MAX_WORK (min(window, T) * D) is set where it stops being below 1
without a gradient; with one, banded sends a call to the kernel only when it takes every head.
Results: bench/results/band-kernel[-NAME]-<machine>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from aah_core.attention import banded, native
from bench.common import write_result


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def compare(T: int, D: int, w: int, repeats: int, grad: bool = False) -> dict:
    with torch.set_grad_enabled(grad):
        return _compare(T, D, w, repeats, grad)


def _compare(T: int, D: int, w: int, repeats: int, grad: bool) -> dict:
    projection = torch.randn(1, T, 3 * 4, D, requires_grad=grad)
    fused = projection.transpose(1, 2)  # (1, 12, T, D): four heads' q, k, v rows interleaved
    q, k, v = fused[:, 1:2], fused[:, 5:6], fused[:, 9:10]
    out = torch.empty(1, T, 4, D).transpose(1, 2)[:, 1:2]
    if grad:  # forward and backward, the gradient of the fused projection
        g = torch.randn(1, 1, T, D)
        runs = {
            "aten": lambda: torch.autograd.grad(banded.windowed_bucket(q, k, v, w, 0.0, None), projection, g),
            "native": lambda: torch.autograd.grad(native.BandAttention.apply(q, k, v, (w,), None), projection, g),
        }
    else:
        runs = {
            "aten": lambda: banded.windowed_bucket(q, k, v, w, 0.0, None, 0, out),
            "native": lambda: native.band_attention(q, k, v, (w,), None, out),
        }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():  # warm-up
        fn(), fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(_ms(fn))
    ms = {name: statistics.median(t) for name, t in times.items()}
    return {"T": T, "D": D, "window": w, "window_x_D": min(w, T) * D, "grad": grad, "ms": ms,
            "native_ratio": ms["native"] / ms["aten"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--D", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 64, 128, 256, 512, 1024, 2048, 4096],
                        help="windows (those <= T are run; w = T: causal attention)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--grad", action="store_true", help="forward and backward (BandAttention against ATen's)")
    parser.add_argument("--name", help="result file: bench/results/band-kernel-NAME-<machine>.json")
    args = parser.parse_args()
    ok, why = native.available()
    if not ok:
        raise SystemExit(f"the native kernel is not available here: {why}")
    load = os.getloadavg()
    rows = []
    for D in args.D:
        for T in args.T:
            for w in (w for w in args.windows if w <= T):
                row = compare(T, D, w, args.repeats, args.grad)
                rows.append(row)
                print(f"T={T} D={D} w={w}: ATen blocks {row['ms']['aten']:.3f} ms, native {row['ms']['native']:.3f} ms "
                      f"= {row['native_ratio']:.2f}x", flush=True)
    payload = {"bench": "band_kernel", "threads": torch.get_num_threads(), "native_max_work": banded.NATIVE_MAX_WORK,
               "loadavg_before": load, "loadavg_after": os.getloadavg(), "rows": rows}
    print(f"wrote {write_result('band-kernel' + (f'-{args.name}' if args.name else ''), payload)}")


if __name__ == "__main__":
    main()
