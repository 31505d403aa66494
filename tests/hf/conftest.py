from pathlib import Path

import pytest

from tests.hf.tiny import FAMILIES, save_tiny_model


@pytest.fixture(scope="session")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model root holding one tiny random model folder per covered family."""
    root = tmp_path_factory.mktemp("hf-models")
    for family in FAMILIES:
        save_tiny_model(family, root / family)
    return root
