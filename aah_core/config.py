"""Run configuration: model, data, training and controller settings as validated dataclasses.

Each section round-trips through JSON (to_dict / from_dict) and is saved next to the weights. The model
section lives in aah_core/model_config.py, below both this module and controller_config.py (which checks
controller settings against it), so imports go one way: config -> controller_config -> model_config.
Overrides use dotted keys, e.g. ``train.lr=1e-3`` or ``model.n_layer=2``.

Every number has bounds (model_config.MODEL_BOUNDS, DATA_BOUNDS, TRAIN_BOUNDS), checked on construction, so the CLI,
POST /runs and a checkpoint's config.json are all refused alike, naming the field. The bounds are what
the engine can represent sensibly, not what one machine can hold: whether a config fits this machine's
memory is aah_core.resources.check_fits, asked before a job starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aah_core.coerce import SEQ_LEN_MAX, STEPS_MAX, Bounds, check_bounds, coerce, field_types
from aah_core.controller_config import ControllerSettings, parse_controller
from aah_core.errors import InvalidConfig
from aah_core.model_config import ModelConfig

PATH_CHARS = 4096
DATA_BOUNDS: Bounds = {
    "synthetic_fraction": (0.0, 1.0), "copy_min_span": (2, SEQ_LEN_MAX), "copy_max_span": (2, SEQ_LEN_MAX),
    "copy_max_lead": (0, SEQ_LEN_MAX), "val_fraction": (0.0, 0.5),
}
TRAIN_BOUNDS: Bounds = {
    "max_steps": (1, STEPS_MAX), "batch_size": (1, 1 << 16), "lr": (0.0, 10.0), "min_lr_ratio": (0.0, 1.0),
    "warmup_steps": (0, STEPS_MAX), "weight_decay": (0.0, 10.0), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0),
    "grad_clip": (0.0, 1e6), "seed": (0, 2**32 - 1), "eval_every": (1, STEPS_MAX), "eval_batches": (1, 10_000),
    "checkpoint_every": (0, STEPS_MAX), "threads": (0, 1024), "stop_copy_below_chance": (0.0, 100.0),
}

RETRIEVAL_ANCHORS = ("end", "start")


@dataclass
class DataConfig:
    corpus: str = "default"  # bundled "default" (Python source) or "english" (prose), or a text file or folder
    tokenizer: str = "byte"  # "byte" or "gpt2" (from local files, see data/README.md)
    tokenizer_dir: str = ""
    synthetic: str = "copy"  # "copy", "recall" or "none": the long-range task mixed into batches
    synthetic_fraction: float = 0.5
    copy_min_span: int = 16
    copy_max_span: int = 128
    # random characters before a copy span, up to this many: 0 puts every first copy at the sequence's start,
    # which a model can learn to copy from only (it then fails a passkey planted further in)
    copy_max_lead: int = 0
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        check_bounds(self, "data", DATA_BOUNDS)
        for name in ("corpus", "tokenizer_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > PATH_CHARS:
                raise InvalidConfig(f"data.{name} must be a path of at most {PATH_CHARS} characters")
        if self.tokenizer not in ("byte", "gpt2"):
            raise InvalidConfig(f"data.tokenizer must be 'byte' or 'gpt2'; got {self.tokenizer!r}")
        if self.synthetic not in ("copy", "recall", "none"):
            raise InvalidConfig(f"data.synthetic must be 'copy', 'recall' or 'none'; got {self.synthetic!r}")
        if self.copy_min_span > self.copy_max_span:
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
    # where the logged passkey set plants its key (analysis/retrieval.py): "end" (the repeat ends the sequence,
    # as every run before this setting) or "start" (the key at the sequence's start, the repeat d tokens later)
    retrieval_anchor: str = "end"

    def __post_init__(self) -> None:
        check_bounds(self, "train", TRAIN_BOUNDS)
        if self.lr <= 0:
            raise InvalidConfig(f"train.lr must be > 0; got {self.lr}")
        for name in ("beta1", "beta2"):
            if getattr(self, name) >= 1.0:
                raise InvalidConfig(f"train.{name} must be in [0, 1); got {getattr(self, name)}")
        if not isinstance(self.backend, str) or len(self.backend) > 32:
            raise InvalidConfig("train.backend must be a backend name (auto, reference, banded, flex, flash)")
        if self.retrieval_anchor not in RETRIEVAL_ANCHORS:
            raise InvalidConfig(f"train.retrieval_anchor must be 'end' or 'start'; got {self.retrieval_anchor!r}")


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
        raw = dataclasses.asdict(self)
        if not raw["model"]["sinks"]:  # a model without sinks is written as before they existed: old files stay byte-identical
            del raw["model"]["sinks"]
        return raw

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
        if name not in SECTIONS[section]:
            raise InvalidConfig(f"unknown config key {key!r}; known {section} keys: {sorted(SECTIONS[section])}")
        raw[section][name] = coerce(value, SECTIONS[section][name], key)
    return RunConfig.from_dict(raw)
