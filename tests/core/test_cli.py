import json
import subprocess
import sys

import pytest

from aah_core.cli import main


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "ckpt"
    assert main(["train", "--preset", "tiny", "--out", str(out), "--quiet", "--set", "train.max_steps=3"]) == 0
    return out


def test_presets_lists_names(capsys):
    assert main(["presets"]) == 0
    assert "demo" in capsys.readouterr().out


def test_eval_prints_loss_and_coverage(tiny_ckpt, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[4, None], [16, 4]]))
    assert main(["eval", str(tiny_ckpt), "--windows", str(plan)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("loss ") and "acr 0.3438" in out  # (4/64 + 1 + 16/64 + 4/64) / 4
    assert "causal_coverage" in out and "retrieval" not in out


def test_eval_prints_retrieval_by_distance_and_by_where_the_key_starts(tiny_ckpt, capsys):
    assert main(["eval", str(tiny_ckpt), "--retrieval"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["distance", "end", "start", "0", "start", "16", "start", "32", "start", "48"]
    rows = {int(line.split()[0]): line.split()[1:] for line in lines[3:]}
    assert list(rows) == [8, 16, 32, 48, 57]  # the distances training logs at T = 64
    # a key that starts at s fits only where s + d + 8 <= T + 1: the other cells say so
    assert [sum(cell == "-" for cell in cells) for cells in rows.values()] == [0, 1, 2, 3, 3]
    assert all(0.0 <= float(cell) <= 1.0 for cells in rows.values() for cell in cells if cell != "-")


ERRORS = [
    (["train", "--preset", "nope"], "unknown preset 'nope'"),
    (["train", "--preset", "tiny", "--set", "train.lr"], "--set expects key=value"),
    (["train", "--preset", "tiny", "--set", "train.max_steps=abc"], "train.max_steps expects an integer"),
    (["train", "--preset", "tiny", "--set", "model.d_model=65536"], "model.d_model must be an integer in"),
    (["train", "--preset", "tiny", "--set", "model.d_model=16384", "--set", "model.n_layer=256"],
     "model.d_model / model.n_layer / model.vocab_size: training this config needs about"),
    (["eval", "/nonexistent/ckpt"], "no such checkpoint directory"),
]


def assert_one_line_error(argv, message, capsys):
    """In-process: main returns 2 with one stderr line; an exception escaping main (a traceback in a real
    process) fails the test as it propagates."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args, message", ERRORS)
def test_errors_are_one_line_without_traceback(args, message, capsys):
    assert_one_line_error(args, message, capsys)


def test_a_real_process_exits_2_with_one_stderr_line_and_no_traceback():
    # the other error tests call main() in this process (a process each costs a torch import, 3-5 s):
    # this one proves the module's own entry point turns main's 2 into the exit status, and that a fresh
    # process writes nothing else to stderr (no import-time warning, no traceback)
    proc = subprocess.run([sys.executable, "-m", "aah_core.cli", *ERRORS[0][0]], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert ERRORS[0][1] in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_malformed_plan_file(tiny_ckpt, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[[4, 0], [1, 1]]")
    assert_one_line_error(["eval", str(tiny_ckpt), "--windows", str(bad)], "layer 0, head 1: window 0 is invalid",
                          capsys)
    bad.write_text("{oops")
    assert_one_line_error(["eval", str(tiny_ckpt), "--windows", str(bad)], "cannot read a JSON plan", capsys)


def test_bad_flag_exits_nonzero(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own exit
        main(["train", "--preset", "tiny", "--bogus"])
    assert exited.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_a_new_run_starts_a_new_history_and_a_resumed_one_appends(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--out", str(out), "--quiet", "--set", "train.max_steps=3"]
    assert main(args) == 0 and main(args) == 0
    history = tmp_path / "run.metrics.jsonl"
    assert [json.loads(line)["step"] for line in history.read_text().splitlines()] == [1, 2, 3]
    more = ["train", "--preset", "tiny", "--out", str(out), "--resume", str(out), "--quiet", "--set", "train.max_steps=5"]
    assert main(more) == 0
    assert [json.loads(line)["step"] for line in history.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_generate_prints_the_continuation_the_stop_and_the_cost(tiny_ckpt, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"windows": [[4, None], [16, 4]]}))
    assert main(["generate", str(tiny_ckpt), "--prompt", "Hello", "--windows", str(plan), "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Hello")
    assert "stopped at max_new_tokens (6): 6 new tokens after a 5-token prompt" in out[2]
    # context 5 + 6 - 1 = 10: entries 4 + 10 + 10 + 4 = 28 of 40; pairs (4*10-6) + 55 + 55 + (4*10-6) = 178 of 220
    assert "at context 10: KV cache 3,584 bytes = 70.0 % of full (5,120)" in out[3]
    assert "attention pairs 178 = 80.9 % of full (220)" in out[3]
    assert main(["generate", str(tiny_ckpt), "--prompt", "x" * 60, "--max-new-tokens", "50"]) == 0
    assert "stopped at the model's context (64 tokens): 4 new tokens" in capsys.readouterr().out


@pytest.mark.parametrize("setting, field", [("controller.window=0", "controller.window"),
                                            ("controller.ema_alpha=2", "controller.ema_alpha"),
                                            ("controller.mode=magic", "controller.mode")])
def test_bad_controller_settings_are_refused_before_anything_is_written(tmp_path, capsys, setting, field):
    preset = "full_adaptive" if "ema_alpha" in setting else "tiny"
    out = tmp_path / "run"
    assert main(["train", "--preset", preset, "--out", str(out), "--quiet", "--set", setting]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "run.metrics.jsonl").exists()


def test_export_layer_writes_a_checkpoint_with_a_per_layer_plan_and_serving_json(tiny_ckpt, tmp_path, capsys):
    import os

    from aah_core.analysis.evaluate import evaluate_loss, make_eval_batch
    from aah_core.checkpoint import load_checkpoint

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"windows": [[4, 2], [16, 8]]}))
    out = tmp_path / "served"
    assert main(["export", "--model", str(tiny_ckpt), "--plan", str(plan), "--granularity", "layer",
                 "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    ckpt = load_checkpoint(out)
    assert ckpt.plan.tolist() == [[4, 4], [16, 16]]  # each layer's largest window (up)
    assert json.loads((out / "serving.json").read_text())["layer_windows"] == [4, 16]
    assert os.stat(out / "model.safetensors").st_ino == os.stat(tiny_ckpt / "model.safetensors").st_ino
    loss = evaluate_loss(ckpt.model, make_eval_batch(ckpt.config, "mixed", 4), ckpt.plan)
    assert f"{loss:.6f}" in (out / "README.md").read_text()


def test_export_into_an_existing_folder_is_refused(tiny_ckpt, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[4, 2], [16, 8]]))
    before = sorted(tmp_path.iterdir())
    assert_one_line_error(["export", "--model", str(tiny_ckpt), "--plan", str(plan), "--out", str(tmp_path)],
                          "already exists", capsys)
    assert sorted(tmp_path.iterdir()) == before


def test_a_model_with_sink_tokens_trains_evaluates_and_exports_them(tmp_path, capsys):
    from aah_core.checkpoint import load_checkpoint

    ckpt_dir = tmp_path / "sunk"
    assert main(["train", "--preset", "tiny", "--out", str(ckpt_dir), "--quiet", "--set", "train.max_steps=2",
                 "--set", "model.sinks=3"]) == 0
    ckpt = load_checkpoint(ckpt_dir)
    assert ckpt.config.model.sinks == 3
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"windows": [[4, 2], [16, 8]]}))
    out = tmp_path / "served"
    assert main(["export", "--model", str(ckpt_dir), "--plan", str(plan), "--granularity", "layer",
                 "--out", str(out)]) == 0
    assert json.loads((out / "serving.json").read_text())["sinks"] == 3  # beside each layer's window
    assert load_checkpoint(out).config.model.sinks == 3
    assert "first 3 keys (sink tokens" in (out / "README.md").read_text()
