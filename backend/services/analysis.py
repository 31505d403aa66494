"""What the model endpoints compute: live evaluation, heatmaps, retained mass, sensitivity,
allocation. Each takes a LoadedModel (and the registry for its result cache) and returns a
response schema; the numerics live in the engine (aah_core.analysis.evaluate, aah_core.analysis.diagnostics)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import torch

from aah_core.analysis import diagnostics, retrieval
from aah_core.analysis.allocate import allocate as run_allocation
from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.errors import InvalidWindowPlan
from aah_core.inference.cost import ModelShape, PlanCost, check_context, plan_cost
from aah_core.windows import coverage_metrics, decode_window, encode_window, plan_to_json, validate_plan
from backend.schemas.base import OWN_WINDOW, AttentionWindow
from backend.schemas.errors import InvalidInput
from backend.schemas.models import (
    HELD_OUT,
    AllocateRequest,
    AllocateResponse,
    AttentionResponse,
    CostFields,
    CurvePoint,
    EvaluateRequest,
    EvaluateResponse,
    PerTokenLosses,
    RetainedMassRequest,
    RetainedMassResponse,
    RetrievalRequest,
    RetrievalResponse,
    SensitivityResponse,
    SweepPick,
)
from backend.services.registry import LoadedModel, Registry

logger = logging.getLogger(__name__)


def parse_plan(lm: LoadedModel, windows: Any, field: str = "windows") -> torch.Tensor:
    """User windows -> plan tensor; shape and values checked against this model (422 names the head)."""
    m = lm.info
    try:
        return validate_plan(windows, m.n_layer, m.n_head, m.seq_len)
    except InvalidWindowPlan as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def exact_cost(lm: LoadedModel, plan: torch.Tensor, context: int, sinks: int | None = None) -> PlanCost:
    """The plan's exact figures at `context` (an AAHError, so 422, when the context is outside the model),
    with `sinks` sink tokens (None: the model's own)."""
    shape = ModelShape.of(lm.model)
    shape = shape if sinks is None else dataclasses.replace(shape, sinks=sinks)
    return plan_cost(plan, check_context(context, lm.info.seq_len), shape)


def parse_sinks(lm: LoadedModel, sinks: int | None) -> int:
    """A requested sink count (None: the model's own), at most the model's seq_len (422 otherwise)."""
    if sinks is None:
        return lm.model.sinks
    if sinks > lm.info.seq_len:
        raise InvalidInput(f"sinks: {sinks} is more than the model's seq_len={lm.info.seq_len}; use 0..{lm.info.seq_len}")
    return sinks


def cost_fields(cost: PlanCost) -> CostFields:
    return CostFields(context=cost.context, kv_bytes=cost.kv_bytes, kv_bytes_full=cost.kv_bytes_full,
                      attention_pairs=cost.attention_pairs, attention_pairs_full=cost.attention_pairs_full,
                      n_kv_head=cost.n_kv_head)


def _plan_key(plan: torch.Tensor) -> tuple[int, ...]:
    return tuple(plan.flatten().tolist())


def _losses(registry: Registry, lm: LoadedModel, plan: torch.Tensor, eval_set: str,
            per_token: bool, sinks: int | None = None) -> tuple[float, list[float] | None, bool]:
    """(loss, per-token losses of the first sequence or None, served from cache), with `sinks` sink
    tokens (None: the model's own)."""
    sinks = lm.model.sinks if sinks is None else sinks
    key = (lm.id, "eval", eval_set, _plan_key(plan), per_token, sinks)
    hit = registry.cached(key)
    if hit is not None:
        return hit[0], hit[1], True
    with lm.lock:
        evaluator = lm.evaluator(eval_set)
        loss = evaluator.loss(plan, sinks)
        tokens = evaluator.token_losses(plan, sinks)[0].tolist() if per_token else None
    registry.remember(key, (loss, tokens))
    if per_token:  # the loss alone is now known too
        registry.remember((lm.id, "eval", eval_set, _plan_key(plan), False, sinks), (loss, None))
    return loss, tokens, False


def plan_loss(registry: Registry, lm: LoadedModel, plan: torch.Tensor, eval_set: str) -> float:
    """The loss POST /evaluate reports for `plan` (the same cache entry)."""
    return _losses(registry, lm, plan, eval_set, False)[0]


def evaluate(registry: Registry, lm: LoadedModel, body: EvaluateRequest) -> EvaluateResponse:
    t0 = time.perf_counter()
    plan = parse_plan(lm, body.windows)
    sinks = parse_sinks(lm, body.sinks)
    baseline, base_tokens, _ = _losses(registry, lm, lm.plan, body.eval_set, body.per_token)
    loss, tokens, cached = _losses(registry, lm, plan, body.eval_set, body.per_token, sinks)
    per_token = None
    if body.per_token:
        assert tokens is not None and base_tokens is not None, "_losses gives per-token losses when asked"
        batch = lm.batch(body.eval_set)
        ignored = (batch.targets[0] < 0).tolist()
        labels = [lm.tokenizer.decode_token(int(t)) for t in batch.idx[0].tolist()]
        loss_row = [None if skip else v for v, skip in zip(tokens, ignored, strict=True)]
        base_row = [None if skip else v for v, skip in zip(base_tokens, ignored, strict=True)]
        delta_row = [None if skip else a - b for a, b, skip in zip(tokens, base_tokens, ignored, strict=True)]
        per_token = PerTokenLosses(tokens=labels, loss=loss_row, baseline=base_row, delta=delta_row)
    delta = loss - baseline
    return EvaluateResponse(
        loss=loss, baseline_loss=baseline, delta=delta,
        delta_pct=100.0 * delta / baseline if baseline else 0.0,
        perplexity=math.exp(min(loss, 700.0)), windows=plan_to_json(plan, lm.info.seq_len),
        eval_set=body.eval_set, elapsed_ms=(time.perf_counter() - t0) * 1000, cached=cached,
        per_token=per_token, sinks=sinks, **coverage_metrics(plan, lm.info.seq_len, sinks),
        **cost_fields(exact_cost(lm, plan, lm.info.seq_len, sinks)).model_dump(),
    )


def passkey_retrieval(registry: Registry, lm: LoadedModel, body: RetrievalRequest) -> RetrievalResponse:
    """The passkey table under a plan; a tokenizer that splits a letter or digit in two cannot run it (422)."""
    t0 = time.perf_counter()
    plan = lm.plan if body.windows is None else parse_plan(lm, body.windows)
    key = (lm.id, "retrieval", _plan_key(plan), body.per_cell)
    table, cached = registry.cached(key), True
    if table is None:
        cached = False
        with lm.lock:
            try:
                table = retrieval.retrieval_table(lm.model, plan, body.per_cell)
            except ValueError as exc:  # the tokenizer, or a context too short for any passkey
                raise InvalidInput(f"passkey retrieval cannot run on model {lm.id!r}: {exc}") from None
        registry.remember(key, table)
    return RetrievalResponse(
        windows=plan_to_json(plan, lm.info.seq_len), distances=table.distances, starts=table.starts, end=table.end,
        by_start=table.by_start, chance=retrieval.retrieval_chance(), key_chars_per_cell=body.per_cell * retrieval.KEY_LEN,
        elapsed_ms=(time.perf_counter() - t0) * 1000, cached=cached)


def _check_head(lm: LoadedModel, layer: int, head: int) -> None:
    if layer >= lm.info.n_layer:
        raise InvalidInput(f"layer: {layer} is out of range; model {lm.id!r} has layers 0..{lm.info.n_layer - 1}")
    if head >= lm.info.n_head:
        raise InvalidInput(f"head: {head} is out of range; model {lm.id!r} has heads 0..{lm.info.n_head - 1}")


def encode_text(lm: LoadedModel, text: str, field: str = "text") -> list[int]:
    """Token ids of a posted text, refused when empty or outside the model's vocabulary."""
    ids = lm.tokenizer.encode(text)
    if not ids:
        raise InvalidInput(f"{field}: the text is empty after tokenization; send at least one character")
    if max(ids) >= lm.model.vocab_size:
        raise InvalidInput(f"{field}: the text has tokens outside this model's vocabulary")
    return ids


def _token_ids(lm: LoadedModel, text: str | None, text_id: str | None) -> torch.Tensor:
    """[N] ids of a posted text (whole) or of a bundled one (default: the first)."""
    if text is not None:
        return torch.tensor(encode_text(lm, text), dtype=torch.long)
    if text_id is None:
        text_id = next(iter(lm.texts()), None)
        if text_id is None:
            raise InvalidInput("text_id: this model has no bundled texts; send a text")
    return lm.text(text_id).ids


def token_span(n: int, seq_len: int, offset: int) -> tuple[int, int]:
    """(start, end) of the seq_len tokens shown from `offset`, clipped to the text: the span always holds
    min(n, seq_len) tokens and ends at or before the text's end."""
    start = max(0, min(offset, n - seq_len))
    return start, min(n, start + seq_len)


def _rows(m: torch.Tensor) -> list[list[float | None]]:
    """A causal map as nested lists, the upper triangle (keys after the query) as null."""
    values = m.tolist()
    return [[v if j <= i else None for j, v in enumerate(row)] for i, row in enumerate(values)]


def attention(lm: LoadedModel, layer: int, head: int, text: str | None, text_id: str | None,
              window: AttentionWindow, offset: int = 0) -> AttentionResponse:
    """One head's maps under ``window``: "own" (the head's window in the model's plan), an int or None (full),
    on the text's seq_len tokens from ``offset`` (see token_span)."""
    _check_head(lm, layer, head)
    whole = _token_ids(lm, text, text_id)
    start, end = token_span(whole.shape[0], lm.info.seq_len, offset)
    ids = whole[start:end]
    T = ids.shape[0]
    w = int(lm.plan[layer, head]) if window == OWN_WINDOW else decode_window(window, lm.info.seq_len)
    maps = diagnostics.head_attention(lm.model, ids.view(1, T), lm.plan, layer, head, w)  # read-only: no lock
    pool = diagnostics.pool_factor(T)
    labels = [lm.tokenizer.decode_token(int(t)) for t in ids.tolist()]
    return AttentionResponse(
        layer=layer, head=head, window=encode_window(w, lm.info.seq_len), seq_len=lm.info.seq_len,
        tokens=labels[::pool], full=_rows(diagnostics.pool_map(maps.full, pool)),
        windowed=_rows(diagnostics.pool_map(maps.windowed, pool)),
        cut_mass=diagnostics.pool_rows(maps.cut_mass, pool).tolist(), pool=pool, n_tokens=T,
        offset=start, text_tokens=whole.shape[0],
    )


def _buckets(lm: LoadedModel) -> tuple[list[int], list[int | None]]:
    return [decode_window(b, lm.info.seq_len) for b in lm.info.buckets], lm.info.buckets


def retained_mass(registry: Registry, lm: LoadedModel, text_id: str | None) -> RetainedMassResponse:
    windows, buckets = _buckets(lm)
    key = (lm.id, "retained", text_id)
    mass = registry.cached(key)
    if mass is None:
        ids = (torch.stack([t.ids for t in lm.texts().values()]) if text_id is None
               else lm.text(text_id).ids.view(1, -1))
        if ids.numel() == 0:
            raise InvalidInput("text_id: this model has no bundled texts")
        mass = diagnostics.retained_mass_curves(lm.model, ids, lm.plan, windows).tolist()
        registry.remember(key, mass)
    return RetainedMassResponse(buckets=buckets, mass=mass)


def retained_mass_of_text(lm: LoadedModel, body: RetainedMassRequest) -> RetainedMassResponse:
    """The curves on the span of a posted text that POST /attention shows for the same offset."""
    windows, buckets = _buckets(lm)
    whole = _token_ids(lm, body.text, None)
    if whole.numel() == 0:
        raise InvalidInput("text: it encodes to no tokens")
    start, end = token_span(whole.shape[0], lm.info.seq_len, body.offset)
    mass = diagnostics.retained_mass_curves(lm.model, whole[start:end].view(1, -1), lm.plan, windows).tolist()
    return RetainedMassResponse(buckets=buckets, mass=mass)


def sensitivity(registry: Registry, lm: LoadedModel, eval_set: str) -> SensitivityResponse:
    """(Concurrent identical requests share one sweep: the route runs this in the heavy executor.)"""
    windows, buckets = _buckets(lm)
    key = (lm.id, "sensitivity", eval_set)
    hit = registry.cached(key)
    if hit is None:
        # its own evaluator: the shared one (and its lock) stays free for live edits
        evaluator = PrefixCachedEvaluator(lm.model, lm.batch(eval_set))
        baseline, delta = diagnostics.sensitivity_sweep(evaluator.loss, lm.plan.clone(), windows)
        hit = (baseline, delta.tolist())
        registry.remember(key, hit)
    held_out: str | None = HELD_OUT[eval_set]
    pick = _sweep_pick(hit[1], windows, lm.info.seq_len)
    if pick is not None:  # the picked edit on a set it was not picked on
        edited = lm.plan.clone()
        edited[pick.layer, pick.head] = pick.window
        scored = held_out_losses(registry, lm, edited, str(held_out))
        if scored is None:
            held_out = None
        else:
            pick.held_out_loss, pick.held_out_baseline_loss = scored
            pick.held_out_delta = scored[0] - scored[1]
    return SensitivityResponse(buckets=buckets, baseline_loss=hit[0], delta=hit[1], eval_set=eval_set,
                               held_out=held_out, pick=pick)


def held_out_losses(registry: Registry, lm: LoadedModel, plan: torch.Tensor,
                    held_out: str) -> tuple[float, float] | None:
    """(loss of `plan`, loss of the model's own plan) on the held-out set, the numbers a choice made on
    another set is checked with (the allocator's plan, the sweep's pick); None when the model has no
    such set (e.g. trained without a synthetic task)."""
    try:
        return plan_loss(registry, lm, plan, held_out), plan_loss(registry, lm, lm.plan, held_out)
    except InvalidInput:
        return None


def _sweep_pick(delta: list, windows: list[int], seq_len: int) -> SweepPick | None:
    """The head whose loss rises most when it alone gets the smallest window (None: none rises)."""
    k = min(range(len(windows)), key=windows.__getitem__)
    if windows[k] >= seq_len:
        return None
    cells = [(d[k], layer, head) for layer, row in enumerate(delta) for head, d in enumerate(row) if d[k] is not None]
    worst = max(cells, default=None)
    if worst is None or worst[0] <= 0:
        return None
    return SweepPick(layer=worst[1], head=worst[2], window=windows[k], delta=worst[0], held_out_delta=None)


def allocate(registry: Registry, lm: LoadedModel, body: AllocateRequest) -> AllocateResponse:
    """(Concurrent identical requests share one search: the route runs this in the heavy executor.)"""
    key = (lm.id, "allocate", body.eval_set, body.metric, body.budget, body.held_out)
    hit = registry.cached(key)
    if hit is None:
        # The allocator brings its own evaluator and only reads the model, so it runs
        # without the model's lock: live edits are not held up by a search of seconds.
        result = run_allocation(lm.model, lm.batch(body.eval_set), body.budget, metric=body.metric)
        baseline, _, _ = _losses(registry, lm, lm.plan, body.eval_set, False)
        held_out: str | None = body.held_out
        # the chosen plan on a set it was not chosen on: the honest number
        held_loss, held_base = held_out_losses(registry, lm, result.plan, str(held_out)) or (None, None)
        if held_loss is None:
            held_out = None
        T = lm.info.seq_len
        hit = AllocateResponse(
            windows=plan_to_json(result.plan, T), eval_set=body.eval_set, loss=float(result.loss),
            baseline_loss=baseline, held_out=held_out, held_out_loss=held_loss, held_out_baseline_loss=held_base,
            curve=[CurvePoint(acr=p["acr"], causal_coverage=p["causal_coverage"], kv_bytes=p.get("kv_bytes"),
                              loss=p["loss"]) for p in result.curve],
            **coverage_metrics(result.plan, T, lm.model.sinks),
        )
        registry.remember(key, hit)
    return hit


# the dashboard's cold open sweeps a model of up to this many heads, and reads a larger one's
# retained-mass curves instead (frontend/cold_open.py SWEEP_LIMIT; tests/backend/test_warm_up.py)
OPENING_SWEEP_HEADS = 64
WARM_EVAL_SET = "mixed"  # the editor's default eval set (EvaluateRequest's)


def warm_up(registry: Registry, models: list[LoadedModel]) -> None:
    """What the editor's first visit asks of each model, computed now into the result cache: its own
    plan's losses with per-token losses (the first POST /evaluate), and the opening line's numbers
    (the one-head sweep with its held-out check, or the retained-mass curves). A failure is logged,
    never fatal: the first visit then computes it."""
    for lm in models:
        t0 = time.perf_counter()
        try:
            _losses(registry, lm, lm.plan, WARM_EVAL_SET, True)
            if lm.info.n_layer * lm.info.n_head <= OPENING_SWEEP_HEADS:
                sensitivity(registry, lm, WARM_EVAL_SET)
            else:
                retained_mass(registry, lm, None)
        except Exception:  # a model that loads but cannot evaluate answers its own error on use
            logger.exception("warm-up of model %s failed", lm.id)
            continue
        logger.info("model %s warmed up in %.1f s", lm.id, time.perf_counter() - t0)
