"""frontend/jobs.py: the snapshot of active jobs that decides when a page redraws, and the lines shown."""

from frontend import jobs


def _run(i, status, step=0, total=50):
    return {"id": i, "name": f"r{i}", "status": status, "progress": {"step": step, "total_steps": total}}


def test_signature_changes_exactly_when_a_job_appears_starts_or_ends():
    before = jobs.signature([_run(1, "SCHEDULED"), _run(2, "FINISHED"), _run(3, "RUNNING", 5)])
    assert before == {1: "SCHEDULED", 3: "RUNNING"}
    assert jobs.signature([_run(1, "SCHEDULED"), _run(2, "FINISHED"), _run(3, "RUNNING", 40)]) == before
    assert jobs.signature([_run(1, "RUNNING"), _run(3, "RUNNING")]) != before  # started
    assert jobs.signature([_run(1, "SCHEDULED"), _run(3, "FINISHED")]) != before  # ended
    assert jobs.signature([_run(1, "SCHEDULED"), _run(3, "RUNNING"), _run(4, "SCHEDULED")]) != before


def test_progress_text_and_the_lines_of_ended_jobs():
    assert jobs.progress_text(_run(7, "RUNNING", 30, 50)) == (0.6, "#7 r7: RUNNING, step 30/50")
    assert jobs.progress_text({"id": 8, "name": "x", "status": "SCHEDULED", "progress": None}) == (
        0.0, "#8 x: SCHEDULED, step 0")
    lines = jobs.ended_lines({7: "RUNNING", 9: "RUNNING"}, [_run(7, "FINISHED", 50), _run(9, "RUNNING", 3)])
    assert list(lines) == [7] and lines[7].startswith("#7 r7: FINISHED, step 50/50")


def test_a_cluster_job_says_where_it_runs_and_why_it_waits():
    run = {**_run(5, "PENDING", 0, 30), "target": "slurm", "engine_job_id": "42",
           "pending_reason": "ReqNodeNotAvail, May be reserved for other job"}
    frac, text = jobs.progress_text(run)  # Markdown, the run's and the engine's words escaped: shown as typed
    assert (frac, text.replace("\\", "")) == (
        0.0, "#5 r5 on slurm job 42: PENDING, step 0/30 (ReqNodeNotAvail, May be reserved for other job)")
    assert jobs.signature([run]) == {5: "PENDING"}  # a queued job is active: its start redraws the page


def test_resources_body_keeps_what_was_asked():
    assert jobs.resources_body({"gpus": 0, "cpus": 0, "memory_gb": 0, "nodes": 1, "time_limit_min": 0}) == {}
    assert jobs.resources_body({"gpus": 2, "cpus": 8, "memory_gb": 1.5, "nodes": 2, "time_limit_min": 60}) == {
        "gpus": 2, "cpus": 8, "memory_gb": 1.5, "nodes": 2, "time_limit_min": 60}
