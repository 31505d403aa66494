"""Decode steps on torch's threads, as the engine ships them, and on one thread: `python -m bench.decode_threads`.

The demo model at context T (bench.generate's model and mixed plan, and the full plan): a prompt of T - n
positions, then n one-token steps, the three modes alternating step by step on the same cache (wall clock;
medians). Modes: `threads` (every operation on torch's threads, as before issue 26's change), `engine` (as
shipped: the step on one intra-op thread, attention calls of >= kvcache.PARALLEL_CALL_WORK products over
more than one head split over the threads; aah_core/inference/threads.py) and `one_thread` (no call split).
`--eval-thread` runs an evaluation (a forward pass of 4 x 256 tokens, in a loop) on another thread of the
same process meanwhile, as the API service does. Run it as `python -m bench...`: bench/__init__.py sets
OMP_WAIT_POLICY=PASSIVE before torch loads, as `aah` and `make` do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from aah_core.config import apply_overrides
from aah_core.inference import generate, kvcache
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.windows import full_plan
from bench.common import write_result
from bench.engine import mixed_plan


@contextmanager
def _mode(step_work: float, call_work: float) -> Iterator[None]:
    """Decode steps of rows x width^2 <= step_work on one thread, attention calls of >= call_work products split."""
    saved = generate.DECODE_ONE_THREAD_WORK, kvcache.PARALLEL_CALL_WORK
    generate.DECODE_ONE_THREAD_WORK, kvcache.PARALLEL_CALL_WORK = step_work, call_work  # type: ignore[assignment]
    try:
        yield
    finally:
        generate.DECODE_ONE_THREAD_WORK, kvcache.PARALLEL_CALL_WORK = saved


# threads: torch's threads for every operation (before issue 26's change); engine: as shipped;
# one_thread: every operation of the step on one thread
MODES = {
    "threads": lambda: _mode(0, kvcache.PARALLEL_CALL_WORK),
    "engine": nullcontext,
    "one_thread": lambda: _mode(float("inf"), float("inf")),
}


def _evaluations(model: WindowedGPT, stop: threading.Event, done: list[int]) -> None:
    idx = torch.randint(0, model.vocab_size, (4, 256))
    with torch.no_grad():
        while not stop.is_set():
            model(idx)
            done[0] += 1


def steps_ms(model: WindowedGPT, plan: torch.Tensor, batch: int, steps: int) -> dict[str, float]:
    """Median ms of a decode step at context T per mode, the modes alternating on one cache."""
    T = model.seq_len
    modes = MODES
    n = steps * len(modes) + 4  # the first 4 steps (one per mode and a ring growth) are not timed
    idx = torch.randint(0, model.vocab_size, (batch, T), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model, plan)
    forward_cached(model, idx[:, : T - n], cache, plan)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for s in range(n):
        mode = list(modes)[s % len(modes)]
        t = T - n + s
        with modes[mode]():
            t0 = time.perf_counter()
            forward_cached(model, idx[:, t : t + 1], cache, plan)
            ms = 1000 * (time.perf_counter() - t0)
        if s >= 4:
            times[mode].append(ms)
    return {m: round(statistics.median(v), 3) for m, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=16, help="timed steps per mode")
    parser.add_argument("--eval-thread", action="store_true", help="an evaluation loop on another thread meanwhile")
    parser.add_argument("--tag", default="", help="result file bench/results/decode-threads[-TAG]-<machine>.json")
    args = parser.parse_args()
    config = apply_overrides(get_preset("demo"), {"model.seq_len": args.T})
    torch.manual_seed(0)
    model = WindowedGPT(config.model).eval()
    plans = {"plan": mixed_plan(model.n_layer, model.n_head, args.T), "full": full_plan(model.n_layer, model.n_head, args.T)}
    stop, done = threading.Event(), [0]
    worker = threading.Thread(target=_evaluations, args=(model, stop, done), daemon=True)
    if args.eval_thread:
        worker.start()
    rows, load = [], os.getloadavg()
    try:
        for batch in args.batch:
            for name, plan in plans.items():
                ms = steps_ms(model, plan, batch, args.steps)
                rows.append({"batch": batch, "plan": name, **ms})
                print(f"batch {batch} {name}: " + ", ".join(f"{m} {v:.3f} ms" for m, v in ms.items()), flush=True)
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()  # torch must not be mid-call in a thread when the interpreter exits
    payload = {"bench": "decode_threads", "T": args.T, "threads": torch.get_num_threads(), "eval_thread": args.eval_thread,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
               "evaluations_done": done[0], "loadavg_before": load, "loadavg_after": os.getloadavg(), "rows": rows}
    print(f"wrote {write_result('-'.join(['decode-threads', *filter(None, [args.tag])]), payload)}")


if __name__ == "__main__":
    main()
