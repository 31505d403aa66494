"""Upgrades keep data: a store written at the previous schema revision (built with Alembic, filled
with raw SQL as an older service would have left it) is migrated by the app's startup and keeps every
run, param, metric (NaN included), plan and saved view."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from backend.app import create_app
from backend.settings import Settings
from backend.store.db import make_engine
from backend.store.migrate import alembic_config, migrate

TABLES = ("experiments", "runs", "params", "metrics", "latest_metrics", "window_plans", "views")
N_RUNS, N_STEPS = 3, 40


def _revisions() -> tuple[str, str]:
    """(previous, head): the head revision and the one it upgrades from."""
    script = ScriptDirectory.from_config(alembic_config())
    (head,) = script.get_heads()  # one line of history: two heads would fail `upgrade head`
    previous = script.get_revision(head).down_revision
    if previous is None:
        pytest.skip(f"the schema has one revision ({head}): there is no older store to upgrade yet")
    assert isinstance(previous, str), f"revision {head} merges branches; test each parent"
    return previous, head


def _fill(engine: Engine) -> None:
    """Rows as a service at the previous revision writes them, including one it left RUNNING."""
    t0 = 1_750_000_000_000
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO experiments (id, name, read_only, created_at) "
                          "VALUES (1, 'legacy', 0, :t)"), {"t": t0})
        for run_id, status in zip(range(1, N_RUNS + 1), ("FINISHED", "FAILED", "RUNNING")):
            conn.execute(text(
                "INSERT INTO runs (id, name, experiment_id, status, preset, config_json, seq_len, "
                "created_at, progress_step, total_steps, read_only) "
                "VALUES (:id, :name, 1, :status, 'tiny', '{}', 64, :t, :step, :step, 0)"),
                {"id": run_id, "name": f"old run {run_id}", "status": status, "t": t0 + run_id,
                 "step": N_STEPS - 1})
            conn.execute(text("INSERT INTO params (run_id, key, value) VALUES (:r, 'train.lr', '0.002'), "
                              "(:r, 'model.n_layer', '2')"), {"r": run_id})
            rows = [{"r": run_id, "k": key, "s": step, "v": _value(run_id, key, step), "ts": 1.0 + step}
                    for key in ("train_loss", "causal_coverage") for step in range(N_STEPS)]
            conn.execute(text("INSERT INTO metrics (run_id, key, step, value, special, timestamp) "
                              "VALUES (:r, :k, :s, :v, NULL, :ts)"), rows)
            conn.execute(text("INSERT INTO latest_metrics (run_id, key, step, value, timestamp) VALUES "
                              "(:r, :k, :s, :v, 1.0)"),  # every key's latest row, as the service keeps them
                         [{"r": run_id, "k": key, "s": N_STEPS - 1, "v": _value(run_id, key, N_STEPS - 1)}
                          for key in ("train_loss", "causal_coverage")])
            for layer in range(2):
                for head in range(2):
                    conn.execute(text("INSERT INTO window_plans (run_id, step, layer, head, window) VALUES "
                                      "(:r, 0, :l, :h, :w)"), {"r": run_id, "l": layer, "h": head,
                                                               "w": None if head else 8 * (layer + 1)})
        # A diverged step, stored the safe way (value NULL, special 'nan').
        conn.execute(text("INSERT INTO metrics (run_id, key, step, value, special, timestamp) "
                          "VALUES (2, 'train_loss', :s, NULL, 'nan', 99.0)"), {"s": N_STEPS})
        conn.execute(text("INSERT INTO views (id, name, page, state_json, created_at) VALUES "
                          "(1, 'talk', 'editor', '{\"model\": \"demo\"}', :t)"), {"t": t0})


def _value(run_id: int, key: str, step: int) -> float:
    return round(run_id + 1.0 / (step + 1), 6) if key == "train_loss" else 0.25 * run_id


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() for table in TABLES}


@pytest.fixture
def old_store(tmp_path: Path) -> tuple[Settings, dict[str, int]]:
    previous, _ = _revisions()
    settings = Settings(data_dir=tmp_path, seed_demo=False, seed_paper=False, seed_suite=False, preload_models=False)
    engine = make_engine(settings.db_path)
    migrate(engine, previous)
    _fill(engine)
    counts = _counts(engine)
    engine.dispose()
    return settings, counts


def test_starting_a_newer_app_migrates_and_keeps_every_row(old_store) -> None:
    settings, before = old_store
    _, head = _revisions()
    with TestClient(create_app(settings)) as client:
        runs = {run["id"]: run for run in client.get("/api/v1/runs", params={"limit": 1000}).json()}
        assert set(runs) == set(range(1, N_RUNS + 1))
        assert runs[1]["status"] == "FINISHED"
        assert runs[1]["params"] == {"train.lr": "0.002", "model.n_layer": "2"}
        assert runs[3]["status"] == "FAILED", "a run left RUNNING by the old service is closed, not dropped"
        for run_id in runs:
            series = client.get(f"/api/v1/runs/{run_id}/metrics").json()["series"]
            expected = [_value(run_id, "train_loss", s) for s in range(N_STEPS)]
            assert series["train_loss"]["value"][:N_STEPS] == expected
            assert series["causal_coverage"]["step"] == list(range(N_STEPS))
            windows = client.get(f"/api/v1/runs/{run_id}/windows").json()["windows"]
            assert windows == [[8, None], [16, None]]
        nan_series = client.get("/api/v1/runs/2/metrics", params={"keys": "train_loss"}).json()["series"]
        assert nan_series["train_loss"]["value"][-1] == "nan"
        assert len(nan_series["train_loss"]["step"]) == N_STEPS + 1
        assert [v["name"] for v in client.get("/api/v1/views").json()] == ["talk"]
    engine = make_engine(settings.db_path)
    try:
        assert _counts(engine) == before
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == head
            stored = conn.execute(text("SELECT value FROM metrics WHERE run_id = 1 AND key = 'train_loss' "
                                       "ORDER BY step")).scalars().all()
        assert all(math.isclose(a, _value(1, "train_loss", s)) for s, a in enumerate(stored))
    finally:
        engine.dispose()


def test_a_second_start_is_a_no_op(old_store) -> None:
    settings, before = old_store
    for _ in range(2):
        with TestClient(create_app(settings)) as client:
            assert client.get("/api/v1/health").json()["runs"] == N_RUNS
    engine = make_engine(settings.db_path)
    assert _counts(engine) == before
    engine.dispose()


def test_every_revision_downgrades_and_upgrades_again(old_store) -> None:
    settings, before = old_store
    previous, head = _revisions()
    engine = make_engine(settings.db_path)
    try:
        migrate(engine, head)
        migrate(engine, previous, down=True)
        migrate(engine, head)
        assert _counts(engine) == before
    finally:
        engine.dispose()

