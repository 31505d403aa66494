"""Records have owners (issue 21 items 2 and 7), on a real uvicorn on loopback with no API token: a tracked
run is written only with its write secret, seeded runs (demo, suite, paper) take no tracking writes, an
ended run takes only replays of what it holds, a stored plan is never replaced, a checkpoint reference is
a path or an allowed URL, a write from another site's page is refused, and two servers started at once on
a fresh data dir seed it once."""

from __future__ import annotations

import os
import subprocess
import uuid

import httpx
import pytest

from aah_core.presets import get_preset
from backend.schemas.tracking import SECRET_HEADER
from backend.seed.paper import paper_runs
from tests.frontend.stack import ROOT, api_command, free_port, running_api, stop_process, wait_ready

API = "/api/v1"
TRACKING = f"{API}/tracking/runs"
CONFIG = get_preset("tiny").to_dict()  # 2 layers x 2 heads, seq_len 64


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> str:
    """The API as the launchers run it, seeded as a fresh install is (the shipped demo, suite and paper
    tables), without a token."""
    base = tmp_path_factory.mktemp("authority")
    with running_api(base / "data", base / "api.log", {"AAH_PRELOAD_MODELS": "false"}) as url:
        yield url


def _create(url: str, **extra: object) -> httpx.Response:
    body = {"run_key": f"test-{uuid.uuid4().hex}", "name": "mine", "experiment": "authority", "config": CONFIG,
            **extra}
    return httpx.post(url + TRACKING, json=body, timeout=30)


def _tracked(url: str) -> tuple[int, dict[str, str]]:
    r = _create(url)
    assert r.status_code == 201, r.text
    return r.json()["run"]["id"], {SECRET_HEADER: r.json()["write_secret"]}


def _snapshot(url: str, run_ids: list[int]) -> dict[int, tuple[bytes, ...]]:
    """Every run's record, metric series and plans as the API answers them, byte for byte."""
    out = {}
    with httpx.Client(base_url=url, timeout=30) as http:  # one kept-alive connection for the many reads
        for run_id in run_ids:
            out[run_id] = tuple(http.get(path).content for path in (
                f"{API}/runs/{run_id}", f"{API}/runs/{run_id}/metrics", f"{API}/runs/{run_id}/windows"))
    return out


def _writes(run_id: int) -> list[tuple[str, str, dict]]:
    """Every kind of tracking write to a run: (method, path, request arguments)."""
    point = {"series": {"val_loss": {"step": [10**9], "value": [0.0], "time": [1.0]}}, "step": 10**9}
    return [("POST", f"{TRACKING}/{run_id}/log", {"json": point}),
            ("POST", f"{TRACKING}/{run_id}/log", {"json": {"plans": [{"step": 0, "windows": [[1, 1], [1, 1]]}]}}),
            ("POST", f"{TRACKING}/{run_id}/status", {"json": {"status": "KILLED", "checkpoint_ref": "/tmp/x"}}),
            ("PUT", f"{TRACKING}/{run_id}/checkpoint/config.json", {"content": b"{}"}),
            ("POST", f"{TRACKING}/{run_id}/checkpoint", {})]


def test_foreign_writes_are_refused_and_seeded_series_stay_byte_identical(live):
    by_source = {source: [r["id"] for r in httpx.get(live + f"{API}/runs", params={"source": source, "limit": 1000},
                                                     timeout=30).json()] for source in ("suite", "paper", "imported")}
    seeded = [run_id for ids in by_source.values() for run_id in ids]
    sources = {r["source"] for r in httpx.get(live + f"{API}/runs", params={"limit": 1000}, timeout=30).json()}
    assert {"suite", "paper", "imported"} <= sources and len(seeded) > 10  # the demo is source "imported"
    mine, own = _tracked(live)
    _, others = _tracked(live)
    httpx.post(live + f"{TRACKING}/{mine}/log", headers=own, timeout=30, json={
        "series": {"val_loss": {"step": [1, 2], "value": [3.0, 2.5], "time": [1.0, 2.0]}},
        "plans": [{"step": 2, "windows": [[4, None], [16, 8]]}]}).raise_for_status()
    before = _snapshot(live, [*seeded, mine])
    # every (secret, write) pair on the first run of each source and on mine, and one pair on each other seeded
    # run, the pairs in turn: the refusal is decided by the run's source, read-only flag and secret hash (services/
    # tracking.py), which the runs of one source share, so the full 4 x 5 on each of the 59 seeded runs (1,200
    # writes, 8 s of this test's 16 s) repeated the same cases; every run is still written to and compared
    pairs = [(auth, write) for auth in ({}, {SECRET_HEADER: "x" * 43}, others, {SECRET_HEADER: ""}) for write in range(5)]
    attacks = [(run_id, pair) for ids in [*by_source.values(), [mine]]
               for i, run_id in enumerate(ids) for pair in (pairs if i == 0 else [pairs[(i - 1) % len(pairs)]])]
    assert {run_id for run_id, _ in attacks} == {*seeded, mine}
    with httpx.Client(base_url=live, timeout=30) as http:  # one kept-alive connection for the many writes
        for run_id, (auth, write) in attacks:
            method, path, kwargs = _writes(run_id)[write]
            r = http.request(method, path, headers=auth, **kwargs)
            assert r.status_code == 403, (run_id, auth, path, r.text)
            assert r.json()["detail"]
    assert _snapshot(live, [*seeded, mine]) == before
    own_write = httpx.post(live + f"{TRACKING}/{mine}/log", headers=own, timeout=30,
                           json={"series": {"val_loss": {"step": [3], "value": [2.0], "time": [3.0]}}})
    assert own_write.status_code == 200 and own_write.json()["metrics_written"] == 1  # its owner still writes


def test_the_secret_is_answered_once(live):
    key = f"test-{uuid.uuid4().hex}"
    r = _create(live, run_key=key)
    again = _create(live, run_key=key)
    assert r.status_code == 201 and len(r.json()["write_secret"]) >= 32
    assert again.status_code == 200 and again.json()["write_secret"] is None
    assert again.json()["run"]["id"] == r.json()["run"]["id"]
    chosen = "c" * 40  # a client may choose its secret: a replayed create then holds it
    run_id = _create(live, write_secret=chosen).json()["run"]["id"]
    r = httpx.post(live + f"{TRACKING}/{run_id}/log", headers={SECRET_HEADER: chosen}, json={"step": 1}, timeout=30)
    assert r.status_code == 200, r.text
    assert _create(live, write_secret="short").status_code == 422


def test_an_ended_run_takes_only_replays(live):
    run_id, auth = _tracked(live)
    batch = {"series": {"loss": {"step": [1, 2, 3], "value": [3.0, "nan", 0.1 + 0.2], "time": [1.0, 2.0, 3.0]}},
             "plans": [{"step": 3, "windows": [[4, None], [16, 64]]}], "step": 3}
    assert httpx.post(live + f"{TRACKING}/{run_id}/log", headers=auth, json=batch, timeout=30).status_code == 200
    ended = httpx.post(live + f"{TRACKING}/{run_id}/status", headers=auth, json={"status": "FINISHED"}, timeout=30)
    assert ended.status_code == 200 and ended.json()["status"] == "FINISHED"
    before = _snapshot(live, [run_id])

    def log(body: dict) -> httpx.Response:
        return httpx.post(live + f"{TRACKING}/{run_id}/log", headers=auth, json=body, timeout=30)

    replay = log({**batch, "step": 99})  # the same points and plan: accepted, nothing changes
    assert replay.status_code == 200 and (replay.json()["metrics_written"], replay.json()["plans_written"]) == (0, 0)
    assert log({"series": {"loss": {"step": [2, 3], "value": ["nan", 0.30000000000000004],
                                    "time": [9.0, 9.0]}}}).status_code == 200  # the time is not the point's value
    for body, why in (
            ({"series": {"loss": {"step": [4], "value": [1.0], "time": [4.0]}}}, "no new points"),
            ({"series": {"loss": {"step": [3, 4], "value": [0.1 + 0.2, 1.0], "time": [3.0, 4.0]}}}, "no new points"),
            ({"series": {"new_key": {"step": [1], "value": [1.0], "time": [4.0]}}}, "no new points"),
            ({"series": {"loss": {"step": [1], "value": [2.0], "time": [1.0]}}}, "another value"),
            ({"series": {"loss": {"step": [2], "value": ["inf"], "time": [2.0]}}}, "another value"),
            ({"plans": [{"step": 4, "windows": [[4, None], [16, 8]]}]}, "no new plan"),
            ({"plans": [{"step": 3, "windows": [[1, 1], [1, 1]]}]}, "never replaced")):
        r = log(body)
        assert r.status_code == 409 and why in r.json()["detail"], (body, r.text)
    assert _snapshot(live, [run_id]) == before
    status = httpx.post(live + f"{TRACKING}/{run_id}/status", headers=auth, timeout=30,
                        json={"status": "FINISHED", "step": 10**6, "checkpoint_ref": "/elsewhere"})
    assert status.status_code == 200 and _snapshot(live, [run_id]) == before  # a replayed end changes nothing


def test_a_stored_plan_is_never_replaced_on_a_running_run(live):
    run_id, auth = _tracked(live)
    plan = {"step": 5, "windows": [[4, None], [16, 8]]}
    url = live + f"{TRACKING}/{run_id}/log"
    assert httpx.post(url, headers=auth, json={"plans": [plan]}, timeout=30).json()["plans_written"] == 1
    same = httpx.post(url, headers=auth, json={"plans": [{**plan, "windows": [[4, 64], [16, 8]]}]}, timeout=30)
    assert same.status_code == 200 and same.json()["plans_written"] == 0  # 64 = seq_len is full: the same plan
    r = httpx.post(url, headers=auth, json={"plans": [{**plan, "windows": [[1, 1], [1, 1]]}]}, timeout=30)
    assert r.status_code == 409 and "never replaced" in r.json()["detail"]
    stored = httpx.get(live + f"{API}/runs/{run_id}/windows", params={"step": 5}, timeout=30).json()
    assert stored["windows"] == [[4, None], [16, 8]]


@pytest.mark.parametrize("ref", ["javascript:alert(1)", " JavaScript:alert(1)", "data:text/html,<b>x</b>",
                                 "vbscript:x", "http:relative", "ftp://host/ckpt", "/ckpt\nx"])
def test_a_checkpoint_reference_with_another_scheme_is_refused(live, ref):
    run_id, auth = _tracked(live)
    r = httpx.post(live + f"{TRACKING}/{run_id}/status", headers=auth, json={"status": "RUNNING", "checkpoint_ref": ref},
                   timeout=30)
    assert r.status_code == 422 and "checkpoint_ref" in r.json()["detail"], r.text
    assert httpx.get(live + f"{API}/runs/{run_id}", timeout=30).json()["checkpoint"] is None


@pytest.mark.parametrize("ref", ["/data/runs/ckpt", "runs/ckpt", "C:\\runs\\ckpt", "s3://bucket/run/ckpt",
                                 "https://models.example/run", "file:///data/ckpt", "gs://b/ckpt"])
def test_paths_and_allowed_urls_are_kept_as_references(live, ref):
    run_id, auth = _tracked(live)
    r = httpx.post(live + f"{TRACKING}/{run_id}/status", headers=auth, json={"status": "FINISHED", "checkpoint_ref": ref},
                   timeout=30)
    assert r.status_code == 200 and r.json()["checkpoint"] == ref, r.text


def _views(url: str) -> list:
    return httpx.get(url + f"{API}/views", headers={"Origin": "http://127.0.0.1:9999"}, timeout=30).json()


def test_a_write_from_another_sites_page_is_refused(live):
    own = live  # http://127.0.0.1:<port>
    before = _views(live)
    for headers in ({"Origin": "http://127.0.0.1:9999"}, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"},
                    {"Origin": own, "Sec-Fetch-Site": "cross-site"}, {"Origin": own.replace("http:", "http://x@")},
                    {"Origin": "http://localhost:9999", "Sec-Fetch-Site": "same-site"}):
        for method, path, body in (("POST", "/views", {"name": "csrf", "page": "runs", "state": {}}),
                                   ("POST", "/tracking/runs", {"run_key": f"csrf-{uuid.uuid4().hex}", "name": "x",
                                                               "config": CONFIG})):
            r = httpx.request(method, live + API + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 403 and "another site" in r.json()["detail"], (headers, r.text)
    assert _views(live) == before  # reads stay open to any origin; nothing was written
    assert not httpx.get(live + f"{API}/runs", params={"experiment": "tracked"}, timeout=30).json()
    for headers in ({}, {"Origin": own, "Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
                    {"Host": own.split("//")[1].replace("127.0.0.1", "localhost"),  # under another of its names
                     "Origin": own.replace("127.0.0.1", "localhost")},
                    {"Origin": "http://127.0.0.1:8501", "Sec-Fetch-Site": "same-site"}):  # the dashboard (AAH_UI_ORIGIN)
        r = httpx.post(live + f"{API}/views", json={"name": "ok", "page": "runs", "state": {}}, headers=headers,
                       timeout=30)
        assert r.status_code == 201, (headers, r.text)
        assert httpx.delete(live + f"{API}/views/{r.json()['id']}", headers=headers, timeout=30).status_code == 204


def test_two_servers_started_at_once_seed_a_fresh_data_dir_once(tmp_path, tiny_demo):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AAH_")}
    env.update({"AAH_DATA_DIR": str(data), "AAH_DEMO_DIR": str(tiny_demo), "AAH_SEED_SUITE": "false",
                "AAH_PRELOAD_MODELS": "false", "PYTHONPATH": str(ROOT)})
    servers = []
    try:
        for n in range(2):
            port, log = free_port(), tmp_path / f"api-{n}.log"
            proc = subprocess.Popen(api_command(port), cwd=ROOT, env=env, stdout=log.open("w"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
            servers.append((f"http://127.0.0.1:{port}", proc, log))
        for url, proc, log in servers:
            wait_ready(url + f"{API}/health", proc, log, 120)
        for url, _, _ in servers:
            demo = httpx.get(url + f"{API}/runs", params={"experiment": "demo"}, timeout=30).json()
            paper = httpx.get(url + f"{API}/runs", params={"source": "paper", "limit": 1000}, timeout=30).json()
            assert len(demo) == 1 and len(paper) == len(paper_runs())
            assert [m["id"] for m in httpx.get(url + f"{API}/models", timeout=30).json()] == ["demo"]
    finally:
        for _, proc, _ in servers:
            stop_process(proc)

