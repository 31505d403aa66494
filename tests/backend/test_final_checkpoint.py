"""A run that trained keeps its weights (issue 21 item 5): the final checkpoint is tried again when its
disk is full for a moment, and goes to the spool folder when the run's folder cannot take it, where the
service finds and serves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from aah_core.checkpoint import load_checkpoint
from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from backend.app import create_app
from backend.jobs.worker import SPOOL_DIR
from backend.store import run_store
from backend.store.db import make_engine, make_session_factory, transaction
from backend.store.migrate import upgrade
from tests.backend.conftest import make_settings
from tests.frontend.stack import ROOT

STEPS = 12
CONFIG = {"train.max_steps": STEPS, "train.eval_every": 6, "train.eval_batches": 1, "train.checkpoint_every": 0}

# At the last step every file write of the process starts failing (EFBIG, as on a full disk); two seconds
# later space is "freed": the final checkpoint's first tries fail, a later one succeeds.
FULL_FOR_A_MOMENT = textwrap.dedent("""
    import json, resource, sys, threading
    from pathlib import Path
    from aah_core.config import apply_overrides
    from aah_core.presets import get_preset
    from aah_core.train import Callback, train

    out, steps, overrides = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    class DiskFullAtTheEnd(Callback):
        def on_metrics(self, step, metrics):
            if step == steps:
                resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
                threading.Timer(2.0, resource.setrlimit, (resource.RLIMIT_FSIZE, (soft, hard))).start()

    result = train(apply_overrides(get_preset("tiny"), overrides), out, [DiskFullAtTheEnd()])
    print(json.dumps({"status": result.status, "checkpoint": str(result.checkpoint)}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE semantics of Linux")
def test_a_final_checkpoint_is_tried_again_when_the_disk_was_full(tmp_path):
    out = tmp_path / "run" / "checkpoint"
    done = subprocess.run([sys.executable, "-c", FULL_FOR_A_MOMENT, str(out), str(STEPS), json.dumps(CONFIG)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"status": "FINISHED", "checkpoint": str(out)}
    assert "final checkpoint not written" in done.stderr and "os error 27" in done.stderr  # EFBIG: the fault was real
    assert load_checkpoint(out).meta["step"] == STEPS


@pytest.fixture
def full_run_folder(tmp_path: Path):  # noqa: ANN201
    """(data dir, run id): a job's run in the store whose folder (data/runs/<id>) is a 64 KiB tmpfs, too
    small for its checkpoint; the rest of the data dir has room."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data = tmp_path / "data"
    engine = make_engine(data / "aah.db")
    upgrade(engine)
    config = apply_overrides(get_preset("tiny"), CONFIG)
    with transaction(make_session_factory(engine)) as s:
        run_id = run_store.create_run(s, name="full", experiment="x", preset="tiny", config=config.to_dict(),
                                  seq_len=config.model.seq_len)
    engine.dispose()
    folder = data / "runs" / str(run_id)
    folder.mkdir(parents=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs mount here ({made.stderr.decode().strip()})")
    try:
        yield data, run_id
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_final_checkpoint_that_its_folder_cannot_take_goes_to_the_spool_and_is_served(full_run_folder):
    data, run_id = full_run_folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "backend.jobs.worker", "--run-id", str(run_id), "--data-dir", str(data)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No space left on device" in done.stderr  # the run's own folder really was full
    spooled = f"{SPOOL_DIR}/run-{run_id}-checkpoint"
    assert load_checkpoint(data / spooled).meta["step"] == STEPS
    settings = make_settings(data, None, seed_paper=False, seed_demo=False, reconcile_s=0)
    with TestClient(create_app(settings)) as client:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == "FINISHED" and run["checkpoint"] == spooled, run
        windows = client.get(f"/api/v1/models/run-{run_id}/windows")
        assert windows.status_code == 200, windows.text
