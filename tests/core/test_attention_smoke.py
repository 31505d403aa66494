import torch

from aah_core.attention import windowed_attention


def test_banded_matches_reference_float64():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, dtype=torch.float64) for _ in range(3))
    windows = [1, 5, 100]
    ref = windowed_attention(q, k, v, windows, backend="reference")
    out = windowed_attention(q, k, v, windows, backend="banded")
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
