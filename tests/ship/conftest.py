"""Shipping fixtures: free ports and a demo checkpoint for a fresh data dir."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aah_launcher.serve import source_root

ROOT = source_root()
CHECKPOINT_FILES = ("config.json", "model.safetensors", "plan.json")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """None when the shipped data/demo checkpoint exists (the API's default is used, as in `make demo`);
    otherwise a 2-layer checkpoint saved untrained in a temporary folder, to be passed as AAH_DEMO_DIR."""
    if all((ROOT / "data" / "demo" / name).is_file() for name in CHECKPOINT_FILES):
        return None
    from aah_core.checkpoint import save_checkpoint
    from aah_core.model import WindowedGPT
    from aah_core.presets import get_preset

    config = get_preset("tiny")
    folder = tmp_path_factory.mktemp("demo") / "demo"
    save_checkpoint(folder, WindowedGPT(config.model), config)
    return folder
