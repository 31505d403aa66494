"""The slurm target through slurmrestd (AAH_SLURMRESTD_URL, here its unix socket with rest_auth/local)
instead of the Slurm commands: a job waits PENDING with Slurm's reason and is cancelled, a tiny job ends
FINISHED with its points and model, and Slurm agrees with both ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clusters.conftest import ClusterApi, slurm_job_state
from tests.clusters.engines import SlurmCluster, slurmrestd_missing

ACTIVE = ("SCHEDULED", "PENDING", "RUNNING")


@pytest.fixture(scope="module")
def rest_api(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterApi]:
    missing = slurmrestd_missing()
    if missing:
        pytest.skip(f"slurmrestd tests skipped: {missing}")
    sock = slurm.start_slurmrestd()
    server = ClusterApi(tmp_path_factory.mktemp("slurmrestd"), "slurm",
                        {"AAH_SLURM_PARTITION": slurm.partition, "AAH_SLURMRESTD_URL": f"unix:{sock}"})
    server.start()
    yield server
    server.stop()


def test_jobs_through_slurmrestd(rest_api: ClusterApi, slurm: SlurmCluster) -> None:
    (target,) = [t for t in rest_api.get("/targets") if t["name"] == "slurm"]
    assert target["available"] is True and "slurmrestd" in target["detail"]
    waiting = rest_api.submit(30, gpus=1)
    steps = 30
    run = rest_api.submit(steps)
    pending = rest_api.wait_run(waiting["id"], lambda r: "ReqNodeNotAvail" in (r["pending_reason"] or ""), 60)
    assert pending["status"] == "PENDING"
    killed = rest_api.cancel(waiting["id"])
    assert killed["status"] == "KILLED" and killed["engine_state"] == "KILLED"
    assert slurm_job_state(slurm, waiting["engine_job_id"]) == "CANCELLED"
    done = rest_api.wait_run(run["id"], lambda r: r["status"] not in ACTIVE)
    assert done["status"] == "FINISHED", done
    series = rest_api.get(f"/runs/{run['id']}/metrics", keys="train_loss")["series"]["train_loss"]
    assert series["step"] == list(range(1, steps + 1))
    assert f"run-{run['id']}" in {m["id"] for m in rest_api.get("/models")}
    rest_api.wait_run(run["id"], lambda r: r["engine_state"] == "FINISHED", 30)
    assert slurm_job_state(slurm, run["engine_job_id"]) == "COMPLETED"
