"""How the engine's programs (`aah`, the API and its workers, bench/) set up their process.

- **OpenMP threads sleep at barriers** (OMP_WAIT_POLICY=PASSIVE): on a shared CPU, spinning made training
  5-20x slower (bench/__init__.py). It must be in the environment before torch loads libgomp.
- **Freed memory is kept for reuse** (glibc's malloc): by default glibc maps every allocation above a
  threshold (at most 32 MB) afresh and unmaps it when freed, so the next one faults in every page again. A
  prefill at batch 8 (T = 4096, the demo's width) allocates several such tensors per layer (64 MB of MLP
  activations, 50 MB of q, k and v): 92,000-140,000 page faults and 0.18-0.27 s of system time per prefill on
  the 2 vCPU Xeon box (issue 26). With every allocation served from the heap and up to KEEP_FREED_BYTES of
  freed memory kept at its top, a few hundred faults are left and the prefill took 0.69 s instead of 0.81 s
  (the full plan's 1.29 s instead of 1.39 s). The price: the process keeps up to that much freed memory.
  AAH_KEEP_FREED_MEMORY=0 turns it off; MALLOC_MMAP_MAX_ / MALLOC_TRIM_THRESHOLD_ set by hand win.

Both reach the programs these start through the environment (glibc reads its variables at start-up).
"""

from __future__ import annotations

import ctypes
import os

KEEP_FREED_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def set_up() -> None:
    """Both settings for this process and the ones it starts; call before torch is imported (for OpenMP)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    keep_freed_memory()


def keep_freed_memory() -> bool:
    """Serve allocations from glibc's heap and keep up to KEEP_FREED_BYTES of freed memory (see above); whether
    it was applied here (not on other C libraries, not with AAH_KEEP_FREED_MEMORY=0)."""
    if os.environ.get("AAH_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # only glibc has these parameters  # noqa: B018
    except (OSError, AttributeError):
        return False
    settings = {"MALLOC_MMAP_MAX_": (_M_MMAP_MAX, 0), "MALLOC_TRIM_THRESHOLD_": (_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)}
    for name, (parameter, value) in settings.items():
        if name not in os.environ:  # (one set by hand was applied by glibc when this process started)
            libc.mallopt(parameter, value)
            os.environ[name] = str(value)
    return True
