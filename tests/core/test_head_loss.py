"""The chunked cross-entropy through an LM head equals F.cross_entropy on the whole logits tensor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aah_core import head_loss
from aah_core.head_loss import head_token_losses


def _case(dtype: torch.dtype, bias: bool):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=gen, dtype=dtype)
    weight = torch.randn(1000, 16, generator=gen, dtype=dtype)
    b = torch.randn(1000, generator=gen, dtype=dtype) if bias else None
    targets = torch.randint(0, 1000, (3, 7), generator=gen)
    targets[0, :2] = -1  # ignored positions
    targets[1, 3], targets[2, 4] = 0, 999  # the first and last word (first and last chunk)
    return hidden, weight, b, targets


def _whole(hidden, weight, bias, targets):
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none").view_as(targets)


def test_chunked_losses_equal_the_whole_logits_in_float64(monkeypatch):
    monkeypatch.setattr(head_loss, "CHUNK_LOGITS", 21 * 300)  # 300-word chunks: 4 chunks, the last one short
    for bias in (False, True):
        hidden, weight, b, targets = _case(torch.float64, bias)
        ours = head_token_losses(hidden, weight, b, targets)
        assert ours.dtype == torch.float64
        torch.testing.assert_close(ours, _whole(hidden, weight, b, targets), rtol=1e-12, atol=1e-12)
        assert bool((ours[0, :2] == 0).all())


def test_chunked_losses_in_bfloat16_reduce_in_float32():
    hidden, weight, b, targets = _case(torch.bfloat16, True)
    ours = head_token_losses(hidden, weight, b, targets)
    assert ours.dtype == torch.float32
    whole = _whole(hidden, weight, b, targets).float()  # bf16 logits, the same GEMMs
    torch.testing.assert_close(ours, whole, rtol=2e-2, atol=2e-2)
