"""Worker lifecycle benchmark: how long a training worker outlives its SIGKILLed server.

    python -m bench.workers [--trials 3]     # -> bench/results/workers-<machine>.json

Each trial starts the real API (uvicorn) on a fresh data dir, starts a long `tiny` job, waits for
two training steps, SIGKILLs the API and times until the worker process has stopped running (a
zombie waiting for its reaper counts as stopped). Then it restarts the API and reads the run's
final state and checkpoint. The test suite only checks the 5 s bound; the figures live here.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import percentiles, write_result
from tests.backend.test_worker_lifecycle import API, LONG, _gone, _pid, _run, _sessions, _start_server, _until


def trial(work: Path) -> dict:
    data, log = work / "data", work / "api.log"
    server, url = _start_server(data, log)
    run_id = httpx.post(f"{url}{API}/runs", json={"preset": "tiny", "overrides": LONG}, timeout=30).json()["id"]
    _until(lambda: (_run(url, run_id).get("progress") or {}).get("step", 0) >= 2, 120, "two steps")
    worker = _pid(_sessions(data), run_id)
    server.send_signal(signal.SIGKILL)
    server.wait(10)
    t0 = time.perf_counter()
    _until(lambda: _gone(worker), 30, "the worker's exit")
    exit_ms = (time.perf_counter() - t0) * 1000
    server, url = _start_server(data, log)
    try:
        run = _run(url, run_id)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    return {"exit_ms": round(exit_ms, 1), "status": run["status"], "error": run["error"],
            "checkpoint": run["checkpoint"], "step": (run.get("progress") or {}).get("step")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    trials = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="aah-bench-workers-") as tmp:
            trials.append(trial(Path(tmp)))
        print(f"trial {i + 1}: {trials[-1]}")  # noqa: T201 - a benchmark's report
    exit_ms = percentiles([t["exit_ms"] for t in trials])
    path = write_result("workers", {"trials": trials, "orphan_exit_ms": exit_ms})
    print(f"orphan exit after the server's SIGKILL: {exit_ms} ms -> {path}")  # noqa: T201


if __name__ == "__main__":
    main()
