"""The ``model`` section of a run config: the network's shape and its window buckets, validated on construction.

It sits below aah_core/config.py (the whole run config) and aah_core/controller_config.py (which checks
controller settings against the model), so both import it and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aah_core.coerce import SEQ_LEN_MAX, Bounds, check_bounds
from aah_core.errors import InvalidConfig
from aah_core.windows import decode_window

MODEL_BOUNDS: Bounds = {
    "vocab_size": (1, 1 << 20), "seq_len": (1, SEQ_LEN_MAX), "n_layer": (1, 256), "n_head": (1, 256),
    "d_model": (1, 1 << 15), "mlp_ratio": (1, 64), "dropout": (0.0, 1.0), "rope_base": (1.0, 1e12),
}
MAX_BUCKETS = 64


@dataclass
class ModelConfig:
    vocab_size: int = 256
    seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    positions: str = "rope"  # "rope" or "learned" (the paper's)
    rope_base: float = 10000.0
    # window choices offered by the controller and the dashboard; None = full
    buckets: list[int | None] = field(default_factory=lambda: [4, 8, 16, 32, 64, 128, None])
    # attention sinks (StreamingLLM): every head also sees the first `sinks` tokens besides its window
    sinks: int = 0

    def __post_init__(self) -> None:
        check_bounds(self, "model", MODEL_BOUNDS)
        if self.d_model % self.n_head:
            raise InvalidConfig(f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}")
        if self.positions not in ("rope", "learned"):
            raise InvalidConfig(f"model.positions must be 'rope' or 'learned'; got {self.positions!r}")
        if self.positions == "rope" and (self.d_model // self.n_head) % 2:
            raise InvalidConfig("model.positions='rope' needs an even head dimension (d_model / n_head)")
        if self.dropout >= 1.0:
            raise InvalidConfig(f"model.dropout must be in [0, 1); got {self.dropout}")
        if not isinstance(self.buckets, list) or len(self.buckets) > MAX_BUCKETS:
            raise InvalidConfig(f"model.buckets must be a list of at most {MAX_BUCKETS} windows")
        finite = [b for b in self.buckets if b is not None]
        if not self.buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in finite):
            raise InvalidConfig(f"model.buckets must be integers >= 1 or null (full); got {self.buckets!r}")
        if finite != sorted(set(finite)):
            raise InvalidConfig(f"model.buckets must be strictly increasing; got {self.buckets!r}")
        if finite and finite[-1] > self.seq_len:
            raise InvalidConfig(f"model.buckets: {finite[-1]} is larger than model.seq_len={self.seq_len}; use null for full")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or not 0 <= self.sinks <= self.seq_len:
            raise InvalidConfig(f"model.sinks must be an integer in [0, model.seq_len={self.seq_len}]; got {self.sinks!r}")
        if None in self.buckets[:-1]:
            raise InvalidConfig("model.buckets: null (full) may only be the last bucket")

    @property
    def bucket_windows(self) -> list[int]:
        """Buckets as integers, full written as seq_len."""
        return [decode_window(b, self.seq_len, "model.buckets") for b in self.buckets]
