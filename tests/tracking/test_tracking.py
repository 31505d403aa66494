"""`aah train --tracking-uri` against a real server: the run arrives exactly, survives the server's
death, DDP reports once, a bad token spools, and `aah import` / `aah sync` are idempotent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from aah_tracking.folder import folder_ops
from tests.frontend.stack import ROOT
from tests.tracking.conftest import TOKEN, ApiServer, aah, assert_run_matches, tiny_train_args

pytestmark = pytest.mark.slow


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def _tracked_run(server: ApiServer, name: str) -> dict:
    (run,) = [r for r in server.get("/runs", source="tracked", limit=1000) if r["name"] == name]
    return run


def test_a_tracked_run_arrives_exactly(server, tmp_path, aah_here):
    out = tmp_path / "exact"
    _, err = _finish(aah(*tiny_train_args(out, 12, "--tracking-uri", server.url, "--tracking-flush-s", "0.2",
                                          "--group", "g1", "--tag", "smoke"), env={"AAH_API_TOKEN": TOKEN}))
    assert "aah tracking" not in err  # nothing to report: every batch went through
    run = _tracked_run(server, "exact")
    assert (run["status"], run["experiment"], run["group"], run["seed"], run["tags"]) == \
        ("FINISHED", "tracked", "g1", 0, ["smoke"])
    assert run["progress"] == {"step": 12, "total_steps": 12} and run["params"]["train.max_steps"] == "12"
    assert run["data_hash"] and run["checkpoint"] == f"tracked/run-{run['id']}/checkpoint"
    assert_run_matches(server, run["id"], out)
    model = {m["id"]: m for m in server.get("/models")}[f"run-{run['id']}"]
    assert model["run_id"] == run["id"] and model["preset"] == "tiny"
    assert not out.with_name("exact.tracking.jsonl").exists()

    # importing the tracked folder (issue 23: it made a duplicate run and model) registers nothing
    runs, models = server.get("/runs", limit=1000), server.get("/models")
    code, stdout, err = aah_here("import", str(out), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
    assert code == 0, err
    assert "already tracked" in stdout and "nothing imported" in stdout
    assert server.get("/runs", limit=1000) == runs and server.get("/models") == models


def test_the_spool_survives_a_server_killed_mid_run(tmp_path):
    api = ApiServer(tmp_path / "data", tmp_path / "api.log", token=None)
    api.start()
    out, err_file = tmp_path / "killed", tmp_path / "train.err"
    train = aah(*tiny_train_args(out, 300, "--tracking-uri", api.url, "--tracking-flush-s", "0.2",
                                 "--tracking-reconnect-s", "0.5"), stderr=err_file)
    try:
        deadline = time.monotonic() + 120
        while not any(r["name"] == "killed" and (r["progress"] or {}).get("step", 0) >= 3
                      for r in api.get("/runs", source="tracked")):
            assert time.monotonic() < deadline and train.poll() is None, err_file.read_text()[-2000:]
            time.sleep(0.2)
        api.kill()
        while "spooling to" not in err_file.read_text():  # the client noticed: batches go to the spool
            assert time.monotonic() < deadline and train.poll() is None, err_file.read_text()[-2000:]
            time.sleep(0.1)
        os.kill(train.pid, signal.SIGSTOP)  # hold training while the server comes back (slow to start here)
        api.start()
        os.kill(train.pid, signal.SIGCONT)
        assert train.wait(timeout=300) == 0, err_file.read_text()[-3000:]
        err = err_file.read_text()
        assert "reconnected" in err and "spooled in" not in err, err
        run = _tracked_run(api, "killed")
        assert run["status"] == "FINISHED" and run["progress"]["step"] == 300
        assert_run_matches(api, run["id"], out)  # nothing lost, nothing twice
    finally:
        if train.poll() is None:
            os.kill(train.pid, signal.SIGCONT)
            train.kill()
        api.stop()


def test_torchrun_reports_one_run(server, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "aah_launcher.cli", *tiny_train_args(out, 6, "--tracking-uri", server.url,
                                                      "--tracking-token", TOKEN, "--tracking-flush-s", "0.2")]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [r for r in server.get("/runs", source="tracked", limit=1000) if r["name"] == "ddp"]
    assert len(runs) == 1 and runs[0]["status"] == "FINISHED"
    assert_run_matches(server, runs[0]["id"], out)


def test_a_bad_token_spools_and_sync_sends_it_later(server, tmp_path, aah_here):
    out = tmp_path / "refused"
    _, err = _finish(aah(*tiny_train_args(out, 6, "--tracking-uri", server.url, "--tracking-token", "wrong")))
    said = [line for line in err.splitlines() if line.startswith("aah tracking:")]
    assert len(said) == 2, err  # the refusal, once, and where the spool is at the end
    assert "refused the token" in said[0] and "AAH_API_TOKEN" in said[0]
    assert "aah sync" in said[1]
    assert not [r for r in server.get("/runs", source="tracked", limit=1000) if r["name"] == "refused"]
    spool = out.with_name("refused.tracking.jsonl")
    saved = spool.read_text()
    for _ in range(2):  # the same spool replayed twice: everything stored once
        spool.write_text(saved)
        code, sent, err = aah_here("sync", str(out), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
        assert code == 0, err
        assert sent.startswith("sent ") and not spool.exists()
    run = _tracked_run(server, "refused")
    assert run["status"] == "FINISHED"
    assert_run_matches(server, run["id"], out)
    create = json.loads(saved.splitlines()[0])
    assert create["op"] == "create" and len(create["body"]["write_secret"]) >= 32  # the spool holds the secret
    spool.write_text(saved.replace(create["body"]["write_secret"], "x" * 43))  # a spool that lost its secret
    code, _, err = aah_here("sync", str(out), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
    assert code == 1 and "403" in err and "write secret" in err and spool.exists(), err
    assert_run_matches(server, run["id"], out)  # the run is as it was


def test_sync_of_a_spool_written_before_write_secrets(server, offline, tmp_path, aah_here):
    """A spool of an older client has no secret in its create operation: its run is made now, with the secret
    the server answers; if its run exists already, sync says why it cannot write and keeps the spool."""
    ops, _ = folder_ops(offline, upload=False)
    key = f"old-{uuid.uuid4().hex}"
    for op in ops:
        op["run_key"] = key
    del ops[0]["body"]["write_secret"]
    ops[0]["body"].update(run_key=key, name="old spool")
    spool = tmp_path / "old.tracking.jsonl"
    text = "".join(json.dumps(op) + "\n" for op in ops)
    spool.write_text(text)
    code, sent, err = aah_here("sync", str(spool), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
    assert code == 0, err
    assert sent.startswith(f"sent {len(ops)} operations") and not spool.exists()
    run = server.get(f"/runs/{int(sent.split('(run ')[1].split(')')[0])}")
    assert (run["status"], run["checkpoint"]) == ("FINISHED", str(offline.resolve()))
    assert_run_matches(server, run["id"], offline)
    spool.write_text(text)  # the same old spool again: its run exists, and nothing here holds its secret
    code, _, err = aah_here("sync", str(spool), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
    assert code == 1 and "older aah" in err and spool.exists(), err


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Path:
    """A run folder trained without tracking (checkpoint + metrics and plans histories)."""
    out = tmp_path_factory.mktemp("offline") / "offline"
    _finish(aah(*tiny_train_args(out, 6)))
    return out


def test_import_is_idempotent(server, offline, aah_here):
    out = offline
    answers = []
    for _ in range(2):
        code, stdout, err = aah_here("import", str(out), "--tracking-uri", server.url, env={"AAH_API_TOKEN": TOKEN})
        assert code == 0, err
        answers.append(stdout)
    assert "new run" in answers[0] and "already there" in answers[1]
    (run,) = [r for r in server.get("/runs", source="imported", limit=1000) if r["name"] == "offline"]
    assert run["id"] == int(answers[1].split("run ")[1].split()[0])
    assert run["status"] == "FINISHED" and run["experiment"] == "imported" and run["progress"]["step"] == 6
    assert_run_matches(server, run["id"], out)
    assert f"run-{run['id']}" in {m["id"] for m in server.get("/models")}


def test_a_suite_folder_imports_as_one_experiment_with_a_group_per_row(server, offline, tmp_path, aah_here):
    out = offline
    suite = tmp_path / "suite-paper"
    for folder in ("baseline-s0", "baseline-s1", "full_adaptive-s0"):  # the layout `aah suite` writes
        (suite / folder).mkdir(parents=True)
        shutil.copytree(out, suite / folder / "ckpt")
        for kind in ("metrics", "plans"):
            shutil.copy(out.with_name(f"offline.{kind}.jsonl"), suite / folder / f"ckpt.{kind}.jsonl")
    (suite / "suite.json").write_text(json.dumps({"suite": "paper", "scale": "tiny", "impl": "faithful"}))
    for _ in range(2):
        code, _, err = aah_here("import", str(suite), "--no-upload", "--tracking-uri", server.url, "--tracking-token", TOKEN)
        assert code == 0, err
    runs = server.get("/runs", experiment="paper suite · tiny scale · suite-paper", limit=1000)
    assert sorted((r["group"], r["name"], r["source"]) for r in runs) == [
        ("baseline", "baseline · seed 0", "suite"), ("baseline", "baseline · seed 1", "suite"),
        ("full_adaptive", "full_adaptive · seed 0", "suite")]
    for run in runs:
        assert run["checkpoint"].endswith("/ckpt") and run["status"] == "FINISHED"
        assert_run_matches(server, run["id"], out)
