"""windowed_attention(): attention in which every head has its own causal window.

Semantics (one definition everywhere): head h with window w lets query i attend keys j
with i - w < j <= i. Backends are modules with NAME, SUPPORTS_GRAD, available(device)
and attend(q, k, v, windows, dropout_p, scale); `auto` picks the fastest usable one.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from aah_core.attention import banded, reference
from aah_core.errors import BackendUnavailable
from aah_core.windows import check_head_windows

BACKENDS: dict[str, ModuleType] = {m.NAME: m for m in (reference, banded)}

__all__ = ["windowed_attention", "available_backends", "resolve_backend", "BACKENDS"]


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Names of the backends that can run on `device` on this machine."""
    device = torch.device(device)
    return [name for name, mod in BACKENDS.items() if mod.available(device)[0]]


def resolve_backend(backend: str, device: torch.device, needs_grad: bool) -> ModuleType:
    """The backend module for a name (or `auto`), or a clear error saying why it can't run."""
    if backend == "auto":
        return BACKENDS["banded"]
    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {backend!r}; choose one of {['auto', *BACKENDS]}")
    mod = BACKENDS[backend]
    ok, reason = mod.available(device)
    if not ok:
        raise BackendUnavailable(f"backend {backend!r} is unavailable on {device}: {reason}")
    if needs_grad and not mod.SUPPORTS_GRAD:
        raise BackendUnavailable(f"backend {backend!r} is forward-only here; gradients were requested")
    return mod


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, T, D]; got {getattr(t, 'shape', type(t))}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point; got {t.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; they must match [B, H, T, D]"
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
) -> torch.Tensor:
    """Causal attention with one window per head.

    Args:
        q, k, v: [B, H, T, D] floating tensors.
        windows: H integers >= 1 (a window >= T is full causal attention).
        backend: "auto" or one of available_backends().
        dropout_p: attention-probability dropout (applied whenever > 0).
        scale: score scale; default 1/sqrt(D).
    Returns:
        [B, H, T, D].
    """
    _check_qkv(q, k, v)
    head_windows = check_head_windows(windows, q.shape[1])
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    mod = resolve_backend(backend, q.device, needs_grad)
    return mod.attend(q, k, v, head_windows, dropout_p, scale)


