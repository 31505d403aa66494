"""Window predicates for FlexAttention, attention-gym style, and a vectorised block mask.

Our window semantics: head h with window w lets query q see key k when ``q - w < k <= q``
(w keys, itself included), and also when ``k < sinks`` and ``k <= q``
(the model's sink tokens). attention-gym's sliding window keeps ``q - k <= w``, one key
more; the golden test in tests/core/test_attention_flex.py pins ours against `reference`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def generate_window_mask(windows: torch.Tensor, sinks: int = 0) -> MaskMod:
    """A mask_mod for per-head windows.

    Args:
        windows: [H] integer tensor on the attention's device, one window per head.
        sinks: the first `sinks` keys are seen by every later query besides its window.
    """

    def per_head_window(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return (kv_idx <= q_idx) & ((q_idx - kv_idx < windows[h]) | (kv_idx < sinks))

    per_head_window.__name__ = "per_head_window_" + "_".join(str(w) for w in windows.tolist()) + (f"_s{sinks}" if sinks else "")
    return per_head_window


def window_block_tables(
    windows: tuple[int, ...], T: int, block: int, device: torch.device, sinks: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which block x block tiles each head's window touches, without a dense [H, T, T] mask.

    Returns (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices) in
    BlockMask.from_kv_blocks layout: counts [1, H, nQ] and indices [1, H, nQ, nK], int32.
    "Partial" tiles need the mask_mod; "full" tiles are entirely inside the window. A tile
    that holds a position >= T is never called full, so padding always goes through mask_mod.
    """
    n = -(-T // block)
    w = torch.tensor(windows, device=device).clamp(max=T).view(-1, 1, 1)  # (H, 1, 1)
    starts = torch.arange(n, device=device) * block
    ends = (starts + block - 1).clamp(max=T - 1)
    q_lo, q_hi = starts.view(1, n, 1), ends.view(1, n, 1)  # (1, nQ, 1)
    k_lo, k_hi = starts.view(1, 1, n), ends.view(1, 1, n)  # (1, 1, nK)
    # some pair q - w < k <= q in the tile: the lowest key is not after the highest query,
    # and the highest key is inside the window of the lowest query
    # (or the tile's lowest key is a sink)
    touched = (k_lo <= q_hi) & ((k_hi > q_lo - w) | (k_lo < sinks))  # (H, nQ, nK)
    whole = (starts + block <= T).view(1, 1, n)
    # full: every key is causal for every query and either all inside every query's window or all sinks
    inside = (k_lo > q_hi - w) | (k_hi < sinks)
    full = (k_hi <= q_lo) & inside & whole & whole.transpose(1, 2)  # (H, nQ, nK)
    partial = touched & ~full
    return (*_to_kv_blocks(partial), *_to_kv_blocks(full))


def _to_kv_blocks(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[H, nQ, nK] bool -> counts [1, H, nQ] and indices [1, H, nQ, nK] (selected tiles first)."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts.unsqueeze(0), order.to(torch.int32).unsqueeze(0)
