"""Shared benchmark helpers: timing medians, machine naming, result files."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine_slug() -> str:
    """A short name for this machine: CUDA device name, or CPU model + core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")
    except ImportError:
        pass
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1]
                break
    except OSError:
        pass
    words = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    words = "-".join(w for w in words.split("-") if w not in ("processor", "cpu", "with", "radeon", "graphics"))[:40]
    return f"{words}-{os.cpu_count()}c"


def time_ms(fn: Callable[[], Any], runs: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median / min / p95 wall time of fn() in milliseconds, after warm-up calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(0.95 * len(samples)))]
    return {"median": statistics.median(samples), "min": samples[0], "p95": p95}


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    s = sorted(samples_ms)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"p50": statistics.median(s), "p95": pick(0.95), "p99": pick(0.99), "n": len(s)}


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write bench/results/<name>-<machine>.json with the machine and date recorded."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_slug(), "date": time.strftime("%Y-%m-%d %H:%M"), **payload}
    path = RESULTS / f"{name}-{machine_slug()}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path
