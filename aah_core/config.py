"""Run configuration: model, data, training and controller settings as validated dataclasses.

Each section round-trips through JSON (to_dict / from_dict) and is saved next to the weights.
Overrides use dotted keys, e.g. ``train.lr=1e-3`` or ``model.n_layer=2``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aah_core.coerce import coerce, field_types
from aah_core.controller_config import ControllerSettings, parse_controller
from aah_core.errors import InvalidConfig
from aah_core.windows import decode_window


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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "mlp_ratio"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidConfig(f"model.{name} must be a positive integer; got {getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise InvalidConfig(f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}")
        if self.positions not in ("rope", "learned"):
            raise InvalidConfig(f"model.positions must be 'rope' or 'learned'; got {self.positions!r}")
        if self.positions == "rope" and (self.d_model // self.n_head) % 2:
            raise InvalidConfig("model.positions='rope' needs an even head dimension (d_model / n_head)")
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidConfig(f"model.dropout must be in [0, 1); got {self.dropout}")
        finite = [b for b in self.buckets if b is not None]
        if not self.buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in finite):
            raise InvalidConfig(f"model.buckets must be integers >= 1 or null (full); got {self.buckets!r}")
        if finite != sorted(set(finite)):
            raise InvalidConfig(f"model.buckets must be strictly increasing; got {self.buckets!r}")
        if finite and finite[-1] > self.seq_len:
            raise InvalidConfig(f"model.buckets: {finite[-1]} is larger than model.seq_len={self.seq_len}; use null for full")
        if None in self.buckets[:-1]:
            raise InvalidConfig("model.buckets: null (full) may only be the last bucket")

    @property
    def bucket_windows(self) -> list[int]:
        """Buckets as integers, full written as seq_len."""
        return [decode_window(b, self.seq_len, "model.buckets") for b in self.buckets]


@dataclass
class DataConfig:
    corpus: str = "default"  # "default" (bundled), or a path to a text file or folder
    tokenizer: str = "byte"  # "byte" or "gpt2" (from local files, see data/README.md)
    tokenizer_dir: str = ""
    synthetic: str = "copy"  # "copy", "recall" or "none": the long-range task mixed into batches
    synthetic_fraction: float = 0.5
    copy_min_span: int = 16
    copy_max_span: int = 128
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.tokenizer not in ("byte", "gpt2"):
            raise InvalidConfig(f"data.tokenizer must be 'byte' or 'gpt2'; got {self.tokenizer!r}")
        if self.synthetic not in ("copy", "recall", "none"):
            raise InvalidConfig(f"data.synthetic must be 'copy', 'recall' or 'none'; got {self.synthetic!r}")
        if not 0.0 <= self.synthetic_fraction <= 1.0:
            raise InvalidConfig(f"data.synthetic_fraction must be in [0, 1]; got {self.synthetic_fraction}")
        if not 2 <= self.copy_min_span <= self.copy_max_span:
            raise InvalidConfig("data.copy_min_span must be >= 2 and <= data.copy_max_span")
        if not 0.0 < self.val_fraction < 0.5:
            raise InvalidConfig(f"data.val_fraction must be in (0, 0.5); got {self.val_fraction}")


@dataclass
class TrainConfig:
    max_steps: int = 200
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4  # eval sequences of each kind = eval_batches * batch_size // 2
    checkpoint_every: int = 0  # 0 = only at the end
    backend: str = "auto"
    threads: int = 0  # 0 = torch default
    # stop early once val_copy_loss <= ln(alphabet) - stop_copy_below_chance at two evals in a row (0 = off)
    stop_copy_below_chance: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "eval_every", "eval_batches"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidConfig(f"train.{name} must be a positive integer; got {getattr(self, name)!r}")
        if self.lr <= 0:
            raise InvalidConfig(f"train.lr must be > 0; got {self.lr}")
        if self.warmup_steps < 0 or self.checkpoint_every < 0:
            raise InvalidConfig("train.warmup_steps and train.checkpoint_every must be >= 0")


@dataclass
class RunConfig:
    """Everything needed to reproduce a run.

    `controller` is the controller section as typed JSON (the keys given, values coerced); it is parsed
    and checked against the model on construction (aah_core.controller_config), so a bad
    ``controller.*`` setting fails here, not when training starts. `controller_settings` is its typed form.
    """

    preset: str = "custom"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    controller: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _, self.controller = parse_controller(self.controller, self.model)

    @property
    def controller_settings(self) -> ControllerSettings:
        """The typed controller settings (parsed afresh, so they always match `controller`)."""
        return parse_controller(self.controller, self.model)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        if not isinstance(raw, dict):
            raise InvalidConfig(f"config must be a JSON object; got {type(raw).__name__}")
        unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidConfig(f"unknown config sections {sorted(unknown)}; expected preset, model, data, train, controller")
        sections = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
        kwargs: dict[str, Any] = {"preset": raw.get("preset", "custom"), "controller": raw.get("controller", {})}
        for name, section_cls in sections.items():
            kwargs[name] = _section_from_dict(section_cls, raw.get(name, {}), name)
        return cls(**kwargs)


def _section_from_dict(section_cls: type, raw: dict[str, Any], prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise InvalidConfig(f"config section {prefix!r} must be an object")
    names = {f.name for f in dataclasses.fields(section_cls)}
    unknown = set(raw) - names
    if unknown:
        raise InvalidConfig(f"unknown key(s) {sorted(f'{prefix}.{k}' for k in unknown)}; known: {sorted(names)}")
    return section_cls(**raw)


SECTIONS = {"model": field_types(ModelConfig), "data": field_types(DataConfig), "train": field_types(TrainConfig)}


def apply_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A new RunConfig with dotted-key overrides applied and every section re-validated."""
    raw = config.to_dict()
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if section == "controller" and name:
            raw["controller"][name] = value
            continue
        if section not in ("model", "data", "train") or not name:
            raise InvalidConfig(f"unknown config key {key!r}; use model.*, data.*, train.* or controller.*")
        if name not in raw[section]:
            raise InvalidConfig(f"unknown config key {key!r}; known {section} keys: {sorted(raw[section])}")
        raw[section][name] = coerce(value, SECTIONS[section][name], key)
    return RunConfig.from_dict(raw)
