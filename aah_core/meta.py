"""Models built for their shapes only: on the meta device, with no weight initialisation.

Checking a checkpoint's tensors against the model its config describes needs that model's shapes, never
its values. Built on the meta device nothing is allocated, but each initialiser (``nn.init.normal_`` and
the like) still runs there, through PyTorch's Python meta kernels, whose first call imports torch._dynamo:
about 1.7 s of CPU in a process that needs nothing else of it (an API start, an upload check). Meta
tensors hold no values, so skipping those calls changes nothing about the model that is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# What initialisers do to a tensor in place: torch.nn.init's functions and the tensor methods they call.
_INITIALISERS = frozenset({
    "normal_", "uniform_", "trunc_normal_", "constant_", "zeros_", "ones_", "eye_", "dirac_", "sparse_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
    "zero_", "fill_", "copy_", "exponential_", "log_normal_", "cauchy_", "geometric_", "bernoulli_", "random_",
})


class _SkipInitOnMeta(TorchFunctionMode):
    """Returns the tensor unchanged for an initialiser called on a meta tensor; runs everything else."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if getattr(func, "__name__", None) in _INITIALISERS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


@contextmanager
def shapes_only() -> Iterator[None]:
    """Modules built inside are on the meta device and left uninitialised (for their shapes only)."""
    with torch.device("meta"), _SkipInitOnMeta():
        yield
