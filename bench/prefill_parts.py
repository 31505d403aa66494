"""Where a prefill's time goes: the model without its attention, and what the attention adds, per plan.

    python -m bench.prefill_parts [--T 4096] [--batch 1 8] [--repeats 7] [--name NAME]

The model and plans of bench.generate (the demo's shape, random weights; the mixed plan of coverage ~0.33
against the full plan). Each prefill of T tokens is timed twice over, interleaved: as it runs, and with every
layer's cached attention (kvcache.LayerKVCache.attend: the cache's writes, the attention kernels, the
output's assembly) replaced by handing back q. The second is the rest of the model (projections, MLP,
norms, rotary), the same in both plans; the difference is what each plan's attention costs, and

    ratio if the attention cost exactly its coverage = (rest + coverage * attention_full) / (rest + attention_full)

is how low the plan's prefill ratio could go with this rest of the model. Results:
bench/results/prefill-parts[-NAME]-<machine>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator

import torch

from aah_core.config import apply_overrides
from aah_core.inference import kvcache
from aah_core.inference.cost import _prefill_ms
from aah_core.model import WindowedGPT
from aah_core.presets import get_preset
from aah_core.windows import causal_coverage, full_plan
from bench.common import write_result
from bench.engine import mixed_plan


@contextlib.contextmanager
def attention_skipped() -> Iterator[None]:
    """Every cached attention call hands back its queries (the shape of its output) and does nothing else."""
    real = kvcache.LayerKVCache.attend
    kvcache.LayerKVCache.attend = lambda self, q, k, v, scale=None: q  # type: ignore[method-assign]
    try:
        yield
    finally:
        kvcache.LayerKVCache.attend = real  # type: ignore[method-assign]


@torch.no_grad()
def run(T: int, batch: int, repeats: int) -> dict:
    config = apply_overrides(get_preset("demo"), {"model.seq_len": T})
    torch.manual_seed(0)
    model = WindowedGPT(config.model).eval()
    plans = {"plan": mixed_plan(model.n_layer, model.n_head, T), "full": full_plan(model.n_layer, model.n_head, T)}
    prompt = torch.randint(0, model.vocab_size, (batch, T))
    times: dict[str, list[float]] = {}
    for p in plans.values():  # warm-up: first calls allocate and build masks
        _prefill_ms(model, p, prompt, "auto")
    for _ in range(repeats):
        for skipped in (False, True):
            with attention_skipped() if skipped else contextlib.nullcontext():
                for name, p in plans.items():
                    times.setdefault(f"{name}{'_without_attention' if skipped else ''}", []).append(
                        _prefill_ms(model, p, prompt, "auto"))
    ms = {k: statistics.median(v) for k, v in times.items()}
    rest = (ms["plan_without_attention"] + ms["full_without_attention"]) / 2
    attention = {name: ms[name] - rest for name in plans}
    coverage = causal_coverage(plans["plan"], T)
    return {
        "T": T, "batch": batch, "repeats": repeats, "threads": torch.get_num_threads(), "coverage": coverage,
        "prefill_ms": ms, "samples_ms": times, "rest_ms": rest, "attention_ms": attention,
        "prefill_ratio": ms["plan"] / ms["full"], "attention_ratio": attention["plan"] / attention["full"],
        "ratio_if_attention_cost_its_coverage": (rest + coverage * attention["full"]) / (rest + attention["full"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--name", help="result file: bench/results/prefill-parts-NAME-<machine>.json")
    args = parser.parse_args()
    load = os.getloadavg()
    rows = []
    for batch in args.batch:
        row = run(args.T, batch, args.repeats)
        rows.append(row)
        ms, att = row["prefill_ms"], row["attention_ms"]
        print(f"T={args.T} batch={batch}: prefill {ms['plan']:.1f} / {ms['full']:.1f} ms = {row['prefill_ratio']:.3f}x; "
              f"without attention {ms['plan_without_attention']:.1f} / {ms['full_without_attention']:.1f} ms; "
              f"attention {att['plan']:.1f} / {att['full']:.1f} ms = {row['attention_ratio']:.3f}x at coverage "
              f"{row['coverage']:.3f}; ratio if it cost its coverage {row['ratio_if_attention_cost_its_coverage']:.3f}",
              flush=True)
    name = "prefill-parts" + (f"-{args.name}" if args.name else "")
    payload = {"bench": "prefill_parts", "loadavg_before": load, "loadavg_after": os.getloadavg(), "rows": rows}
    print(f"wrote {write_result(name, payload)}")


if __name__ == "__main__":
    main()
