"""The client's pieces without a server: metric values, batch chunking, the spool, run-folder operations."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from aah_tracking.callback import MAX_POINTS, log_ops, metric_value
from aah_tracking.folder import folder_ops
from aah_tracking.spool import Spool, spool_path


def test_metric_values_as_the_api_takes_them():
    assert [metric_value(v) for v in (1.5, math.nan, math.inf, -math.inf)] == [1.5, "nan", "inf", "-inf"]


def test_batches_are_chunked_and_plans_ride_on_the_last():
    points = [{"key": "k", "step": s, "value": 1.0, "time": 0.0} for s in range(2 * MAX_POINTS + 1)]
    ops = log_ops("key", points, [{"step": 3, "windows": [[1]]}], step=7)
    assert [len(op["body"]["series"]["k"]["step"]) for op in ops] == [MAX_POINTS, MAX_POINTS, 1]
    assert [s for op in ops for s in op["body"]["series"]["k"]["step"]] == list(range(2 * MAX_POINTS + 1))
    assert [op["body"]["plans"] for op in ops] == [[], [], [{"step": 3, "windows": [[1]]}]]
    assert {op["body"]["step"] for op in ops} == {7}
    assert len(log_ops("key", [], [], None)) == 1  # progress alone still goes


def test_the_spool_keeps_order_and_skips_a_torn_last_line(tmp_path):
    spool = Spool(spool_path(tmp_path / "run"))
    assert spool.path == tmp_path / "run.tracking.jsonl" and spool.read() == []
    spool.append([{"op": "create", "n": 1}, {"op": "log", "n": 2}])
    spool.append([{"op": "log", "n": 3}])
    assert spool.path.stat().st_mode & 0o777 == 0o600  # its create operation holds the run's write secret
    with spool.path.open("a") as f:
        f.write('{"op": "log", "n"')  # the process died mid-write
    assert [op["n"] for op in spool.read()] == [1, 2, 3]
    with pytest.raises(ValueError):
        spool.append([{"op": "log", "value": math.nan}])  # never a NaN literal the API would refuse
    spool.clear()
    assert not spool.path.exists()


def test_a_folder_has_one_key_for_its_content(tmp_path, tiny_demo):
    run = tmp_path / "run"
    shutil.copytree(tiny_demo, run)
    rows = [{"step": 1, "time": 1.0, "train_loss": 3.0, "val_loss": None}, {"step": 2, "time": 2.0, "train_loss": 2.5}]
    (tmp_path / "run.metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ops, summary = folder_ops(run)
    again, _ = folder_ops(run)
    assert ops == again and ops[0]["run_key"].startswith("import-")
    secret = ops[0]["body"]["write_secret"]  # whoever holds the folder may import it again; the key does not tell it
    assert len(secret) == 64 and secret[:40] != ops[0]["run_key"].removeprefix("import-")
    assert [op["op"] for op in ops] == ["create", "log", "checkpoint", "status"]
    assert ops[1]["body"]["series"] == {"train_loss": {"step": [1, 2], "value": [3.0, 2.5], "time": [1.0, 2.0]},
                                        "val_loss": {"step": [1], "value": ["nan"], "time": [1.0]}}
    assert summary.startswith("3 metric points, 0 plans")
    (tmp_path / "run.metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")  # other content: another run
    assert folder_ops(run)[0][0]["run_key"] != ops[0]["run_key"]
    no_upload, _ = folder_ops(run, upload=False)
    assert no_upload[-1]["body"]["checkpoint_ref"] == str(run.resolve())
