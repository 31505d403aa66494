import pytest
import torch

from aah_core.config import RunConfig
from aah_core.presets import get_preset


@pytest.fixture
def tiny_config() -> RunConfig:
    return get_preset("tiny")


@pytest.fixture
def tiny_model(tiny_config):
    from aah_core.model import WindowedGPT

    torch.manual_seed(0)
    return WindowedGPT(tiny_config.model)
