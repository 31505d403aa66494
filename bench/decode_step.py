"""One layer's decode step, 'flat' against 'buckets' (aah_core/inference/kvcache.py): `python -m bench.decode_step`.

Each shape's cache is filled with a prompt of T-20 positions, then one step is timed 15 times per mode,
the modes interleaved, in CPU time of one thread (time.thread_time), which other processes on a shared machine do not
inflate; medians of the last 12. The result says which mode each shape's `auto` picks
(kvcache.choose_decode) next to which one measured faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from aah_core.inference.kvcache import LayerKVCache, choose_decode
from bench.common import write_result

SHAPES = {  # name: (query-head windows, head_dim); one kv head per query head
    "demo 4 heads, D=32": ((64, 128, 512, 4096), 32),
    "12 heads, 8 windows, D=64": ((64, 128, 256, 512, 1024, 2048, 4096, 4096, 64, 128, 256, 4096), 64),
    "2 heads, 2 windows, D=64": ((256, 4096), 64),
    "8 heads, 2 windows, D=64": ((256, 4096) * 4, 64),
    "4 small windows, D=64": ((16, 32, 64, 128), 64),
}


def step_us(windows: tuple[int, ...], head_dim: int, batch: int, modes: tuple[str, ...], T: int) -> dict[str, int]:
    """Median µs of one step per decode mode, the modes' caches filled alike and their steps interleaved."""
    H = len(windows)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randn(batch, H, T - 20, head_dim, generator=gen)
    q, k, v = (torch.randn(batch, H, 1, head_dim, generator=gen) for _ in range(3))
    caches = {mode: LayerKVCache(windows, H, T, decode=mode) for mode in modes}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for cache in caches.values():
        cache.attend(prompt, prompt, prompt)
    for _ in range(15):
        for mode, cache in caches.items():
            t0 = time.thread_time()
            cache.attend(q, k, v)
            times[mode].append((time.thread_time() - t0) * 1e6)
    return {mode: round(statistics.median(t[3:])) for mode, t in times.items()}


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, load = [], os.getloadavg()
    for name, (windows, D) in SHAPES.items():
        for batch in args.batch:
            us = step_us(windows, D, batch, ("flat", "buckets"), args.T)
            auto = choose_decode(list(windows), 1, batch, D)
            faster = min(us, key=lambda m: us[m])
            rows.append(dict(shape=name, windows=list(windows), head_dim=D, batch=batch, step_us=us, auto=auto,
                             faster=faster))
            print(f"{name:<28} batch {batch}: flat {us['flat']} us, buckets {us['buckets']} us; "
                  f"auto picks {auto}, faster: {faster}", flush=True)
    path = write_result("decode-step", {"T": args.T, "threads": 1, "clock": "thread_time", "loadavg_before": load,
                                        "loadavg_after": os.getloadavg(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
