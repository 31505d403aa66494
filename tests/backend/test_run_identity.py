"""A run's identity over HTTP: source, group, seed, and the editable description, notes and tags."""

from __future__ import annotations

import pytest

from backend.store import run_store
from backend.store.db import transaction

API = "/api/v1"


@pytest.fixture(scope="module")
def grouped(client) -> list[int]:
    """Three seeds of one group (source suite) and one tracked run with a tag."""
    with transaction(client.app.state.sessions) as s:
        ids = [run_store.create_run(s, name=f"row-s{seed}", experiment="ident", status="FINISHED", source="suite",
                                group="row", seed=seed) for seed in range(3)]
        ids.append(run_store.create_run(s, name="far away", experiment="ident", source="tracked", tags=["gpu", "a100"]))
    return ids


def test_sources_of_the_seeded_runs(client):
    paper = client.get(f"{API}/runs", params={"source": "paper"}).json()
    assert len(paper) == 10 and all(r["read_only"] and r["source"] == "paper" for r in paper)
    assert {r["group"] for r in paper} == {"baseline", "grouping_off", "full_adaptive", "shallow_freeze",
                                            "deep_practical_reuse"}
    (demo,) = client.get(f"{API}/runs", params={"experiment": "demo"}).json()
    assert demo["source"] == "imported" and demo["seed"] == 0


def test_filters_by_group_source_and_tag(client, grouped):
    rows = client.get(f"{API}/runs", params={"group": "row"}).json()
    assert sorted(r["seed"] for r in rows) == [0, 1, 2] and {r["source"] for r in rows} == {"suite"}
    tracked = client.get(f"{API}/runs", params={"source": "tracked", "experiment": "ident"}).json()
    assert [r["id"] for r in tracked] == [grouped[3]] and tracked[0]["tags"] == ["a100", "gpu"]
    assert [r["id"] for r in client.get(f"{API}/runs", params={"tag": "gpu"}).json()] == [grouped[3]]
    assert client.get(f"{API}/runs", params={"tag": "nope"}).json() == []
    assert client.get(f"{API}/runs", params={"source": "elsewhere"}).status_code == 422


def test_patch_edits_description_notes_and_tags(client, grouped):
    run_id = grouped[0]
    r = client.patch(f"{API}/runs/{run_id}", json={"description": "seed 0 of row", "notes": "looks fine",
                                                    "tags": ["keep", " best ", "keep"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["description"], body["notes"], body["tags"]) == ("seed 0 of row", "looks fine", ["best", "keep"])
    r = client.patch(f"{API}/runs/{run_id}", json={"notes": "second look"})  # omitted fields stay
    assert r.json()["description"] == "seed 0 of row" and r.json()["tags"] == ["best", "keep"]
    assert client.get(f"{API}/runs/{run_id}").json()["notes"] == "second look"
    assert client.patch(f"{API}/runs/{run_id}", json={"tags": []}).json()["tags"] == []


@pytest.mark.parametrize("body", [{"tags": ["a,b"]}, {"tags": [""]}, {"tags": ["x" * 65]}, {"colour": "red"},
                                  {"name": ""}, {"notes": 5}])
def test_patch_refuses_bad_input(client, grouped, body):
    r = client.patch(f"{API}/runs/{grouped[1]}", json=body)
    assert r.status_code == 422 and r.json()["detail"]


def test_patch_refuses_read_only_and_missing_runs(client):
    paper = client.get(f"{API}/runs", params={"source": "paper"}).json()[0]
    r = client.patch(f"{API}/runs/{paper['id']}", json={"notes": "mine"})
    assert r.status_code == 409 and "read-only" in r.json()["detail"]
    assert client.patch(f"{API}/runs/999999", json={"notes": "x"}).status_code == 404
