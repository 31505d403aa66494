"""A decoding step of a block in one C call (attention/step_kernel.c's aah_block_step).

A decode step of a small model is a few dozen operations per block whose fixed costs (Python, dispatch, nn.Module
attribute reads at 1-2 us each on a 2-core box) are most of its time. model.py's Block.cached hands a float32 CPU
step, whose cache reads its rings without masks (kvcache.LayerKVCache.step_block), to one call: layer norm, q k v
projection and rotary; the step's key and value into the cache and attention over its rings (decode_kernel.c);
output projection and residual, layer norm, MLP with the exact GELU, residual. A BlockStep reads the block's
parameters once per KV cache (a generation) and holds them: a model moved or cast between generations is read
again.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from aah_core.attention import native


def _parameters(block: Any) -> tuple[torch.Tensor | None, ...]:
    """What aah_block_step reads of a model.py Block, in its order (the rotary tables included)."""
    attn, mlp = block.attn, block.mlp
    rotary = (attn.rotary.cos, attn.rotary.sin) if attn.rotary is not None else (None, None)
    return (block.ln1.weight, block.ln1.bias, attn.qkv.weight, *rotary, attn.proj.weight, block.ln2.weight,
            block.ln2.bias, mlp.fc.weight, mlp.fc.bias, mlp.proj.weight, mlp.proj.bias)


class BlockStep:
    """One block's parameters as aah_block_step takes them (addresses, with the tensors they point into)."""

    def __init__(self, block: Any) -> None:
        attn = block.attn
        self.n_head, self.hidden = attn.n_head, block.mlp.fc.out_features
        # detached: views that keep the storage the addresses point into, whatever becomes of the parameters
        self._tensors = tuple(t.detach() for t in _parameters(block) if t is not None)
        self._addresses = (ctypes.c_int64 * len(self._tensors))(*(t.data_ptr() for t in self._tensors))
        self._eps = (ctypes.c_float * 2)(block.ln1.eps, block.ln2.eps)
        self._positions = attn.rotary.cos.shape[0]
        self._lib = native.library()

    @staticmethod
    def takes(block: Any) -> bool:
        """Whether a model.py Block's steps can run here: rotary positions, no observer, float32 CPU parameters
        (biases included), a width and an MLP that are multiples of 16, heads of 16-128 in multiples of 16."""
        attn, mlp = block.attn, block.mlp
        width = attn.proj.weight.shape[0]
        head = width // attn.n_head
        return (attn.rotary is not None and attn.observer is None and native.steps(*_parameters(block))
                and width % 16 == 0 and mlp.fc.out_features % 16 == 0 and head % 16 == 0 and head <= 128)

    def __call__(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rings: native.Rings, pos: int,
                 threads: int, parallel_work: int) -> torch.Tensor:
        """Rows x [B, C] (float32, contiguous) at position pos -> the block's output rows [B, C]; the step's keys
        and values go into the cache's k, v [B, slots, D] (contiguous) at their slots of `rings`, whose positions
        attention reads on up to `threads` threads when they are at least `parallel_work` floats of keys."""
        B, C = rows.shape
        out = rows.new_empty(B, C)
        rc = self._lib.aah_block_step(rows.data_ptr(), out.data_ptr(), B, C, self.n_head, self.hidden,
                                      self._addresses, self._eps, self._positions, k.data_ptr(), v.data_ptr(),
                                      k.shape[1], rings.n, rings.first, rings.capacity, rings.window, pos, threads,
                                      parallel_work)
        if rc != 0:
            raise RuntimeError(f"step_kernel.c returned {rc} for rows {tuple(rows.shape)}, {self.n_head} heads, "
                               f"{rings.n} kv heads, position {pos}")
        return out
