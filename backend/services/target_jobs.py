"""Jobs on every target: start, follow, cancel and read the logs of a run wherever it runs.

``local`` jobs go to the worker processes of services/jobs.py. A job on a cluster target (ray, slurm)
is the same ``aah train`` reporting back through tracking: the server creates its run (with a write
secret, handed to the job in its environment, never the API token), submits it to the engine and
records the engine's id. A poller thread reads the engine's state of every such run in the store
every AAH_CLUSTER_POLL_S seconds, so a restarted server re-attaches to its jobs (they keep running:
they are not its children) and records each end once (``run_store.end_run`` ends an active run only;
whichever of the job's own tracking and the poller comes first records it). An engine that cannot be
reached is a 503 naming the target, and the run made for a job it did not take ends FAILED at once.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import threading

from sqlalchemy.orm import Session, sessionmaker

from backend.jobs import lifecycle
from backend.schemas.errors import Conflict, ServiceError, Unavailable
from backend.schemas.runs import LogsResponse, RunCreate, RunPublic, TargetPublic
from backend.services.jobs import JobManager, check_active, job_config, job_experiment
from backend.services.targets import ENDED, EngineState, EngineUnreachable, JobSpec, Target, get_target, tail_lines
from backend.services.tracking import secret_hash
from backend.settings import Settings
from backend.store import run_store
from backend.store.db import transaction

logger = logging.getLogger(__name__)
UNSUBMITTED_GRACE_MS = 60_000  # a run with no engine job yet may be being submitted right now
CANCEL_WAIT_S = 5.0
# the job's environment: the run the server made for it and that run's write secret (aah_tracking/cli.py)
RUN_ENV, SECRET_ENV = "AAH_TRACKING_RUN_ID", "AAH_TRACKING_SECRET"
RECONNECT_S = 2.0  # a job whose server restarts finds it again this soon (one health check per try)


def _cleared(target: Target, job_id: str, was: str | None, state: EngineState) -> EngineState:
    """A job cancelled while queued (`was` PENDING) that its engine has ended: deleted from the engine's list
    (Ray keeps a job it failed listed), or PENDING to the caller while the engine refuses, so it asks again."""
    if was == "PENDING" and state.state in ENDED and state.state != "GONE" and not target.forget(job_id):
        return EngineState("PENDING", state.reason)
    return state


class TargetJobs:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], local: JobManager,
                 targets: dict[str, Target]) -> None:
        self.settings, self.sessions, self.local, self.targets = settings, sessions, local, targets
        self._lock = threading.Lock()  # a cap check and the run it admits are one step
        self._closing = threading.Event()
        self._poller: threading.Thread | None = None

    # ---- targets ---------------------------------------------------------------------------

    def describe(self) -> list[TargetPublic]:
        return [target.describe() for target in self.targets.values()]

    # ---- start -----------------------------------------------------------------------------

    def start(self, body: RunCreate) -> RunPublic:
        target = get_target(self.targets, body.target)
        target.check(body.resources)
        if target.name == "local":
            return self.local.start(body)
        config = job_config(body, self.settings, fits_here=False)  # the node's memory is not ours
        experiment = job_experiment(self.sessions, body)
        name = body.name or body.preset
        cap = self.settings.max_jobs_of(target.name)
        with self._lock:
            with transaction(self.sessions) as s:
                active = run_store.count_active_jobs(s, target.name)
                if active >= cap:
                    raise Unavailable(f"target {target.name}: {active} job(s) queued or running; the cap is {cap} "
                                      f"(AAH_MAX_JOBS_{target.name.upper()}). Wait for one to end or cancel one.")
                secret = secrets.token_urlsafe(32)
                run_id = run_store.create_run(
                    s, name=name, experiment=experiment, preset=body.preset, target=target.name,
                    params=run_store.flatten_params(config.to_dict()), config=config.to_dict(),
                    seq_len=config.model.seq_len, total_steps=config.train.max_steps)
                run_store.update_run(s, run_id, write_secret_hash=secret_hash(secret))
        spec = JobSpec(run_id=run_id, name=f"aah-run-{run_id}", resources=body.resources,
                       argv=self.train_argv(body, run_id, name, experiment),
                       env={RUN_ENV: str(run_id), SECRET_ENV: secret})
        try:
            job_id = target.submit(spec)
        except ServiceError as exc:  # not reachable (503) or refused (422): the run must not stay SCHEDULED
            with transaction(self.sessions) as s:
                run_store.end_run(s, run_id, "FAILED", f"not submitted: {exc.detail}")
            raise
        logger.info("run %d: submitted to %s as job %s", run_id, target.name, job_id)
        with transaction(self.sessions) as s:
            run_store.update_run(s, run_id, engine_job_id=job_id, status="PENDING", engine_state="PENDING",
                             pending_reason=f"submitted to {target.name}")
        self.poll([run_id])
        with transaction(self.sessions) as s:
            return run_store.get_run(s, run_id)

    def train_argv(self, body: RunCreate, run_id: int, name: str, experiment: str) -> list[str]:
        """``aah train`` reporting to this server; several GPUs on a node run it under torchrun."""
        sets = [f"--set={key}={_cli_value(value)}" for key, value in body.overrides.items()]
        train = [*shlex.split(self.settings.job_command), "train", "--preset", body.preset, *sets,
                 "--out", f"aah-runs/run-{run_id}", "--quiet", "--tracking-uri", self.settings.tracking_url,
                 "--experiment", experiment, "--run-name", name, f"--tracking-reconnect-s={RECONNECT_S:g}"]
        gpus = body.resources.gpus
        if gpus > 1 and body.resources.nodes == 1:
            return ["torchrun", "--standalone", f"--nproc-per-node={gpus}", "--no-python", *train]
        return train

    # ---- follow ----------------------------------------------------------------------------

    def start_polling(self) -> None:
        """Re-attach to the jobs in the store (in a thread), then follow them every ``cluster_poll_s`` seconds."""
        if len(self.targets) == 1:
            return  # local only: nothing to follow
        self._poller = threading.Thread(target=self._poll_loop, name="engine-poll", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        """Poll at once (a slow engine must not hold up the server's start), then every ``cluster_poll_s``."""
        while True:
            try:
                self.poll()
            except Exception:  # the store or an engine may be briefly away: try again next time
                logger.exception("following the cluster jobs failed")
            if self._closing.wait(self.settings.cluster_poll_s):
                return

    def poll(self, run_ids: list[int] | None = None) -> None:
        """Read each followed job's state from its engine and record it (an unreachable engine: next time)."""
        with transaction(self.sessions) as s:
            jobs = [j for j in run_store.engine_jobs(s) if run_ids is None or j.id in run_ids]
        for job in jobs:
            target = self.targets.get(job.target)
            if target is None:
                continue  # a target no longer configured: its runs wait until it is again
            if job.engine_job_id is None:
                if run_store.now_ms() - job.created_at > UNSUBMITTED_GRACE_MS:
                    with transaction(self.sessions) as s:
                        run_store.end_run(s, job.id, "FAILED", f"never submitted to {job.target} (the server stopped)")
                continue
            try:
                state = target.state(job.engine_job_id)
                if job.status == "KILLED" and (job.error or "").startswith(lifecycle.CANCELLED):
                    state = self._settle(target, job, state)
            except EngineUnreachable as exc:
                logger.warning("run %d: %s", job.id, exc.detail)
                continue
            self._record(job.id, state)

    def _settle(self, target: Target, job: run_store.EngineJob, state: EngineState) -> EngineState:
        """A run cancelled here that its engine had not ended: ask again; a queued one is cleared once ended."""
        if state.state not in ENDED:
            state = target.cancel(job.engine_job_id or "", 0.0)
        return _cleared(target, job.engine_job_id or "", job.engine_state, state)

    def _record(self, run_id: int, state: EngineState, cancelled: bool = False) -> None:
        with transaction(self.sessions) as s:
            run = run_store.get_run(s, run_id)
            run_store.update_run(s, run_id, engine_state=state.state)
            # Status moves only while the run is active, checked by the UPDATE itself: a cancel that ended
            # the run after `run` was read must not be undone (and then ended again as the engine's FAILED).
            if state.state == "PENDING" and run.status != "RUNNING":
                run_store.advance_run(s, run_id, status="PENDING", pending_reason=state.reason)
            elif state.state == "RUNNING":
                started = {"started_at": run_store.now_ms()} if run.started_at is None else {}
                run_store.advance_run(s, run_id, status="RUNNING", pending_reason=None, **started)
            if state.state in ENDED:
                status, error = _end_of(run.target, run.engine_job_id, state, cancelled)
                if run_store.end_run(s, run_id, status, error):
                    logger.info("run %d: %s on %s (%s)", run_id, status, run.target, error or "")

    # ---- control ---------------------------------------------------------------------------

    def cancel(self, run_id: int) -> RunPublic:
        with transaction(self.sessions) as s:
            run = run_store.get_run(s, run_id)
        if run.target == "local" or run.source != "job":
            return self.local.cancel(run_id)
        if run.read_only:
            raise Conflict(f"run {run_id} is read-only (a reference experiment); it cannot be cancelled")
        check_active(run)
        target = self.targets.get(run.target)
        if target is None:
            raise Conflict(f"run {run_id} runs on target {run.target!r}, which this server no longer has configured")
        if run.engine_job_id is None:
            with transaction(self.sessions) as s:
                run_store.end_run(s, run_id, "KILLED", lifecycle.CANCELLED)
        else:
            # 503 when unreachable: the run stays as is. Ray may give up on a queued job while the cancel waits:
            # it is cleared from Ray's list then, as the poller clears one that ends later
            state = _cleared(target, run.engine_job_id, run.engine_state,
                             target.cancel(run.engine_job_id, CANCEL_WAIT_S))
            if state.state in ENDED:
                self._record(run_id, state, cancelled=True)
            else:  # e.g. Ray cannot stop a job still waiting for resources: the poller asks again (_settle)
                with transaction(self.sessions) as s:
                    run_store.update_run(s, run_id, engine_state=state.state)
                    run_store.end_run(s, run_id, "KILLED", f"{lifecycle.CANCELLED}; {target.name} has not ended job "
                                  f"{run.engine_job_id} yet (it says {state.state}): the server keeps asking it to")
        with transaction(self.sessions) as s:
            return run_store.get_run(s, run_id)

    def logs(self, run_id: int, tail: int) -> LogsResponse:
        with transaction(self.sessions) as s:
            run = run_store.get_run(s, run_id)
        if run.target == "local":
            text = tail_lines(self.settings.data_dir / "runs" / str(run_id) / "worker.log", tail)
        elif run.engine_job_id is None or run.target not in self.targets:
            text = ""
        else:
            text = self.targets[run.target].logs(run.engine_job_id, tail)
        return LogsResponse(run_id=run_id, target=run.target, engine_job_id=run.engine_job_id,
                            lines=text.splitlines()[-tail:])

    def shutdown(self) -> None:
        """Stop following (the jobs on cluster targets keep running; the next server re-attaches)."""
        self._closing.set()
        if self._poller is not None:
            self._poller.join(timeout=10)


def _end_of(target: str, job_id: str | None, state: EngineState, cancelled: bool) -> tuple[str, str | None]:
    """The run's final status and error for an engine's end of its job."""
    if state.state == "FINISHED":
        return "FINISHED", None
    if state.state == "KILLED":
        return "KILLED", lifecycle.CANCELLED if cancelled else f"stopped on {target} ({state.reason or 'no reason given'})"
    if state.state == "GONE":
        return "FAILED", f"{target} no longer knows job {job_id}; the job's own report never came"
    return "FAILED", f"{target}: {state.reason or 'the job failed'}"


def _cli_value(value: object) -> str:
    """An override as ``aah train --set`` reads it (the server validated it already)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, list) else str(value)

