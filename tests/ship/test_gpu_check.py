"""bench/gpu.sh, the GPU check, dry-run on this CPU: its commands, paths and arguments must be right
before the few minutes of GPU time start (the GPU machine has python3 only and returns $OUT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu.sh"


# Packages the GPU machine lacks (its image holds torch, pytest, hypothesis, safetensors, transformers, ...;
# ../shared/reference/gpu_device.md): the engine's tests and benchmarks must not import them.
ABSENT_ON_GPU_MACHINE = ("sqlalchemy", "alembic", "pydantic", "pydantic_settings", "fastapi", "starlette", "uvicorn",
                         "streamlit", "plotly", "psycopg", "playwright", "ray", "backend", "frontend")
SITECUSTOMIZE = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {ABSENT_ON_GPU_MACHINE!r}:
            raise ModuleNotFoundError(f"not on the GPU machine: {{name}}", name=name)
sys.meta_path.insert(0, Absent())
"""


def gpu_machine_env(tmp_path: Path) -> dict[str, str]:
    """This environment with the GPU machine's packages only: SITECUSTOMIZE hides the rest from Python."""
    site = tmp_path / "gpu-machine-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": str(site)}


def run_check(*args: str, py: str = sys.executable, tmp_path: Path) -> subprocess.CompletedProcess:
    """bench/gpu.sh as on the GPU machine, its results under tmp_path/out."""
    (tmp_path / "out").mkdir(exist_ok=True)
    env = {**gpu_machine_env(tmp_path), "PY": py, "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def test_the_gpu_machine_env_hides_the_web_packages(tmp_path):
    probe = "import aah_core.attention\ntry:\n    import sqlalchemy\nexcept ModuleNotFoundError as e:\n    print(e)"
    env = gpu_machine_env(tmp_path)
    env["PYTHONPATH"] += f":{ROOT}"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "not on the GPU machine: sqlalchemy", proc.stderr[-2000:]


@pytest.mark.slow
def test_dry_run_writes_every_result_under_out(tmp_path):
    proc = run_check("--dry-run", tmp_path=tmp_path)
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "attention-gpu-bfloat16-dry-run.json",
        "attention-gpu-float32-dry-run.json",
        "gpu-dry-run.log",
        "gpu-report-dry-run.json",
        "gpu-tests-dry-run.log",
    ]
    assert "all steps passed" in (out / "gpu-dry-run.log").read_text()
    report = json.loads((out / "gpu-report-dry-run.json").read_text())
    assert report["device"] == "cpu" and report["backends"]["banded"] == "ok"
    assert "CUDA" in report["backends"]["flash"]
    assert "tests collected" in (out / "gpu-tests-dry-run.log").read_text()
    for dtype in ("float32", "bfloat16"):
        bench = json.loads((out / f"attention-gpu-{dtype}-dry-run.json").read_text())
        assert bench["dtype"] == dtype
        timed = {(r["T"], r["plan"], r["backend"]) for r in bench["rows"] if "ratio" in r}
        assert timed == {(1024, p, b) for p in ("mix-cov0.32", "w=64") for b in ("sdpa-causal", "banded")}


def test_batch_and_lengths_reach_the_benchmark_and_name_its_files(tmp_path):
    proc = run_check("--dry-run", "--batch", "2", "--T", "1024", "2048", "--step", "3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    for dtype in ("float32", "bfloat16"):
        bench = json.loads((out / f"attention-gpu-b2-{dtype}-dry-run.json").read_text())
        assert bench["batch"] == 2
        assert {r["T"] for r in bench["rows"]} == {1024, 2048}


def test_every_step_runs_even_when_one_fails(tmp_path):
    proc = run_check("--dry-run", py="false", tmp_path=tmp_path)
    assert proc.returncode == 1
    assert [line for line in proc.stdout.splitlines() if line.endswith("FAILED")] == [
        f"== step {s} FAILED" for s in (1, 2, 3)
    ]
    assert "failed steps: 1 2 3" in proc.stdout


def test_a_spent_budget_skips_the_steps_left(tmp_path):
    proc = run_check("--dry-run", "--budget", "10", "--step", "3", "--step", "4", py="false", tmp_path=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.count("== skipped: the --budget is spent") == 3  # step 3's two dtypes and step 4
    assert "failed steps: 3 4" in proc.stdout


@pytest.mark.parametrize("args", [("--step", "5"), ("--step",), ("--fast",), ("--budget", "9s"), ("--batch",),
                                  ("--T",), ("--T", "x")])
def test_bad_arguments_are_refused(tmp_path, args):
    proc = run_check(*args, tmp_path=tmp_path)
    assert proc.returncode == 2 and "gpu.sh:" in proc.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_the_package_admits_the_gpu_machines_python():
    import tomllib

    from packaging.specifiers import SpecifierSet

    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.11" in requires and "3.12" in requires  # the GPU machine runs Python 3.12


@pytest.mark.slow
def test_threshold_check_dry_runs_with_the_gpu_machines_packages(tmp_path):
    (tmp_path / "out").mkdir()
    env = {**gpu_machine_env(tmp_path), "PY": sys.executable, "OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_threshold.sh"), "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    bench = json.loads((tmp_path / "out" / "attention-gpu-threshold-b1-float32-dry-run.json").read_text())
    timed = {(r["T"], r["backend"]) for r in bench["rows"] if "ratio" in r}
    assert bench["dtype"] == "float32" and timed == {(128, "sdpa-causal"), (128, "banded")}
