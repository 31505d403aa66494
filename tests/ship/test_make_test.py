"""`make test` is what CI runs: it must fail when its selection holds no test, not pass quietly."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_selection_without_tests_fails_make() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MAKE"))}
    # -p no:schemathesis: the fuzzing plugin imports (and pytest assert-rewrites) about 300 modules in each of
    # the three pytest processes, for a selection that holds no fuzz test (5 s of CPU); this file alone is
    # collected, so none of them imports torch or the service either
    proc = subprocess.run(["make", "--no-print-directory", "pytest", "PYTEST_ARGS=-p no:cacheprovider -p no:schemathesis "
                           "tests/ship/test_make_test.py -k no_test_has_this_name"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    # pytest ran and exited 5, "no tests collected" (make reports a recipe's exit status as "Error N")
    assert "no tests ran" in out and "Error 5" in out, out[-2000:]
    assert proc.returncode != 0, f"an empty selection passed make:\n{out[-2000:]}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_runs_lint_and_types_before_the_tests() -> None:
    proc = subprocess.run(["make", "-n", "--no-print-directory", "test"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    plan = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert plan.index("ruff check") < plan.index("bin/mypy") < plan.index("pytest"), plan
