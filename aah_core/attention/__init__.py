"""windowed_attention(): attention in which every head has its own causal window.

Semantics (one definition everywhere): head h with window w lets query i attend keys j
with i - w < j <= i, and with s sink tokens also keys j < s (j <= i always; StreamingLLM's
rule). Backends are modules with NAME, SUPPORTS_GRAD, available(device) and
attend(q, k, v, windows, dropout_p, scale, sinks); optionally supports_grad(device) (which
then overrides SUPPORTS_GRAD) and check_inputs(device, dtype, dropout_p, head_dim, sinks) -> reason or "".

`auto` picks the fastest usable backend (bench/attention.py has the measurements):
CPU -> banded (compiled flex is forward-only there, slower to start and not faster);
CUDA in float16/bfloat16 -> flex, else flash, else banded, each only if it can take the dtype,
the head dim, the dropout and the gradient the call needs; CUDA in float32 -> banded, or flex for a
small call (B*H*T^2 under SMALL_SCORES). If the chosen kernel still refuses a call
(flex past its recompile limit in a long-running server), `auto` runs it on banded and
logs why once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType

import torch

from aah_core.attention import banded, flash, flex, reference
from aah_core.errors import BackendUnavailable
from aah_core.windows import check_head_windows, check_sinks

BACKENDS: dict[str, ModuleType] = {m.NAME: m for m in (reference, banded, flex, flash)}
# Measured on an NVIDIA H200 (bench/results/attention-gpu-*.json, 2026-12-04): in bfloat16, compiled flex (one
# kernel with a block mask) beat flash (one varlen call per window bucket) in every row at batch 16 and in most at
# batch 1. In float32 (flash takes none) banded beat flex in every row from B*H*T^2 = 134 M scores up (T = 4096 at
# batch 1, and batch 16). Below that both are bound by launches and flex wins: a second H200 run
# (bench/results/attention-gpu-threshold*-float32.json, bench/gpu_threshold.sh) had flex ahead or level at 8-64 M
# scores (T = 1024 at batch 1-8, T = 2048 at batch 1-2; the mixed plan 1.3-3.3x faster at 8-32 M) and banded
# ahead at 128 M (T = 2048 at batch 4, T = 4096 at batch 1: 1.1-1.6x); SMALL_SCORES lies between the two.
AUTO_ORDER = {"cuda": {"half": ("flex", "flash", "banded"), "full": ("banded",), "small full": ("flex", "banded")}}
SMALL_SCORES = 96 * 2**20  # B*H*T^2 under which a float32 call on CUDA counts as small
logger = logging.getLogger(__name__)
_fallbacks_logged: set[str] = set()

__all__ = ["windowed_attention", "available_backends", "backend_status", "resolve_backend", "BACKENDS"]


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Names of the backends that can run on `device` on this machine."""
    device = torch.device(device)
    return [name for name, mod in BACKENDS.items() if mod.available(device)[0]]


def backend_status(device: torch.device | str = "cpu") -> dict[str, str]:
    """Every backend's name -> "" when usable on `device`, else the reason it is not."""
    device = torch.device(device)
    status = {name: mod.available(device) for name, mod in BACKENDS.items()}
    return {name: "" if ok else reason for name, (ok, reason) in status.items()}


def supports_grad(mod: ModuleType, device: torch.device) -> bool:
    """Whether a backend module can backpropagate on `device`."""
    fn = getattr(mod, "supports_grad", None)
    return bool(fn(device)) if fn is not None else bool(mod.SUPPORTS_GRAD)


def _why_not(
    mod: ModuleType,
    device: torch.device,
    needs_grad: bool,
    dtype: torch.dtype | None,
    dropout_p: float,
    head_dim: int | None,
    sinks: int = 0,
) -> str:
    ok, reason = mod.available(device)
    if not ok:
        return f"unavailable on {device}: {reason}"
    if needs_grad and not supports_grad(mod, device):
        return f"forward-only on {device.type}; gradients were requested (use 'banded' or torch.no_grad())"
    check = getattr(mod, "check_inputs", None)
    if check is not None and dtype is not None:
        return check(device, dtype, dropout_p, head_dim, sinks)
    return ""


def auto_order(device: torch.device, dtype: torch.dtype | None, scores: int | None = None) -> tuple[str, ...]:
    """The backends `auto` tries, fastest first, for a device, a dtype (None: as float32) and the call's size in
    scores, B*H*T^2 (None: large)."""
    orders = AUTO_ORDER.get(device.type)
    if orders is None:
        return ("banded",)
    if dtype in (torch.float16, torch.bfloat16):
        return orders["half"]
    return orders["small full" if scores is not None and scores < SMALL_SCORES else "full"]


def resolve_backend(
    backend: str,
    device: torch.device,
    needs_grad: bool,
    dtype: torch.dtype | None = None,
    dropout_p: float = 0.0,
    head_dim: int | None = None,
    sinks: int = 0,
    scores: int | None = None,
) -> ModuleType:
    """The backend module for a name (or `auto`: see auto_order; `scores` is the call's B*H*T^2), or a
    BackendUnavailable saying why it can't run."""
    device = torch.device(device)
    if backend == "auto":
        for name in auto_order(device, dtype, scores):
            if not _why_not(BACKENDS[name], device, needs_grad, dtype, dropout_p, head_dim, sinks):
                return BACKENDS[name]
        return BACKENDS["banded"]
    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {backend!r}; choose one of {['auto', *BACKENDS]}")
    reason = _why_not(BACKENDS[backend], device, needs_grad, dtype, dropout_p, head_dim, sinks)
    if reason:
        raise BackendUnavailable(f"backend {backend!r}: {reason}")
    return BACKENDS[backend]


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, T, D]; got {getattr(t, 'shape', type(t))}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point; got {t.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
            "they must match [B, H, T, D]"
        )
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError("q, k, v must share one dtype and one device")


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: Sequence[int] | torch.Tensor,
    backend: str = "auto",
    dropout_p: float = 0.0,
    scale: float | None = None,
    sinks: int = 0,
) -> torch.Tensor:
    """Causal attention with one window per head.

    Args:
        q, k, v: [B, H, T, D] floating tensors.
        windows: H integers >= 1 (a window >= T is full causal attention).
        backend: "auto" or one of available_backends().
        dropout_p: attention-probability dropout (applied whenever > 0).
        scale: score scale; default 1/sqrt(D).
        sinks: every query also sees the first `sinks` keys (StreamingLLM's attention sinks); 0 = none.
    Returns:
        [B, H, T, D].
    """
    _check_qkv(q, k, v)
    head_windows = check_head_windows(windows, q.shape[1])
    sinks = check_sinks(sinks)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    B, H, T, D = q.shape
    mod = resolve_backend(backend, q.device, needs_grad, q.dtype, dropout_p, D, sinks, scores=B * H * T * T)
    try:
        return mod.attend(q, k, v, head_windows, dropout_p, scale, sinks)
    except BackendUnavailable as exc:
        if backend != "auto" or mod is banded:
            raise
        if str(exc) not in _fallbacks_logged:
            _fallbacks_logged.add(str(exc))
            logger.warning("auto attention falls back to 'banded': %s", exc)
        return banded.attend(q, k, v, head_windows, dropout_p, scale, sinks)


