"""Every divergence visible and every read bounded (issue 21, items 3 and 4), on a real uvicorn over a
SQLite and a PostgreSQL store.

Two runs of one group log 200,000 steps each (written through the store, as a training job's sink
does, not through 200k HTTP calls). One of them holds a spike, a NaN, an inf and a -inf, each inside
a bucket of finite values: a 200-point read must show all of them. Compare and group series of the
two runs stay under 2 MB, the full series comes back exactly page by page, the response cache
stays within its byte bound, and a run may hold at most AAH_MAX_METRIC_KEYS keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from aah_client import ApiClient
from aah_core.presets import get_preset
from backend.app import create_app
from backend.schemas.tracking import SECRET_HEADER
from backend.store import metric_store, run_store
from backend.store.db import transaction
from backend.store.tables import LatestMetric
from tests.backend.conftest import make_settings
from tests.backend.test_load_isolation import serving
from tests.conftest import DATABASES, database_url

API = "/api/v1"
STEPS = 200_000
SPIKE = (123_457, 1e6)
NONFINITE = {7: float("-inf"), 60_003: float("inf"), 150_001: float("nan")}
KINDS = {7: "-inf", 60_003: "inf", 150_001: "nan"}
CACHE_BYTES = 400_000
MAX_RESPONSE = 2_000_000


def loss(step: int, seed: int) -> float:
    return 4.0 / (1 + step / 1000) + 0.01 * ((step * (seed + 3)) % 17)


@pytest.fixture(scope="module", params=DATABASES)
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """A real uvicorn on either store, a small response cache, and the two 200k-step runs."""
    data_dir = tmp_path_factory.mktemp("bounded")
    settings = make_settings(data_dir, None, seed_paper=False, cache_bytes=CACHE_BYTES,
                             database_url=database_url(request, data_dir))
    app = create_app(settings)
    with serving(app) as url:
        ids = []
        for seed in (0, 1):
            with transaction(app.state.sessions) as s:
                ids.append(run_store.create_run(s, name=f"long-{seed}", experiment="bounded", status="FINISHED",
                                            source="suite", group="g", seed=seed))
            values = {step: loss(step, seed) for step in range(STEPS)}
            if seed == 0:
                values.update({SPIKE[0]: SPIKE[1], **NONFINITE})
            for start in range(0, STEPS, 50_000):
                with transaction(app.state.sessions) as s:
                    metric_store.log_metrics(s, ids[-1], [("loss", step, values[step], 1.7e9 + step)
                                                          for step in range(start, start + 50_000)])
        app.state.long_runs = ids
        yield url, app


def get(url: str, path: str, **params: object) -> httpx.Response:
    return httpx.get(f"{url}{API}{path}", params=params, timeout=120)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{API}{path}", json=body, timeout=120)


def listed(nonfinite: dict) -> dict[int, str]:
    assert nonfinite["total"] == len(nonfinite["step"])
    return dict(zip(nonfinite["step"], nonfinite["kind"]))


def test_a_spike_a_nan_and_infs_inside_finite_buckets_show_in_a_200_point_read(live):
    url, app = live
    diverged, _ = app.state.long_runs
    series = get(url, f"/runs/{diverged}/metrics", keys="loss", max_points=200).json()["series"]["loss"]
    assert len(series["step"]) <= 200
    assert (SPIKE[0], SPIKE[1]) in zip(series["step"], series["value"])  # the bucket's maximum
    # each non-finite point shares a 1,000-step bucket with finite values: listed apart, with its kind
    assert listed(series["nonfinite"]) == KINDS
    body = {"run_ids": [diverged], "keys": ["loss"], "max_points": 200}
    compared = post(url, "/runs/compare", body).json()["series"][str(diverged)]["loss"]
    assert len(compared["step"]) <= 200 and listed(compared["nonfinite"]) == KINDS
    assert SPIKE[1] in compared["value"]
    curve = get(url, "/runs/groups/series", experiment="bounded", group="g", keys="loss",
                max_points=200).json()["series"]["loss"]
    assert len(curve["step"]) <= 200 and listed(curve["nonfinite"][str(diverged)]) == KINDS
    # a zoom on a range holding one of them lists that one only
    zoom = get(url, f"/runs/{diverged}/metrics", keys="loss", max_points=200, min_step=100_000).json()
    assert listed(zoom["series"]["loss"]["nonfinite"]) == {150_001: "nan"}


def test_compare_and_group_series_of_two_200k_step_runs_stay_under_2_mb(live):
    url, app = live
    ids = app.state.long_runs
    compared = post(url, "/runs/compare", {"run_ids": ids, "keys": ["loss"]})
    assert compared.status_code == 200 and len(compared.content) < MAX_RESPONSE
    body = compared.json()
    assert body["downsampled"] == {str(i): ["loss"] for i in ids}
    for i in ids:
        series = body["series"][str(i)]["loss"]
        assert len(series["step"]) <= 2000 and series["step"][-1] == STEPS - 1
    group = get(url, "/runs/groups/series", experiment="bounded", group="g")
    assert group.status_code == 200 and len(group.content) < MAX_RESPONSE
    curve = group.json()["series"]["loss"]
    assert len(curve["step"]) <= 2000 and curve["step"][-1] == STEPS - 1
    metrics = get(url, f"/runs/{ids[1]}/metrics")
    assert len(metrics.content) < MAX_RESPONSE and len(metrics.json()["series"]["loss"]["step"]) <= 2000


def test_paging_with_a_cursor_returns_the_full_series_exactly(live):
    url, app = live
    run_id = app.state.long_runs[0]
    steps, values, stamps, nonfinite = [], [], [], {}
    cursor, pages = "start", 0
    while cursor is not None:
        page = get(url, f"/runs/{run_id}/metrics", keys="loss", max_points=70_000, cursor=cursor).json()
        series = page["series"]["loss"]
        assert len(series["step"]) <= 70_000 and page["downsampled"] == []
        steps += series["step"]
        values += series["value"]
        stamps += series["timestamp"]
        nonfinite.update(listed(series["nonfinite"]))
        cursor, pages = page["next_cursor"], pages + 1
    assert pages == 3
    with transaction(app.state.sessions) as s:
        full = metric_store.read_metrics(s, run_id, ["loss"])["loss"]
    assert (steps, values, stamps) == (full.step, full.value, full.timestamp) and len(steps) == STEPS
    assert nonfinite == KINDS
    with ApiClient(url) as client:  # the client's reader of every page
        history = client.metric_history(run_id, ["loss"], page_size=70_000)["loss"]
    assert (history["step"], history["value"], history["timestamp"]) == (full.step, full.value, full.timestamp)
    for bad in ("nonsense", "W10", "WyJsb3NzIiwgLTFd"):  # not base64 JSON; not a pair; step -1
        r = get(url, f"/runs/{run_id}/metrics", cursor=bad)
        assert r.status_code == 422 and "cursor" in r.json()["detail"]


def test_the_response_cache_stays_within_its_byte_bound(live):
    url, app = live
    cache = app.state.metrics_cache
    run_id = app.state.long_runs[1]
    sizes = []
    for points in range(1000, 3001, 250):  # distinct queries of about 40-120 KB each
        r = get(url, f"/runs/{run_id}/metrics", keys="loss", max_points=points)
        assert r.status_code == 200
        sizes.append(len(r.content))
        held = [hit[1] for hit in (cache.get(k) for k in list(cache._items)) if hit is not None]
        assert cache.bytes == sum(map(len, held)) <= CACHE_BYTES
    assert sum(sizes) > CACHE_BYTES  # the bound was reached, and older responses made room
    big = get(url, f"/runs/{run_id}/metrics", keys="loss", max_points=20_000)
    assert len(big.content) > CACHE_BYTES and cache.bytes <= CACHE_BYTES  # larger than the bound: not kept


def test_a_run_holds_at_most_max_metric_keys_keys(live):
    url, app = live
    created = post(url, "/tracking/runs", {"run_key": uuid.uuid4().hex, "name": "many keys",
                                           "config": get_preset("tiny").to_dict()})
    assert created.status_code == 201, created.text
    run_id, secret = created.json()["run"]["id"], created.json()["write_secret"]
    limit = app.state.settings.max_metric_keys

    def log(keys: range) -> httpx.Response:
        return httpx.post(f"{url}{API}/tracking/runs/{run_id}/log", headers={SECRET_HEADER: secret}, timeout=120,
                          json={"metrics": [{"key": f"k{i:05d}", "step": 1, "value": 1.0, "time": 1.0} for i in keys]})

    too_many = log(range(limit + 1))
    assert too_many.status_code == 422 and str(limit) in too_many.json()["detail"]
    assert "AAH_MAX_METRIC_KEYS" in too_many.json()["detail"]
    assert log(range(limit)).status_code == 200
    assert log(range(limit - 5, limit)).status_code == 200  # keys it holds already
    assert log(range(limit, limit + 1)).status_code == 422
    with transaction(app.state.sessions) as s:
        assert len(s.scalars(select(LatestMetric.key).where(LatestMetric.run_id == run_id)).all()) == limit
    # every summary of it stays small: its first keys by name, and how many it holds
    run = get(url, f"/runs/{run_id}").json()
    assert run["n_keys"] == limit and len(run["summary"]) == run_store.SUMMARY_KEYS
    listing = get(url, "/runs", limit=1000)
    assert listing.status_code == 200 and len(listing.content) < MAX_RESPONSE
    many = post(url, "/runs/compare", {"run_ids": [run_id, *app.state.long_runs]})
    assert many.status_code == 200 and len(many.json()["keys"]) == run_store.SUMMARY_KEYS + 1


def test_long_in_lists_are_batched(live):
    """More keys than SQLite's bound-parameter limit (32,766) in one aggregate read."""
    _, app = live
    ids = app.state.long_runs
    keys = ["loss", *(f"absent-{i}" for i in range(40_000))]
    with transaction(app.state.sessions) as s:
        values = metric_store.aggregate_metrics(s, ids, keys, "last")
        steps = metric_store.steps_at_or_before(s, ids, keys, 10)
    assert [values[i]["loss"] for i in ids] == [loss(STEPS - 1, 0), loss(STEPS - 1, 1)]
    assert values[ids[0]]["absent-7"] is None and steps[ids[1]]["loss"] == 10
