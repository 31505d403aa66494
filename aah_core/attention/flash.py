"""The `flash` backend (CUDA only): one windowed FlashAttention call per window bucket.

FlashAttention takes one window per call, so heads are grouped by window (banded.buckets)
and each bucket runs with ``window_size=(w-1, 0)``: FA's bounds are inclusive, so w-1 keys
to the left plus the query itself is exactly our w keys. Kernels skip the tiles left of
the window. Two providers, in order: the ``flash_attn`` package (dropout supported), then
torch's own ``torch.nn.attention.varlen.varlen_attn`` when it accepts ``window_size``.
Both take float16/bfloat16 only. Neither has sink tokens (a window plus the first s keys
is not one contiguous band, and merging a separate sink block needs the kernel's log-sum-exp
with a gradient, which these kernels don't give), so calls with sinks > 0 are refused here
and `auto` takes flex or banded for them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from aah_core.attention.banded import run_buckets
from aah_core.errors import BackendUnavailable

NAME = "flash"
SUPPORTS_GRAD = True  # on CUDA, the only device it runs on
MAX_HEAD_DIM = 256  # FlashAttention-2 kernels: head dim a multiple of 8, at most 256


@functools.cache
def _provider() -> tuple[str, Callable[..., Any] | None, str]:
    """(name, function, why-not) for the first usable windowed flash kernel."""
    try:
        from flash_attn import flash_attn_func

        return "flash_attn", flash_attn_func, ""
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return "", None, "flash_attn is not installed and this torch has no torch.nn.attention.varlen"
    if "window_size" not in inspect.signature(varlen_attn).parameters:
        return "", None, "flash_attn is not installed and torch's varlen_attn takes no window_size"
    return "varlen_attn", varlen_attn, ""


def available(device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, "flash kernels run on CUDA only; this device is " + device.type
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 0):
        return False, f"flash kernels need an sm80+ GPU (Ampere or newer); this one is sm{major}{minor}"
    name, _, why = _provider()
    return (True, "") if name else (False, why)


def supports_grad(device: torch.device) -> bool:
    return device.type == "cuda"


def check_inputs(
    device: torch.device, dtype: torch.dtype, dropout_p: float, head_dim: int | None = None, sinks: int = 0
) -> str:
    """Reason flash can't run such inputs, or ""."""
    if sinks > 0:
        return "flash kernels have no sink tokens (one contiguous window per call); use 'flex' or 'banded' for sinks"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash kernels take float16/bfloat16, not {dtype}; use 'flex' or 'banded' for {dtype}"
    if head_dim is not None and (head_dim % 8 or head_dim > MAX_HEAD_DIM):
        return f"flash kernels need a head dim that is a multiple of 8 and at most {MAX_HEAD_DIM}; got {head_dim}"
    if dropout_p > 0.0 and _provider()[0] != "flash_attn":
        return "torch's varlen_attn has no dropout; install flash_attn or use 'banded' to train with dropout"
    return ""


def _bucket(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, dropout_p: float, scale: float | None
) -> torch.Tensor:
    """One kernel call. q, k, v: [B, Hb, T, D] -> [B, Hb, T, D]."""
    B, Hb, T, D = q.shape
    left = -1 if w >= T else w - 1  # -1: no left limit (plain causal)
    name, fn, why = _provider()
    assert fn is not None, why  # attend() ran only after available() found a provider
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, T, Hb, D)
    if name == "flash_attn":
        out = fn(qt, kt, vt, dropout_p=dropout_p, softmax_scale=scale, causal=True, window_size=(left, 0))
        return out.transpose(1, 2)  # (B, Hb, T, D)
    cu = torch.arange(0, (B + 1) * T, T, device=q.device, dtype=torch.int32)  # fixed-length sequences
    packed = [t.reshape(B * T, Hb, D) for t in (qt, kt, vt)]  # (B*T, Hb, D)
    out = fn(*packed, cu, cu, T, T, scale=scale, window_size=(left, 0))
    return out.view(B, T, Hb, D).transpose(1, 2)  # (B, Hb, T, D)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
    sinks: int = 0,
) -> torch.Tensor:
    """q, k, v: [B, H, T, D] on CUDA, float16/bfloat16; windows: H ints >= 1; sinks must be 0. Returns [B, H, T, D]."""
    ok, why = available(q.device)
    reason = why if not ok else check_inputs(q.device, q.dtype, dropout_p, q.shape[-1], sinks)
    if reason:
        raise BackendUnavailable(f"backend 'flash': {reason}")
    def bucket(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, w: int) -> torch.Tensor:
        return _bucket(qb, kb, vb, w, dropout_p, scale)

    return run_buckets(q, k, v, windows, bucket)
