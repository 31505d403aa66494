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


def run_check(*args: str, py: str = sys.executable, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": py, "OUT": str(out)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_dry_run_writes_every_result_under_out(tmp_path):
    proc = run_check("--dry-run", out=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "attention-gpu-bfloat16-dry-run.json",
        "attention-gpu-float32-dry-run.json",
        "gpu-report-dry-run.json",
        "gpu-tests-dry-run.log",
    ]
    report = json.loads((tmp_path / "gpu-report-dry-run.json").read_text())
    assert report["device"] == "cpu" and report["backends"]["banded"] == "ok"
    assert "CUDA" in report["backends"]["flash"]
    assert "tests collected" in (tmp_path / "gpu-tests-dry-run.log").read_text()
    for dtype in ("float32", "bfloat16"):
        bench = json.loads((tmp_path / f"attention-gpu-{dtype}-dry-run.json").read_text())
        assert bench["dtype"] == dtype
        timed = {(r["T"], r["plan"], r["backend"]) for r in bench["rows"] if "ratio" in r}
        assert timed == {(1024, p, b) for p in ("mix-cov0.32", "w=64") for b in ("sdpa-causal", "banded")}


def test_every_step_runs_even_when_one_fails(tmp_path):
    proc = run_check("--dry-run", py="false", out=tmp_path)
    assert proc.returncode == 1
    assert [line for line in proc.stdout.splitlines() if line.endswith("FAILED")] == [
        f"== step {s} FAILED" for s in (1, 2, 3)
    ]
    assert "failed steps: 1 2 3" in proc.stdout


@pytest.mark.parametrize("args", [("--step", "5"), ("--step",), ("--fast",)])
def test_bad_arguments_are_refused(tmp_path, args):
    proc = run_check(*args, out=tmp_path)
    assert proc.returncode == 2 and "gpu.sh:" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_package_admits_the_gpu_machines_python():
    import tomllib

    from packaging.specifiers import SpecifierSet

    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.11" in requires and "3.12" in requires  # the GPU machine runs Python 3.12
