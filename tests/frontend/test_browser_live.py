"""Live job status in a real browser (issue 13): a job started while the Runs and ACR pages are open
shows its progress as it trains, and both pages say it finished without a reload. Chromium through
Playwright against the real API and dashboard (the session's stack from conftest.py)."""

import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser, pytest.mark.slow]
STEPS = 200  # the tiny preset: a few seconds of training on an idle 2-core box, longer under load


def _table_status(page, run_id: int) -> str:
    """The status cell of the run's row in the runs table (the grid's accessible table mirrors the canvas)."""
    for row in page.locator('[data-testid="stDataFrame"] tbody tr').all():
        cells = row.locator("td").all_inner_texts()
        if cells and cells[0].strip() == str(run_id):
            return cells[2].strip()
    return ""


def _picker(page) -> str:
    """The ACR page's run picker as it reads (the combobox's value)."""
    return page.get_by_role("combobox", name="Run").input_value(timeout=2_000)


def _mid_run_progress(api: str, rid: int) -> int:
    """The step the running job has reached, once it is past 0 and before its end (else 0)."""
    run = httpx.get(f"{api}/runs/{rid}", timeout=30).json()
    step = (run.get("progress") or {}).get("step", 0)
    return step if run["status"] == "RUNNING" and 0 < step < STEPS else 0


def _worker_pid(rid: int) -> int:
    """The pid of the job's worker process (python -m backend.jobs.worker --run-id N ...)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"backend.jobs.worker" in argv and argv[argv.index(b"--run-id") + 1] == str(rid).encode():
            return int(proc.name)
    raise AssertionError(f"no worker process for run {rid}")


def _running_bar(page, rid: int) -> int:
    """The step a RUNNING progress bar of the run shows on the page, or 0 when none is drawn."""
    for text in page.locator('[data-testid="stProgress"]').all_inner_texts():
        if m := re.search(rf"#{rid} live-check: RUNNING, step (\d+)/{STEPS}", text):
            return int(m.group(1))
    return 0


def test_a_job_shows_progress_while_it_trains_and_pages_follow_its_status(live):
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    runs_page = S.open_page(browser, f"{stack.ui_url}/runs")
    S.wait_for(lambda: runs_page.get_by_text("No job is running.").count(), what="the jobs watcher")
    run = httpx.post(f"{api}/runs", json={"preset": "tiny", "name": "live-check",
                                          "overrides": {"train.max_steps": STEPS}}, timeout=60).json()
    rid = run["id"]
    # nothing was live when the page opened, so it polls nothing: one click looks for the new job
    runs_page.get_by_role("button", name="Check for jobs").click()
    acr_page = S.open_page(browser, f"{stack.ui_url}/acr?run={rid}")
    S.wait_for(lambda: re.search(rf"#{rid} live-check \((SCHEDULED|RUNNING)\)", _picker(acr_page)),
               what="the run picker naming the new job")
    # the runs table gains the new job without a reload (the watcher saw it appear)
    S.wait_for(lambda: _table_status(runs_page, rid) in ("SCHEDULED", "RUNNING"), what="the job in the table")

    # Pause the job's worker once it has logged a step: the page must then show a RUNNING bar part-way
    # (the job's speed against the page's polling no longer decides whether a bar is ever drawn).
    progress = S.wait_for(lambda: _mid_run_progress(api, rid), timeout=240, interval=0.1,
                          what="the job's first logged step")
    worker = _worker_pid(rid)
    os.kill(worker, signal.SIGSTOP)
    try:
        bar = S.wait_for(lambda: _running_bar(runs_page, rid), timeout=60, what="a RUNNING progress bar")
    finally:
        os.kill(worker, signal.SIGCONT)
    assert bar < STEPS, f"a RUNNING bar at step {bar} of {STEPS} (the API had step {progress})"
    S.wait_for(lambda: httpx.get(f"{api}/runs/{rid}", timeout=30).json()["status"] not in ("SCHEDULED", "RUNNING"),
               timeout=240, what="the job's end")
    final = httpx.get(f"{api}/runs/{rid}", timeout=30).json()
    assert final["status"] == "FINISHED", final.get("error")

    # after the end, without a reload: the table, the watcher and the ACR page's picker say FINISHED
    S.wait_for(lambda: _table_status(runs_page, rid) == "FINISHED", timeout=30, what="FINISHED in the table")
    S.wait_for(lambda: runs_page.get_by_text(f"Ended: #{rid} live-check: FINISHED, step {STEPS}/{STEPS}").count(),
               timeout=30, what="the ended job's line")
    S.wait_for(lambda: f"#{rid} live-check (FINISHED)" in _picker(acr_page), timeout=30,
               what="FINISHED in the ACR run picker")
    assert acr_page.locator('[data-testid="stException"]').count() == 0
    runs_page.close()
    acr_page.close()


def test_a_tracked_run_that_ends_while_its_acr_page_is_open_is_finished_in_the_picker_too(live):
    """Issue 23: 30 s after a tracked run's end the ACR page's caption said FINISHED and its run picker
    still RUNNING. A run tracked from elsewhere (not a job of this server): the page must follow its end
    in the picker as in the caption."""
    stack, browser = live
    api = f"{stack.api_url}/api/v1"
    made = httpx.post(f"{api}/tracking/runs", json={"run_key": "picker-test-run", "name": "tracked-live",
                                                    "config": {}, "total_steps": 100}, timeout=30).json()
    rid, secret = made["run"]["id"], {"X-AAH-Run-Secret": made["write_secret"]}

    def log(step: int) -> None:
        httpx.post(f"{api}/tracking/runs/{rid}/log", headers=secret, json={"series": {"train_loss": {
            "step": [step], "value": [3.0 - step / 100], "time": [1.7e9 + step]}}}, timeout=30).raise_for_status()

    log(1)
    page = S.open_page(browser, f"{stack.ui_url}/acr?run={rid}&keys=train_loss")
    S.wait_for(lambda: f"#{rid} tracked-live (RUNNING)" in _picker(page), what="the picker naming the live run")
    log(2)
    httpx.post(f"{api}/tracking/runs/{rid}/status", headers=secret, json={"status": "FINISHED"},
               timeout=30).raise_for_status()
    S.wait_for(lambda: page.get_by_text(re.compile(r"^status FINISHED")).count(), timeout=30,
               what="FINISHED in the caption")
    S.wait_for(lambda: f"#{rid} tracked-live (FINISHED)" in _picker(page), timeout=30,
               what="FINISHED in the run picker")
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()
