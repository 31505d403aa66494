"""Seeds as groups: mean / sample std / min / max per metric and per aligned step, checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backend.store import metric_store, run_store
from backend.store.db import transaction
from backend.store.groups import align, describe

API = "/api/v1"
RNG = np.random.default_rng(7)


def test_describe_matches_numpy():
    for n in (2, 3, 5, 17):
        xs = RNG.normal(1.7, 0.3, n)
        stat = describe(list(xs))
        assert stat.n == n
        assert stat.mean == pytest.approx(float(np.mean(xs)), rel=1e-13)
        assert stat.std == pytest.approx(float(np.std(xs, ddof=1)), rel=1e-12)
        assert (stat.min, stat.max) == (float(xs.min()), float(xs.max()))


def test_describe_leaves_out_non_finite_values_and_has_no_std_of_one():
    stat = describe([2.0, None, math.nan, math.inf, 4.0])
    assert (stat.n, stat.mean, stat.std) == (2, 3.0, pytest.approx(math.sqrt(2)))
    one = describe([5.0, None])
    assert (one.n, one.mean, one.std) == (1, 5.0, None)
    assert describe([None, math.nan]) is None and describe([]) is None


def test_align_reads_each_run_at_or_before_every_step_of_the_common_span():
    a = ([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    b = ([0, 2, 3], [8.0, 4.0, 9.0])
    c = ([2, 3, 3, 5], [0.0, 1.0, 6.0, 7.0])  # step 3 twice: its last value counts
    curve = align({1: a, 2: b, 3: c})
    assert curve.step == [2, 3] and curve.n == [3, 3] and curve.run_ids == [1, 2, 3]
    assert curve.steps_dropped == 4  # steps 0, 1, 4 and 5 lie outside the span every run covers
    for i, values in enumerate(([2.0, 4.0, 0.0], [3.0, 9.0, 6.0])):
        assert curve.mean[i] == pytest.approx(np.mean(values)) and curve.std[i] == pytest.approx(np.std(values, ddof=1))
        assert (curve.min[i], curve.max[i]) == (min(values), max(values))


def test_align_holds_a_sparse_series_until_it_changes():
    """Coverage is logged when the plan changes: between changes a run keeps its last value."""
    a = ([1, 40, 100], [1.0, 0.5, 0.25])
    b = ([1, 60, 100], [1.0, 0.75, 0.5])
    curve = align({1: a, 2: b})
    assert curve.step == [1, 40, 60, 100]
    assert curve.mean == [1.0, pytest.approx(0.75), pytest.approx(0.625), pytest.approx(0.375)]
    assert curve.min == [1.0, 0.5, 0.5, 0.25] and curve.max == [1.0, 1.0, 0.75, 0.5]


def test_align_reduces_long_curves_by_the_store_rule_keeping_spikes_and_the_last_step():
    steps = list(range(1, 1001))
    first = [float(s) for s in steps]
    first[436] = 5000.0  # a spike at step 437, and a dip at 701
    first[700] = -5000.0
    curve = align({1: (steps, first), 2: (steps, [2.0 * s for s in steps])}, max_points=50)
    expected = {s: (f + 2.0 * s) / 2 for s, f in zip(steps, first)}
    assert len(curve.step) <= 50 and curve.step[0] == 1 and curve.step[-1] == 1000
    assert curve.mean == [expected[s] for s in curve.step]
    assert 437 in curve.step and 701 in curve.step  # each bucket's minimum and maximum mean


@pytest.fixture(scope="module")
def seeded(client) -> dict[str, list[int]]:
    """Two groups of one experiment (3 and 2 seeds) with random curves, one group elsewhere, one lone run."""
    ids: dict[str, list[int]] = {}
    with transaction(client.app.state.sessions) as s:
        for exp, group, seeds in (("grp-exp", "a", 3), ("grp-exp", "b", 2), ("grp-other", "a", 2)):
            for seed in range(seeds):
                run_id = run_store.create_run(s, name=f"{group}-s{seed}", experiment=exp, status="FINISHED",
                                          source="suite", group=group, seed=seed, tags=["t"] if exp == "grp-exp" else [])
                curve = RNG.normal(2.0, 0.5, 10)
                metric_store.log_metrics(s, run_id, [("val_loss", step, float(v), 0.0)
                                                     for step, v in enumerate(curve)])
                metric_store.log_metrics(s, run_id, [("acr", 9, 0.25 * (seed + 1), 0.0)])
                ids.setdefault(f"{exp}/{group}", []).append(run_id)
        run_store.create_run(s, name="no group", experiment="grp-exp", status="FINISHED")
    return ids


def _values(client, run_ids, key):
    return [client.get(f"{API}/runs/{i}").json()["summary"][key] for i in run_ids]


def test_groups_endpoint_summarises_each_group_of_each_experiment(client, seeded):
    rows = client.get(f"{API}/runs/groups", params={"experiment": "grp-exp", "keys": "val_loss,acr"}).json()
    assert [(r["group"], len(r["run_ids"])) for r in rows] == [("a", 3), ("b", 2)]
    for row in rows:
        assert row["run_ids"] == seeded[f"grp-exp/{row['group']}"] and row["sources"] == ["suite"]
        assert row["seeds"] == list(range(len(row["run_ids"])))
        last = _values(client, row["run_ids"], "val_loss")
        stat = row["stats"]["val_loss"]
        assert stat["mean"] == pytest.approx(np.mean(last)) and stat["std"] == pytest.approx(np.std(last, ddof=1))
        assert row["stats"]["acr"]["mean"] == pytest.approx(np.mean([0.25 * (k + 1) for k in range(len(last))]))
    other = client.get(f"{API}/runs/groups", params={"group": "a", "keys": "val_loss"}).json()
    assert sorted(r["experiment"] for r in other) == ["grp-exp", "grp-other"]  # never merged across experiments


def test_groups_endpoint_min_agg_and_filters(client, seeded):
    (row,) = client.get(f"{API}/runs/groups", params={"experiment": "grp-exp", "group": "b", "keys": "val_loss",
                                                      "agg": "min"}).json()
    minima = [min(client.get(f"{API}/runs/{i}/metrics").json()["series"]["val_loss"]["value"]) for i in row["run_ids"]]
    assert row["stats"]["val_loss"]["mean"] == pytest.approx(np.mean(minima))
    assert client.get(f"{API}/runs/groups", params={"tag": "t", "group": "nothing"}).json() == []
    assert {r["experiment"] for r in client.get(f"{API}/runs/groups", params={"tag": "t"}).json()} == {"grp-exp"}
    assert client.get(f"{API}/runs/groups", params={"agg": "at_step"}).status_code == 422


def test_group_series_endpoint_is_the_stepwise_mean_and_std(client, seeded):
    r = client.get(f"{API}/runs/groups/series", params={"experiment": "grp-exp", "group": "a", "keys": "val_loss"})
    assert r.status_code == 200, r.text
    body = r.json()
    curve = body["series"]["val_loss"]
    runs = [client.get(f"{API}/runs/{i}/metrics").json()["series"]["val_loss"] for i in seeded["grp-exp/a"]]
    matrix = np.array([s["value"] for s in runs])
    assert curve["step"] == runs[0]["step"] and curve["n"] == [3] * 10 and curve["steps_dropped"] == 0
    np.testing.assert_allclose(curve["mean"], matrix.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(curve["std"], matrix.std(axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(curve["min"], matrix.min(axis=0))
    assert list(body["series"]) == ["val_loss"] and body["seeds"] == [0, 1, 2]


def test_group_series_refuses_unknown_groups(client, seeded):
    r = client.get(f"{API}/runs/groups/series", params={"experiment": "grp-exp", "group": "zzz"})
    assert r.status_code == 404 and "zzz" in r.json()["detail"]
    assert client.get(f"{API}/runs/groups/series", params={"experiment": "grp-exp"}).status_code == 422
