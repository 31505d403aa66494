"""What the inference endpoints compute: a plan's cost (exact, and measured on request) and a
generated continuation under a plan. The numerics live in the engine (aah_core.inference.cost,
aah_core.inference.generate); this module checks inputs against the model and shapes the responses."""

from __future__ import annotations

import time

import torch

from aah_core.inference.cost import measure_cost
from aah_core.inference.generate import Sampling, generate
from aah_core.windows import plan_to_json
from backend.schemas.errors import InvalidInput
from backend.schemas.models import (
    CostRequest,
    CostResponse,
    GenerateRequest,
    GenerateResponse,
    MeasuredCostPublic,
)
from backend.services.analysis import cost_fields, encode_text, exact_cost, parse_plan
from backend.services.registry import LoadedModel

# measured figures: a few interleaved repeats, enough to steady a median on a loaded machine
MEASURE_REPEATS = 3
MEASURE_DECODE_STEPS = 8


def cost(lm: LoadedModel, body: CostRequest) -> CostResponse:
    plan = parse_plan(lm, body.windows)
    exact = exact_cost(lm, plan, body.context)
    measured = None
    if body.measure:
        with lm.lock:  # timings of one request at a time per model, not interleaved with another's
            m = measure_cost(lm.model, plan, exact.context, repeats=MEASURE_REPEATS,
                             decode_steps=MEASURE_DECODE_STEPS)
        measured = MeasuredCostPublic(**m.to_dict())
    return CostResponse(
        **cost_fields(exact).model_dump(), windows=plan_to_json(plan, lm.info.seq_len),
        kv_entries=exact.kv_entries, kv_entries_full=exact.kv_entries_full, kv_ratio=exact.kv_ratio,
        pairs_ratio=exact.pairs_ratio, kv_windows=exact.kv_windows,
        measured=measured,
    )


def generate_text(lm: LoadedModel, body: GenerateRequest) -> GenerateResponse:
    t0 = time.perf_counter()
    plan = lm.plan if body.windows is None else parse_plan(lm, body.windows)
    ids = encode_text(lm, body.prompt, "prompt")
    T = lm.info.seq_len
    if len(ids) >= T:
        raise InvalidInput(f"prompt: {len(ids)} tokens leave no room in this model's context of {T}; "
                           f"send at most {T - 1}")
    sampling = Sampling(body.temperature, body.top_k, body.top_p, body.seed)
    result = generate(lm.model, torch.tensor([ids]), plan, body.max_new_tokens, sampling)
    new = result.tokens[0].tolist()
    final = exact_cost(lm, plan, len(ids) + max(len(new) - 1, 0))  # the context of the last prediction
    return GenerateResponse(
        windows=plan_to_json(plan, T), prompt_tokens=len(ids), text=lm.tokenizer.decode(new),
        tokens=[lm.tokenizer.decode_token(t) for t in new], stop_reason=result.stop_reason,
        cache_bytes=result.cache_bytes, kv_bytes_full=final.kv_bytes_full,
        elapsed_ms=(time.perf_counter() - t0) * 1000,
    )
