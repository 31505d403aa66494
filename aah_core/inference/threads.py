"""A decode step's small operations on one intra-op thread, for the calling thread only.

A decode step is ~70 small operations. With torch's threads (the cores) the ones that open an OpenMP region
(MKL's GEMMs, attention calls over a few heads) each wake the other threads for a few microseconds of work:
with threads that sleep at barriers (OMP_WAIT_POLICY=PASSIVE, which `aah`, `make` and bench/ set) a wake
costs tens of microseconds, and a scheduler slice when another process holds a core. So a decode step runs
under one_thread(), and only an attention call with enough work to split (kvcache) gets the threads back
through all_threads(). bench/decode_threads.py measures it (issue 26, item 2; README).

`torch.set_num_threads` cannot be scoped safely in a service that evaluates on other threads meanwhile:
it also sets the process-wide count that every thread copies on its first parallel operation (a worker
thread starting during a decode step would keep one thread for good) and resizes the global pthreadpool.
These scopes set only the calling thread's own settings, through the libraries' C entry points: OpenMP's
`omp_set_num_threads` (the calling thread's nthreads-var) and MKL's `MKL_Set_Num_Threads_Local`. Where
torch does not run on OpenMP (no libgomp / libiomp loaded) both scopes do nothing.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _loaded(names: list[str], symbol: str) -> Any:
    """The first already-loaded library among `names` that exports `symbol` (never loads one)."""
    for name in names:
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        if hasattr(lib, symbol):
            return lib
    return None


_OMP = _loaded(["libgomp.so.1", "libiomp5.so", "libomp.so"], "omp_set_num_threads")
_MKL = _loaded([os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"), "libmkl_rt.so.2"],
               "MKL_Set_Num_Threads_Local")
_scope = threading.local()  # .saved: (omp, mkl) of the thread's enclosing one_thread() block, if any


def available() -> bool:
    """Whether the scopes act here (torch's intra-op threads are OpenMP's)."""
    return _OMP is not None


def _set(omp: int, mkl: int | None) -> int | None:
    """Set this thread's OpenMP count (and MKL's, when given); returns MKL's previous local count."""
    previous = _MKL.MKL_Set_Num_Threads_Local(mkl) if _MKL is not None and mkl is not None else None
    _OMP.omp_set_num_threads(omp)
    return previous


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch work of this thread inside the block runs on one intra-op thread; other threads are untouched."""
    if _OMP is None or getattr(_scope, "saved", None) is not None or torch.get_num_threads() == 1:
        yield  # (torch.get_num_threads runs torch's first setup of this thread, which would reset the count)
        return
    omp = _OMP.omp_get_max_threads()
    _scope.saved = (omp, _set(1, 1))
    try:
        yield
    finally:
        omp, mkl = _scope.saved
        _scope.saved = None
        _set(omp, mkl)  # (MKL's previous local count; 0 is its process-wide one)


@contextmanager
def all_threads() -> Iterator[None]:
    """Inside one_thread(): this block gets the thread's own count back (one attention call worth splitting)."""
    saved = getattr(_scope, "saved", None)
    if saved is None:
        yield
        return
    _set(*saved)
    try:
        yield
    finally:
        _set(1, 1)
