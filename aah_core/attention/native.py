"""CPU attention and decoding steps in C (aah_core/attention/*.c), built on first use with the machine's compiler.

ATen's CPU flash kernel, which the banded backend runs a window's blocks through, costs about twice as much
per score on blocks of 32 queries and c + w - 1 keys as on long rows (issue 26: at T = 4096, D = 32 a window of
64 cost 0.8 ms a head, a quarter of a full head's 6.5 ms for 1/32 of its scores). band_kernel.c computes each
head's band directly, full heads as the widest band: the heads of a layer in one call, no block views, no
copies, no split of a causal head and merge, its threads dealt equal work. It is float32 only, with a backward
(BandAttention) that recomputes each tile's probabilities from the saved log-sum-exps. banded.attend uses it for
calls without dropout, with or without a gradient or sink tokens, for the heads where it measured faster
(banded.NATIVE_MAX_WORK), and keeps ATen for the others and for everything else. decode_kernel.c is a decoding
step's attention over a KV cache's rings (inference/kvcache.py), one call per layer; step_kernel.c a whole
decoding step of a block around it (inference/block_step.py).

The sources are compiled once per process (about 0.3 s) into a private temporary folder with the host's
instruction set (-march=native), loaded with ctypes and the file removed; nothing is cached on disk, so a
shared home folder never hands one machine another machine's build. Without a C compiler, on a CPU without
AVX2, or with AAH_NATIVE_ATTENTION=0 in the environment, `available()` says why and banded keeps ATen.
ctypes lets go of the interpreter lock for the call, so a service's other threads run meanwhile.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
from torch.autograd.function import once_differentiable

logger = logging.getLogger(__name__)

# one library from these (and kernel.h): windowed attention, a decoding step's attention and the rest of its
# blocks, the pool and threads they share
SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("band_kernel.c", "decode_kernel.c", "step_kernel.c", "kernel.c"))
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", "-pthread")
_lock = threading.Lock()
_built: tuple[ctypes.CDLL | None, str] | None = None  # (library, "") or (None, why not)


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("AAH_NATIVE_ATTENTION", "1") == "0":
        return None, "turned off (AAH_NATIVE_ATTENTION=0)"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return None, f"measured only on x86 CPUs with AVX2; this CPU has {capability}"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang; or $CC) on PATH"
    try:  # (a full disk, no temporary folder, a folder mounted noexec: ATen it is, for this process)
        with tempfile.TemporaryDirectory(prefix="aah-kernel-") as folder:
            target = Path(folder) / "aah_kernels.so"
            done = subprocess.run([cc, *FLAGS, "-o", str(target), *map(str, SOURCES), "-lm"], capture_output=True,
                                  text=True, timeout=120)
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or [""])[0][:300]
                return None, f"{cc} could not build {SOURCES[0].parent.name}/*.c: {first}"
            lib = ctypes.CDLL(str(target))  # mapped: the file can go with its folder
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not build and load {SOURCES[0].parent.name}/*.c with {cc}: {exc}"
    shape: list[Any] = [ctypes.POINTER(ctypes.c_int64), *[ctypes.c_int64] * 4, ctypes.POINTER(ctypes.c_int64),
                        ctypes.c_int64, ctypes.c_float, ctypes.c_int]  # strides, B, H, T, D, windows, sinks, scale, threads
    for fn, pointers in ((lib.aah_band_attention, 5), (lib.aah_band_attention_backward, 9)):
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * pointers + shape
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.aah_decode_step.restype = ctypes.c_int
    lib.aah_decode_step.argtypes = [*[pointer] * 6, ctypes.POINTER(size), *[size] * 4, *[ctypes.POINTER(size)] * 3,
                                    size, ctypes.c_float, ctypes.c_int, size]
    lib.aah_block_step.restype = ctypes.c_int
    lib.aah_block_step.argtypes = [*[pointer] * 2, *[size] * 4, ctypes.POINTER(size), ctypes.POINTER(ctypes.c_float),
                                   size, *[pointer] * 2, *[size] * 2, *[ctypes.POINTER(size)] * 3, size, ctypes.c_int,
                                   size]
    merge = lib.aah_merge_halves
    merge.restype = None
    merge.argtypes = [ctypes.c_void_p] * 6 + [ctypes.POINTER(ctypes.c_int64)] + [ctypes.c_int64] * 4
    return lib, ""


def _library() -> tuple[ctypes.CDLL | None, str]:
    global _built
    with _lock:
        if _built is None:
            _built = _build()
            if _built[0] is None:
                logger.info("windowed attention runs on ATen's kernels only: %s", _built[1])
        return _built


def available() -> tuple[bool, str]:
    """Whether the kernel can run here, and why not (builds it on the first call)."""
    lib, reason = _library()
    return lib is not None, reason


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether these q, k, v [B, H, T, D] can go to the kernel: CPU float32, rows contiguous, D a multiple of 16
    (a vector's floats), and a build here."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and all(t.stride(-1) == 1 for t in (q, k, v))
            and q.shape[3] % 16 == 0 and q.shape[2] < 2**30 and _library()[0] is not None)


def band_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: tuple[int, ...],
                   scale: float | None, out: torch.Tensor, lse: torch.Tensor | None = None, sinks: int = 0) -> None:
    """Write into out [B, H, T, D] (rows contiguous) the windowed attention of every head whose window is not 0
    (a window >= T: causal attention), every query also seeing the first `sinks` keys; rows of heads with window 0
    are left as they are. q, k, v: [B, H, T, D], float32, CPU, D a multiple of 16 (usable()). lse: None, or a
    contiguous float32 [B, H, T] to get each row's log-sum-exp of its scaled scores (what
    band_attention_backward takes)."""
    lib = _library()[0]
    assert lib is not None, "call usable() first"
    B, H, T, D = q.shape
    if lse is not None and (lse.shape != (B, H, T) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 [B, H, T] = {(B, H, T)}, not {tuple(lse.shape)}")
    strides = (ctypes.c_int64 * 12)(*(s for t in (q, k, v, out) for s in t.stride()[:3]))
    rc = lib.aah_band_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                None if lse is None else lse.data_ptr(), strides, *_shape(q, windows, sinks, scale))
    if rc != 0:
        raise RuntimeError(f"band_kernel.c returned {rc} for q {tuple(q.shape)} and windows {windows}")


def band_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                            grad: torch.Tensor, windows: tuple[int, ...], scale: float | None, sinks: int = 0,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v from `grad`, the gradient of band_attention's `out` (with its `lse`), every window
    at least 1. Each comes laid out (B, T, H, D), as the model's fused projection is."""
    lib = _library()[0]
    assert lib is not None, "call usable() first"
    B, H, T, D = q.shape
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    dq = q.new_empty(B, T, H, D).transpose(1, 2)
    dk, dv = (q.new_zeros(B, T, H, D).transpose(1, 2) for _ in range(2))  # added to, run by run
    tensors = (q, k, v, out, grad, dq, dk, dv)
    strides = (ctypes.c_int64 * 24)(*(s for t in tensors for s in t.stride()[:3]))
    rc = lib.aah_band_attention_backward(*(t.data_ptr() for t in tensors[:5]), lse.data_ptr(),
                                         *(t.data_ptr() for t in tensors[5:]), strides, *_shape(q, windows, sinks, scale))
    if rc != 0:
        raise RuntimeError(f"band_kernel.c's backward returned {rc} for q {tuple(q.shape)} and windows {windows}")
    return dq, dk, dv


def _shape(q: torch.Tensor, windows: tuple[int, ...], sinks: int, scale: float | None) -> tuple:
    """The kernel's arguments after the strides: B, H, T, D, windows, sinks, scale, threads."""
    B, H, T, D = q.shape
    return (B, H, T, D, (ctypes.c_int64 * H)(*windows), sinks, D**-0.5 if scale is None else scale,
            torch.get_num_threads())


class BandAttention(torch.autograd.Function):
    """band_attention with a gradient: the forward keeps each row's log-sum-exp, the backward is
    band_attention_backward (every window at least 1; no gradient of the gradient)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: tuple[int, ...],
                scale: float | None, sinks: int = 0) -> torch.Tensor:
        B, H, T, D = q.shape
        out = q.new_empty(B, T, H, D).transpose(1, 2)  # laid out as SDPA's: the model's reshape is a view
        lse = q.new_empty(B, H, T)
        band_attention(q, k, v, windows, scale, out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.windows, ctx.scale, ctx.sinks = windows, scale, sinks
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        return (*band_attention_backward(q, k, v, out, lse, grad, ctx.windows, ctx.scale, ctx.sinks), None, None, None)


def decodes(k: torch.Tensor) -> bool:
    """Whether decode_step (and inference/block_step.py) take a cache whose keys are k [B, slots, D] here."""
    D = k.shape[-1]
    return (k.device.type == "cpu" and k.dtype == torch.float32 and k.is_contiguous() and D % 16 == 0 and D <= 128
            and _library()[0] is not None)


class Rings:
    """Where a cache's kv heads keep their positions (decode_step): kv head j's ring is the capacity[j] slots from
    first[j], position p in its slot p mod window[j]. Made once per layout of the cache."""

    def __init__(self, first: list[int], capacity: list[int], window: list[int]) -> None:
        ints = ctypes.c_int64 * len(first)
        self.first, self.capacity, self.window = ints(*first), ints(*capacity), ints(*window)
        self.n = len(first)


def decode_step(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rings: Rings, pos: int, scale: float | None, threads: int, parallel_work: int) -> torch.Tensor:
    """One decoding step at position `pos` (decode_kernel.c): the step's k_new, v_new [B, n_kv, 1, D] go into
    their slots of the cache's k, v [B, slots, D] (contiguous), then q [B, H, 1, D] attends, query heads
    j*g .. (j+1)*g - 1 to every position kv head j's ring holds; on up to `threads` threads when the keys read
    are at least `parallel_work` floats. float32 on CPU (decodes()). Returns [B, H, 1, D]."""
    lib = _library()[0]
    assert lib is not None, "call decodes() first"
    B, H, _, D = q.shape
    q, k_new, v_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_new, v_new))
    out = q.new_empty(B, H, 1, D)
    strides = (ctypes.c_int64 * 12)(*(s for t in (q, k_new, v_new, k, v, out) for s in t.stride()[:2]))
    rc = lib.aah_decode_step(q.data_ptr(), k_new.data_ptr(), v_new.data_ptr(), k.data_ptr(), v.data_ptr(),
                             out.data_ptr(), strides, B, rings.n, H // rings.n, D, rings.first, rings.capacity,
                             rings.window, pos, D**-0.5 if scale is None else scale, threads, parallel_work)
    if rc != 0:
        raise RuntimeError(f"decode_kernel.c returned {rc} for q {tuple(q.shape)} and k {tuple(k.shape)} at {pos}")
    return out


def steps(*tensors: torch.Tensor | None) -> bool:
    """Whether step_kernel.c (inference/block_step.py) can take these tensors (a block's parameters) here: each
    there, CPU float32 and contiguous; the library built."""
    return all(t is not None and t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
               for t in tensors) and _library()[0] is not None


def library() -> ctypes.CDLL:
    """The built library (after available(), decodes() or steps() said yes)."""
    lib = _library()[0]
    assert lib is not None, "ask available() first"
    return lib


def merges(out: torch.Tensor) -> bool:
    """Whether merge_halves can write `out` (CPU float32, rows contiguous) here."""
    return out.device.type == "cpu" and out.dtype == torch.float32 and out.stride(-1) == 1 and _library()[0] is not None


def merge_halves(first: torch.Tensor, near: torch.Tensor, near_lse: torch.Tensor, far: torch.Tensor,
                 far_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Causal attention split in halves, put together (banded.balanced_causal): out [B, H, 2h, D] gets rows
    `first` [B, H, h, D], then the rows whose keys were split in two, `near` and `far` [B, H, h, D] weighted by
    their log-sum-exps near_lse, far_lse [B, H, h]. float32 on CPU, every matrix's rows contiguous."""
    lib = _library()[0]
    assert lib is not None, "call merges() first"
    B, H, h, D = first.shape
    matrices = (first, near, far, out)
    if any(t.dtype != torch.float32 for t in (*matrices, near_lse, far_lse)) or any(t.stride(-1) != 1 for t in matrices):
        raise ValueError("merge_halves takes float32 tensors, the matrices' rows contiguous")
    parts = (first, near, near_lse, far, far_lse, out)
    strides = (ctypes.c_int64 * 18)(*(s for t in parts for s in t.stride()[:3]))
    lib.aah_merge_halves(first.data_ptr(), near.data_ptr(), near_lse.data_ptr(), far.data_ptr(), far_lse.data_ptr(),
                         out.data_ptr(), strides, B, H, h, D)
