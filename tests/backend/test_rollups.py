"""Metric rollups (backend/rollups.py) on SQLite and PostgreSQL: after any sequence of batches (late
rows, steps sent again, non-finite values) every stored bucket of every level holds exactly what
the stored rows say (first row, finite extremes, count of non-finite rows), compared with a
brute-force summary of the rows; a store migrated from 0007 or 0008 gets the same rollups for the
rows it already held."""

from __future__ import annotations

import math
import random

from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select

from backend.store import metric_store, rollups, run_store
from backend.store.db import make_session_factory, transaction
from backend.store.migrate import alembic_config, upgrade
from backend.store.tables import MetricRollup
from tests.backend.conftest import OLD_EXPERIMENT, old_store


def expected_rollups(rows: dict[str, list[tuple[int, float | str, float]]], factor: int = rollups.FACTOR,
                     levels: int = rollups.LEVELS) -> set[tuple]:
    """Every (key, level, bucket, first row, minimum row, maximum row, non-finite rows) the stored rows
    imply, by brute force (a row: step and timestamp for the first, step, value and timestamp for the
    extremes; a non-finite value is its kind), with levels ``factor`` times apart."""
    out = set()
    for key, points in rows.items():
        for level in range(levels):
            width = rollups.BASE_WIDTH * factor ** level
            for bucket in {step // width for step, _, _ in points}:
                inside = [p for p in points if p[0] // width == bucket]
                finite = [(v, step, ts) for step, v, ts in inside if not isinstance(v, str)]
                lo = min(finite, default=(None, None, None))
                hi = max(finite, key=lambda p: (p[0], -p[1]), default=(None, None, None))
                first = min(inside)
                out.add((key, level, bucket, first[0], first[2], lo[1], lo[0], lo[2], hi[1], hi[0], hi[2],
                         len(inside) - len(finite)))
    return out


def stored_rollups(s, run_id: int) -> set[tuple]:
    r = MetricRollup.__table__.c
    return set(s.execute(select(r.key, r.level, r.bucket, *(r[c] for c in rollups.COLUMNS))
                         .where(r.run_id == run_id)).tuples())


def stored_rows(s, run_id: int) -> dict[str, list[tuple[int, float | str, float]]]:
    return {key: list(zip(series.step, series.value, series.timestamp))
            for key, series in metric_store.read_metrics(s, run_id).items()}


values = st.one_of(st.floats(-1e3, 1e3, allow_nan=False),
                   st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0]))
point = st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 20_000), values)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(point, min_size=1, max_size=40), min_size=1, max_size=4),
       resend=st.booleans())
def test_rollups_match_the_stored_rows_after_any_batches(module_sessions, batches, resend):
    with transaction(module_sessions) as s:
        run_id = run_store.create_run(s, name="rollups", experiment="rollups")
    if resend:  # a retried batch: every step already stored, other values (which must not count)
        batches.append([(key, step, -1e9) for key, step, _ in batches[0]])
    for n, batch in enumerate(batches):  # timestamps tell the batches apart
        with transaction(module_sessions) as s:
            rows = [(key, step, value, n + i / 100) for i, (key, step, value) in enumerate(batch)]
            metric_store.log_metrics(s, run_id, rows)
    with transaction(module_sessions) as s:
        assert stored_rollups(s, run_id) == expected_rollups(stored_rows(s, run_id))


def test_a_store_migrated_from_0007_gets_rollups_of_its_rows(store_url):
    engine = old_store(store_url, "0007", OLD_EXPERIMENT,
                       "INSERT INTO runs (id, name, experiment_id, status, created_at, read_only, source) "
                       "VALUES (1, 'old', 1, 'FINISHED', 0, false, 'job')",
                       "INSERT INTO metrics (run_id, key, step, value, special, timestamp) VALUES "
                       "(1, 'loss', 3, 2.0, NULL, 1.0), (1, 'loss', 900, 1.5, NULL, 2.0), "
                       "(1, 'loss', 70000, NULL, 'nan', 3.0), (1, 'acc', 5, 0.25, NULL, 4.0)")
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        rows = stored_rows(s, 1)
        assert rows == {"loss": [(3, 2.0, 1.0), (900, 1.5, 2.0), (70000, "nan", 3.0)], "acc": [(5, 0.25, 4.0)]}
        assert stored_rollups(s, 1) == expected_rollups(rows)
    engine.dispose()


def test_a_store_migrated_from_0008_counts_the_non_finite_rows_it_held(store_url):
    """Migration 0011 counts each bucket's non-finite rows of series stored before it (rollups of 0008 to
    0010 had no count); then down to 0010 and up again gives the same rollups."""
    run = ("INSERT INTO runs (id, name, experiment_id, status, created_at, read_only, source) "
           "VALUES (1, 'old', 1, 'FINISHED', 0, false, 'job')")
    points = [(step, float(step % 7), 1.0 + step) for step in range(0, 5000, 3)]
    points[100] = (points[100][0], "nan", points[100][2])  # inside a bucket full of finite values
    points[900] = (points[900][0], "-inf", points[900][2])
    values = ", ".join(f"(1, 'loss', {step}, {'NULL' if isinstance(v, str) else v}, "
                       f"{repr(v) if isinstance(v, str) else 'NULL'}, {ts})" for step, v, ts in points)
    rollups_0008 = ", ".join(  # what 0008 built for these rows, less the count it had no column for
        f"(1, 'loss', {r[1]}, {r[2]}, {', '.join('NULL' if x is None else repr(x) for x in r[3:11])})"
        for r in sorted(expected_rollups({"loss": points})))
    engine = old_store(store_url, "0008", OLD_EXPERIMENT, run,
                       f"INSERT INTO metrics (run_id, key, step, value, special, timestamp) VALUES {values}",
                       f"INSERT INTO metric_rollups (run_id, key, level, bucket, {', '.join(rollups.BASE_COLUMNS)}) "
                       f"VALUES {rollups_0008}")
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        assert stored_rollups(s, 1) == expected_rollups({"loss": points})
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0010")
        assert "n_nonfinite" not in {c["name"] for c in inspect(conn).get_columns("metric_rollups")}
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        assert stored_rollups(s, 1) == expected_rollups({"loss": points})
    engine.dispose()


def _old_store_with(store_url: str, revision: str, points: list[tuple[int, float | str, float]], factor: int,
                    levels: int):
    """A store at ``revision`` holding series 'loss' of run 1 and the rollups it had there (levels
    ``factor`` times apart), as raw SQL of that revision's schema."""
    def sql(x: object) -> str:
        return "NULL" if x is None else repr(x)

    values = ", ".join(f"(1, 'loss', {step}, {'NULL' if isinstance(v, str) else v}, "
                       f"{repr(v) if isinstance(v, str) else 'NULL'}, {ts})" for step, v, ts in points)
    rows = ", ".join(f"(1, 'loss', {', '.join(map(sql, r[1:]))})"
                     for r in sorted(expected_rollups({"loss": points}, factor, levels)))
    return old_store(store_url, revision, OLD_EXPERIMENT,
                     "INSERT INTO runs (id, name, experiment_id, status, created_at, read_only, source) "
                     "VALUES (1, 'old', 1, 'FINISHED', 0, false, 'job')",
                     f"INSERT INTO metrics (run_id, key, step, value, special, timestamp) VALUES {values}",
                     f"INSERT INTO metric_rollups (run_id, key, level, bucket, {', '.join(rollups.COLUMNS)}) "
                     f"VALUES {rows}")


def test_a_store_migrated_from_0013_gets_levels_two_times_apart_and_back(store_url):
    """Migration 0014 recomputes every level above 0 two times apart (they were four); its downgrade
    gives back exactly the rollups the store had."""
    rng = random.Random(5)
    points = [(step, round(rng.uniform(-1, 1), 3), 1.0 + step) for step in range(0, 4000, 3)]
    points += [(70_001, "nan", 9.0), (1_000_003, 0.5, 10.0)]  # far steps: every level has a bucket
    points[200] = (points[200][0], "inf", points[200][2])
    engine = _old_store_with(store_url, "0013", points, factor=4, levels=12)
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        assert stored_rollups(s, 1) == expected_rollups({"loss": points}, factor=2, levels=23)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0013")
    with transaction(make_session_factory(engine)) as s:
        assert stored_rollups(s, 1) == expected_rollups({"loss": points}, factor=4, levels=12)
    engine.dispose()


def test_levels_rebuilt_in_chunks_smaller_than_a_series_match_its_rows(module_sessions):
    """rollups.rebuild_levels reads each level a chunk at a time: a parent bucket cut by a chunk's end
    is merged whole in the next one."""
    rng = random.Random(7)
    with transaction(module_sessions) as s:
        run_id = run_store.create_run(s, name="rebuilt", experiment="rollups")
        metric_store.log_metrics(s, run_id, [(key, step, rng.choice([rng.uniform(-5, 5), math.nan]), 1.0)
                                             for key in ("a", "b") for step in rng.sample(range(30_000), 400)])
    with transaction(module_sessions) as s:
        rollups.rebuild_levels(s.connection(), chunk=5)
    with transaction(module_sessions) as s:
        assert stored_rollups(s, run_id) == expected_rollups(stored_rows(s, run_id))
