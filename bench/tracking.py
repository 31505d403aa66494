"""Tracking benchmark: what `aah train --tracking-uri` costs a training step at the demo's shape with
metrics every step (target <= 2 %), and how long a logged step takes to be served by the API.

A real uvicorn on loopback (the same machine: its work competes with training for the cores, which a
remote server would not). Two overhead figures: the CPU time tracking adds to the training process
(its hooks on the training thread plus its sender thread, per step) over the process CPU time of an
untracked step, which a busy shared machine barely disturbs; and the wall time of a step (between two
consecutive metric reports, the evaluation at the last step left out), tracked vs untracked, runs
alternating so that a drift of the machine's load hits both alike. Latency: in separate tracked runs (the
poller costs CPU on this box, so those runs do not count for the overhead), a poller reads
GET /runs/{id}/metrics?keys=train_loss&min_step=... every 10 ms and notes when each step first appears,
minus the time the step was logged.

    python -m bench.tracking [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from aah_core.train import Callback, train
from aah_tracking import TrackingCallback, Transport
from aah_tracking.spool import Spool
from bench.api import API, REPO, free_port, start_server
from bench.common import percentiles, write_result


class StepClock(Callback):
    """When each step's metrics were reported (perf_counter for intervals, time.time for latency) and the
    process CPU time used so far (all threads)."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.cpu: list[float] = []
        self.logged: dict[int, float] = {}

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.ticks.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.logged[step] = time.time()

    def cpu_ms_per_step(self, skip: int) -> float:
        return (self.cpu[-2] - self.cpu[skip]) * 1000 / (len(self.cpu) - 2 - skip)

    def step_ms(self, skip: int) -> list[float]:
        """Intervals after ``skip`` warm-up steps, without the last (it evaluates)."""
        ticks = self.ticks[skip:-1]
        return [(b - a) * 1000 for a, b in zip(ticks, ticks[1:])]


class TimedTracking(TrackingCallback):
    """The tracking callback, with the CPU time of its training-thread hooks and of its sender thread."""

    hooks_cpu_s = sender_cpu_s = 0.0

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        t0 = time.thread_time()
        super().on_metrics(step, metrics)
        self.hooks_cpu_s += time.thread_time() - t0

    def on_plan(self, step: int, plan: Any) -> None:
        t0 = time.thread_time()
        super().on_plan(step, plan)
        self.hooks_cpu_s += time.thread_time() - t0

    def _run(self) -> None:
        t0 = time.thread_time()
        try:
            super()._run()
        finally:
            self.sender_cpu_s = time.thread_time() - t0


class Watcher(threading.Thread):
    """Polls the API for the tracked run named ``name``, noting when each train_loss step first appears."""

    def __init__(self, base: str, name: str) -> None:
        super().__init__(daemon=True)
        self.base, self.name = base, name
        self.seen: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as http:
            run_id = None
            while run_id is None and not self.done.is_set():
                runs = http.get(f"{API}/runs", params={"experiment": "bench-tracking"}).json()
                run_id = next((r["id"] for r in runs if r["name"] == self.name), None)
                time.sleep(0.01)
            while not self.done.is_set():
                after = max(self.seen, default=-1) + 1
                series = http.get(f"{API}/runs/{run_id}/metrics",
                                  params={"keys": "train_loss", "min_step": after}).json()["series"]
                now = time.time()
                for step in series.get("train_loss", {}).get("step", []):
                    self.seen.setdefault(step, now)
                time.sleep(0.01)


def one_run(base: str | None, steps: int, work: Path, name: str, flush_s: float, watch: bool) -> dict[str, Any]:
    config = apply_overrides(get_preset("demo"), {"train.max_steps": steps, "train.eval_every": 10 * steps,
                                                  "train.checkpoint_every": 0, "train.stop_copy_below_chance": 0.0})
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    watcher = None
    if base is not None:
        tracking = TimedTracking(Transport(base), Spool(work / f"{name}.tracking.jsonl"), config,
                                 name=name, experiment="bench-tracking", flush_s=flush_s)
        callbacks.append(tracking)
    if watch:
        watcher = Watcher(base, name)
        watcher.start()
    train(config, work / name, callbacks)
    out: dict[str, Any] = {"step_ms": clock.step_ms(skip=3), "cpu_ms": [clock.cpu_ms_per_step(skip=3)]}
    if base is not None:
        # the whole run's tracking CPU per step, the final checkpoint upload included (an upper bound); the
        # hooks run on the training thread, the sender beside it (a spare core hides it, a busy one does not)
        out["tracking_cpu_ms"] = [1000 * (tracking.hooks_cpu_s + tracking.sender_cpu_s) / steps]
        out["hooks_cpu_ms"] = [1000 * tracking.hooks_cpu_s / steps]
        out["spooled"] = (work / f"{name}.tracking.jsonl").exists()
    if watcher is not None:
        deadline = time.monotonic() + 30
        while len(watcher.seen) < steps and time.monotonic() < deadline:
            time.sleep(0.05)
        watcher.done.set()
        out["latency_ms"] = [(watcher.seen[s] - clock.logged[s]) * 1000 for s in clock.logged if s in watcher.seen]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="untracked/tracked pairs per setting (default 3)")
    args = parser.parse_args(argv)
    steps, rounds = (12, 1) if args.quick else (args.steps, args.rounds)
    # (flush_s, watched): the poller of a watched run costs CPU on this box, so overhead is read from
    # the unwatched run and latency from the watched ones
    settings = {"default (2 s / 50 steps)": (2.0, False), "default, watched for latency": (2.0, True),
                "flush every 0.2 s, watched for latency": (0.2, True)}
    keys = ("step_ms", "cpu_ms", "latency_ms", "tracking_cpu_ms", "hooks_cpu_ms")
    samples: dict[str, dict[str, list[float]]] = {k: {key: [] for key in keys} for k in ["untracked", *settings]}
    spooled = False
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="aah-bench-tracking-") as tmp:
        work = Path(tmp)
        port = free_port()
        proc = start_server(work / "data", REPO / "data" / "demo", port, env={"AAH_SEED_SUITE": "false"})
        base = f"http://127.0.0.1:{port}"
        try:
            n = 0
            for _ in range(rounds):
                for label, (flush_s, watch) in [("untracked", (0.0, False)), *settings.items()]:
                    n += 1
                    result = one_run(None if label == "untracked" else base, steps, work, f"run{n}", flush_s, watch)
                    spooled |= result.get("spooled", False)
                    for key in keys:
                        samples[label][key] += result.get(key, [])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    base_ms = statistics.median(samples["untracked"]["step_ms"])
    base_cpu = statistics.median(samples["untracked"]["cpu_ms"])
    result = {
        "shape": "demo preset (4 layers x 4 heads x 128, T=256, batch 32), metrics every step",
        "steps_per_run": steps, "rounds": rounds, "target_overhead_pct": 2.0,
        "untracked_step_ms": percentiles(samples["untracked"]["step_ms"]),
        "untracked_process_cpu_ms_per_step": base_cpu,
        "tracked": {label: {"step_ms": percentiles(s["step_ms"]),
                            "wall_overhead_pct_of_median": 100 * (statistics.median(s["step_ms"]) / base_ms - 1),
                            "tracking_cpu_ms_per_step": statistics.median(s["tracking_cpu_ms"]),
                            "of_which_training_thread_ms_per_step": statistics.median(s["hooks_cpu_ms"]),
                            "cpu_overhead_pct": 100 * statistics.median(s["tracking_cpu_ms"]) / base_cpu,
                            **({"logged_to_served_ms": percentiles(s["latency_ms"])} if s["latency_ms"] else {})}
                    for label, s in samples.items() if label != "untracked"},
        "anything_spooled": spooled, "quick": args.quick, "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
    }
    path = write_result("tracking", result)
    for label, r in result["tracked"].items():
        print(f"{label}: tracking CPU {r['tracking_cpu_ms_per_step']:.2f} ms/step "
              f"({r['of_which_training_thread_ms_per_step']:.3f} ms on the training thread) = {r['cpu_overhead_pct']:.3f} % of "
              f"{base_cpu:.0f} ms; wall step {r['step_ms']['p50']:.1f} ms vs {result['untracked_step_ms']['p50']:.1f} ms "
              f"({r['wall_overhead_pct_of_median']:+.2f} %)"
              + (f"; logged -> served p50 {r['logged_to_served_ms']['p50']:.0f} ms, "
                 f"p95 {r['logged_to_served_ms']['p95']:.0f} ms" if "logged_to_served_ms" in r else ""))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
