"""The environment a training worker starts with: an allow-list, not the service's own environment.

A worker needs to find Python and its libraries, its locale and temp folder, the thread and GPU
settings of torch, and the store (``AAH_DATABASE_URL``, passed through the environment so that a
PostgreSQL password never shows in ``ps``). It must not inherit what only the service needs:
``AAH_API_TOKEN`` above all, and whatever else the service's environment happens to hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV",
          "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
          "HF_HOME", "HF_HUB_CACHE", "COVERAGE_PROCESS_START")
PASSED_PREFIXES = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "NVIDIA_", "TORCH", "PYTORCH_", "NCCL_",
                   "SLURM_CONF")


def passed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of `environ` (default os.environ): what a job of any target may inherit."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in PASSED or k.startswith(PASSED_PREFIXES)}


def worker_env(db_url: str, repo_root: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of `environ` (default os.environ), plus the store URL and the repo on PYTHONPATH."""
    environ = os.environ if environ is None else environ
    env = passed_env(environ)
    env["AAH_DATABASE_URL"] = db_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), environ.get("PYTHONPATH")]))
    return env
