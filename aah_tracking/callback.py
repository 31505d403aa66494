"""`TrackingCallback`: a training run reported to a server as it trains, never slowing or stopping it.

The training thread only appends to in-memory buffers. A background thread turns them into batches
(every ``flush_steps`` steps or ``flush_s`` seconds, at most ``MAX_POINTS`` points a request) and
sends them with retries. When the server cannot be reached, or refuses (a bad token), the batches go
to the spool and a line says so once; an unreachable server is tried again every ``reconnect_s``
seconds and, once back, gets the spool replayed before anything new. At the end the checkpoint is
uploaded (or, with ``upload=False``, recorded as a reference) and the final status sent (an unreachable
server gets FINAL_GRACE_S more to come back); whatever could not be sent stays in the spool for `aah sync`.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aah_core.config import RunConfig
from aah_core.train import Callback
from aah_core.windows import plan_to_json
from aah_tracking.spool import Spool, replay, tracked_marker
from aah_tracking.transport import Op, Refused, Transport, Unreachable

MAX_POINTS = 2_000  # metric points per request: well under the server's 1 MB body limit
FINAL_GRACE_S = 10.0  # at the end, how long an unreachable server may take to come back


def _say(line: str) -> None:
    print(f"aah tracking: {line}", file=sys.stderr, flush=True)


def metric_value(value: float) -> float | str:
    """A metric as the API takes it: a finite number, or "nan" / "inf" / "-inf"."""
    value = float(value)
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def series(points: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Points ({key, step, value, time}) in the API's columnar form: per key, its steps, values and times."""
    out: dict[str, dict[str, list]] = {}
    for p in points:
        columns = out.setdefault(p["key"], {"step": [], "value": [], "time": []})
        columns["step"].append(p["step"])
        columns["value"].append(p["value"])
        columns["time"].append(p["time"])
    return out


def log_ops(run_key: str, points: list[dict[str, Any]], plans: list[dict[str, Any]], step: int | None) -> list[Op]:
    """Log operations for buffered points and plans, chunked to at most MAX_POINTS points each; the points
    go as columns per key (``series``: half the bytes of one object per point, and far less for the
    server to parse)."""
    chunks = [points[i:i + MAX_POINTS] for i in range(0, len(points), MAX_POINTS)] or [[]]
    ops: list[Op] = [{"op": "log", "run_key": run_key, "body": {"series": series(chunk), "plans": [], "step": step}}
                     for chunk in chunks]
    ops[-1]["body"]["plans"] = plans
    return ops


class TrackingCallback(Callback):
    """Reports one run to the server at ``transport``; spools to ``spool`` what does not get through."""

    def __init__(self, transport: Transport, spool: Spool, config: RunConfig, *, name: str,
                 experiment: str = "tracked", group: str | None = None, tags: list[str] | None = None,
                 source: str = "tracked",
                 upload: bool = True, flush_steps: int = 50, flush_s: float = 2.0, reconnect_s: float = 10.0,
                 final_timeout_s: float = 300.0, say: Callable[[str], None] = _say,
                 attach: tuple[int, str] | None = None) -> None:
        self.transport, self.spool, self.config = transport, spool, config
        self.run_key = f"run-{uuid.uuid4().hex}"
        self.write_secret = secrets.token_urlsafe(32)  # every write to the run carries it (kept in the spool)
        self.attach = attach  # (run id, write secret) of a run the server made for this job, else None
        self.identity = {"name": name, "experiment": experiment, "group": group, "tags": tags or [], "source": source}
        self.upload, self.flush_steps, self.flush_s = upload, flush_steps, flush_s
        self.reconnect_s, self.final_timeout_s, self.say = reconnect_s, final_timeout_s, say
        self.mode = "online"  # online | offline (unreachable: retried) | refused (no retries)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._points: list[dict[str, Any]] = []
        self._plans: list[dict[str, Any]] = []
        self._steps = 0  # steps buffered since the last batch
        self._step: int | None = None
        self._final: list[Op] | None = None
        self._checkpoint: Path | None = None
        self._create: Op | None = None
        self._spooled = False
        self._last_try = 0.0
        self._thread: threading.Thread | None = None

    # -- the training thread ----------------------------------------------------------------

    def on_start(self, info: dict[str, Any]) -> None:
        self._mark_tracked()
        if self.attach is not None:
            run_id, self.write_secret = self.attach
            self._create = {"op": "attach", "run_key": self.run_key, "run_id": run_id,
                            "write_secret": self.write_secret}
        else:
            self._create = self._new_run_op(info)
        self._thread = threading.Thread(target=self._run, name="aah-tracking", daemon=True)
        self._thread.start()

    def _new_run_op(self, info: dict[str, Any]) -> Op:
        return {"op": "create", "run_key": self.run_key, "body": {
            "run_key": self.run_key, "write_secret": self.write_secret, **self.identity,
            "preset": self.config.preset, "config": self.config.to_dict(),
            "data_hash": info.get("data_hash"), "git_rev": info.get("git_rev"), "seed": self.config.train.seed,
            "total_steps": info.get("total_steps"), "start_step": info.get("start_step", 0)}}

    def _mark_tracked(self) -> None:
        """Say beside the run folder that this run is tracked (its key and server; the secret stays in the
        spool), so an `aah import` of the folder later does not register it a second time."""
        marker = tracked_marker(self.spool.path.with_name(self.spool.path.name.removesuffix(".tracking.jsonl")))
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"run_key": self.run_key, "uri": self.transport.uri}) + "\n")

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        with self._lock:
            self._points.extend({"key": k, "step": step, "value": metric_value(v), "time": now}
                                for k, v in metrics.items())
            self._step = step
            self._steps += 1
            due = self._steps >= self.flush_steps
        if due:
            self._wake.set()

    def on_plan(self, step: int, plan: torch.Tensor) -> None:
        windows = plan_to_json(plan, self.config.model.seq_len)
        with self._lock:
            self._plans.append({"step": step, "windows": windows})

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._checkpoint = Path(path).resolve()

    def on_end(self, status: str, error: str | None) -> None:
        if self._thread is None:
            return
        final: list[Op] = []
        body: dict[str, Any] = {"status": status, "error": error and error[:10_000], "step": self._step}
        if self._checkpoint is not None and status != "FAILED":
            if self.upload:
                final.append({"op": "checkpoint", "run_key": self.run_key, "path": str(self._checkpoint)})
            else:
                body["checkpoint_ref"] = str(self._checkpoint)
        final.append({"op": "status", "run_key": self.run_key, "body": body})
        with self._lock:
            self._final = final
        self._wake.set()
        self._thread.join(self.final_timeout_s)
        if self._thread.is_alive():
            self.say(f"still sending after {self.final_timeout_s:.0f} s; training is done, the rest is lost "
                     f"unless the spool {self.spool.path} has it")
        elif self.spool.path.is_file():
            self.say(f"{len(self.spool.read())} operations are spooled in {self.spool.path}; send them with "
                     f"`aah sync {self.spool.path}`")
        self.transport.close()

    # -- the sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._deliver([self._create_op()])
            while True:
                self._wake.wait(self.flush_s)
                self._wake.clear()
                with self._lock:
                    points, plans, step, final = self._points, self._plans, self._step, self._final
                    self._points, self._plans, self._steps = [], [], 0
                if points or plans:
                    self._deliver(log_ops(self.run_key, points, plans, step))
                if final is not None:
                    self._last_chance()
                    self._deliver(final)
                    return
                if self.mode == "offline" and time.monotonic() - self._last_try >= self.reconnect_s:
                    self._reconnect()
        except Exception as exc:  # tracking never stops training: say it once and stop tracking
            self.say(f"stopped after an unexpected error ({type(exc).__name__}: {exc})")

    def _deliver(self, ops: list[Op]) -> None:
        for op in ops:
            if self.mode == "online":
                try:
                    self.transport.send(op)
                    continue
                except Unreachable as exc:
                    self.mode, self._last_try = "offline", time.monotonic()
                    self.say(f"{exc}; spooling to {self.spool.path} and retrying every {self.reconnect_s:g} s")
                except Refused as exc:
                    self.mode = "refused"
                    why = "refused the token" if exc.status == 401 else "refused a request"
                    self.say(f"the server {why} ({exc}); training goes on, spooling to {self.spool.path} "
                             f"(send later with `aah sync`)")
            self._to_spool(op)

    def _create_op(self) -> Op:
        assert self._create is not None, "on_start builds it before it starts the sender thread"
        return self._create

    def _last_chance(self) -> None:
        """At the end, an unreachable server gets FINAL_GRACE_S more to come back (a restart) before the
        run's last operations go to the spool; a reconnect attempt always follows a wait."""
        deadline = time.monotonic() + FINAL_GRACE_S
        while self.mode == "offline":
            self._reconnect()
            if self.mode != "offline" or time.monotonic() > deadline:
                return
            time.sleep(min(self.reconnect_s, 1.0))

    def _to_spool(self, op: Op) -> None:
        create = self._create_op()
        ops = [op] if self._spooled or op is create else [create, op]
        self.spool.append(ops)  # a spool starts with the create operation, so it replays on its own
        self._spooled = True

    def _reconnect(self) -> None:
        self._last_try = time.monotonic()
        if not self.transport.alive():
            return
        try:
            sent = replay(self.transport, self.spool.read())
        except Unreachable:
            return
        except Refused as exc:
            self.mode = "refused"
            self.say(f"the server refused the spooled operations ({exc}); they stay in {self.spool.path}")
            return
        self.spool.clear()
        self._spooled = False
        self.mode = "online"
        self.say(f"reconnected to {self.transport.uri}; {sent} spooled operations replayed")
