"""The `flex` backend: one compiled FlexAttention call with a per-head block mask.

The block mask is built from window arithmetic (masks.window_block_tables), not from a
dense [H, T, T] evaluation, and cached per (windows, T, device). The kernel skips every
tile outside a head's window. On CPU, Inductor only has a forward kernel, so this backend
is inference-only there; on CUDA it trains.

The compiled path is verified on every call: the compiled function also returns
``torch.compiler.is_compiling()``, which is a constant True inside a compiled graph and
False if Dynamo ever ran the function eagerly (graph break, recompile limit), so a silent
fallback to the unfused, dense flex implementation raises instead of running slowly.

On CPU the kernel only ever sees whole blocks: q, k and v are zero-padded to a multiple of BLOCK
and the output cut back. Inductor's CPU template (torch 2.13) returned wrong rows, some NaN, when
the whole sequence was one partial block of a length that is 8 mod 16 (T = 8, 24, 40, ..., 120;
measured against the float64 reference); other lengths were exact. Padded keys come after every
real query, so the causal window never admits them, and padded queries are dropped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from aah_core.attention.masks import generate_window_mask, window_block_tables
from aah_core.errors import BackendUnavailable

logger = logging.getLogger(__name__)

NAME = "flex"
SUPPORTS_GRAD = False  # not on every device: see supports_grad(device)
BLOCK = 128
RECOMPILE_LIMIT = 32  # distinct (B, T, dtype, ...) shapes per process before we refuse

stats = {"compiled_calls": 0, "eager_calls": 0}  # read by bench/attention.py


def available(device: torch.device) -> tuple[bool, str]:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as exc:  # pragma: no cover - every supported torch has it
        return False, f"torch {torch.__version__} has no FlexAttention ({exc})"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return _cuda_support(device.index if device.index is not None else torch.cuda.current_device())
    if device.type != "cpu":
        return False, f"FlexAttention is not supported on {device.type}"
    return _cpu_support()


@functools.cache
def _cpu_support() -> tuple[bool, str]:
    import shutil

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        capability = torch.backends.cpu.get_cpu_capability()
        return False, f"compiled FlexAttention on CPU needs AVX2; this CPU has {capability}"
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return False, "compiled FlexAttention on CPU needs a C++ compiler (g++) for Inductor"
    return True, ""


@functools.cache
def _cuda_support(index: int) -> tuple[bool, str]:
    """One tiny compiled call, once per GPU: Triton needs a C compiler, Python headers and libcuda,
    and a machine that lacks one fails here instead of in the middle of a training run."""
    try:
        compiled = _probe(torch.device("cuda", index))
    except Exception as exc:  # any compile or launch failure means: not usable here
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return False, f"a tiny compiled FlexAttention call failed on cuda:{index} ({exc.__class__.__name__}: {first_line})"
    if not compiled:
        return False, f"torch.compile ran FlexAttention eagerly on cuda:{index} (dense fallback)"
    return True, ""


def _probe(device: torch.device) -> bool:
    """Compile and run one tiny call on `device`; True when it ran compiled."""
    q = torch.randn(1, 1, BLOCK, 16, device=device)
    return bool(_compiled()(q, q, q, block_mask((BLOCK,), BLOCK, device), None)[1])


def supports_grad(device: torch.device) -> bool:
    """FlexAttention's backward is lowered for CUDA only."""
    return device.type == "cuda"


def check_inputs(
    device: torch.device, dtype: torch.dtype, dropout_p: float, head_dim: int | None = None, sinks: int = 0
) -> str:
    """Reason flex can't run such inputs, or ""."""
    if dropout_p > 0.0:
        return "FlexAttention has no attention dropout; use 'banded' (or 'flash' on CUDA) for dropout"
    if device.type == "cpu" and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"compiled FlexAttention on CPU takes float32/bfloat16/float16, not {dtype}; use 'banded'"
    return ""


@functools.lru_cache(maxsize=64)
@torch.inference_mode(False)  # cached across calls: never an inference tensor, which autograd could not save
def block_mask(windows: tuple[int, ...], T: int, device: torch.device, sinks: int = 0) -> Any:
    """The BlockMask for one layer's windows (and the model's sink keys) at length T (broadcast over batch); cached."""
    from torch.nn.attention.flex_attention import BlockMask

    windows = tuple(min(w, T) for w in windows)
    sinks = min(sinks, T)  # one mask (and one compiled mask_mod) for every sink count >= T
    mask_mod = generate_window_mask(torch.tensor(windows, device=device), sinks)
    return BlockMask.from_kv_blocks(
        *window_block_tables(windows, T, BLOCK, device, sinks),
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(T, T),
    )


def padded_length(T: int, device: torch.device) -> int:
    """The length the kernel runs at: T rounded up to whole blocks on CPU (see the module docstring), T elsewhere."""
    return -(-T // BLOCK) * BLOCK if device.type == "cpu" else T


def _flex_and_flag(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float | None) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=mask, scale=scale), torch.compiler.is_compiling()


@functools.cache
def _compiled() -> Callable[..., Any]:
    # static shapes: one kernel per (B, H, T, D, dtype); dynamic shapes would give the CPU
    # template symbolic block counts for no gain here
    return torch.compile(_flex_and_flag, fullgraph=True, dynamic=False)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    windows: tuple[int, ...],
    dropout_p: float,
    scale: float | None,
    sinks: int = 0,
) -> torch.Tensor:
    """q, k, v: [B, H, T, D]; windows: H ints >= 1; sinks: keys every query also sees. Returns [B, H, T, D]."""
    reason = check_inputs(q.device, q.dtype, dropout_p)
    if reason:
        raise BackendUnavailable(f"backend 'flex': {reason}")
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if wants_grad and not supports_grad(q.device):
        raise BackendUnavailable(
            "backend 'flex' is forward-only on CPU (no CPU backward in Inductor); "
            "use 'banded' to train, or call under torch.no_grad()"
        )
    T = q.shape[-2]
    length = padded_length(T, q.device)
    if length != T:
        q, k, v = (F.pad(t, (0, 0, 0, length - T)) for t in (q, k, v))
    mask = block_mask(tuple(min(w, T) for w in windows), length, q.device, min(sinks, T))
    try:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            out, compiled = _compiled()(q, k, v, mask, scale)
    except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
        raise BackendUnavailable(
            f"backend 'flex': this process already compiled {RECOMPILE_LIMIT} input shapes (the recompile limit); "
            "use 'banded' for new shapes"
        ) from exc
    if not compiled:
        stats["eager_calls"] += 1
        raise BackendUnavailable("backend 'flex': torch.compile fell back to eager FlexAttention (dense)")
    stats["compiled_calls"] += 1
    return out[..., :T, :]
