"""Metric rollups (backend/rollups.py) on SQLite and PostgreSQL: after any sequence of batches (late
rows, steps sent again, non-finite values) every stored bucket of every level holds exactly what
the stored rows say, compared with a brute-force summary of the rows; a store migrated from 0007
gets the same rollups for the rows it already held."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from backend.store import metric_store, rollups, run_store
from backend.store.db import make_session_factory, transaction
from backend.store.migrate import upgrade
from backend.store.tables import MetricRollup
from tests.backend.conftest import OLD_EXPERIMENT, old_store


def expected_rollups(rows: dict[str, list[tuple[int, float | None, float]]]) -> set[tuple]:
    """Every (key, level, bucket, first row, minimum row, maximum row) the stored rows imply, by brute
    force (a row: step and timestamp for the first, step, value and timestamp for the extremes)."""
    out = set()
    for key, points in rows.items():
        for level in range(rollups.LEVELS):
            width = rollups.width(level)
            for bucket in {step // width for step, _, _ in points}:
                inside = [p for p in points if p[0] // width == bucket]
                finite = [(v, step, ts) for step, v, ts in inside if v is not None]
                lo = min(finite, default=(None, None, None))
                hi = max(finite, key=lambda p: (p[0], -p[1]), default=(None, None, None))
                first = min(inside)
                out.add((key, level, bucket, first[0], first[2], lo[1], lo[0], lo[2], hi[1], hi[0], hi[2]))
    return out


def stored_rollups(s, run_id: int) -> set[tuple]:
    r = MetricRollup.__table__.c
    return set(s.execute(select(r.key, r.level, r.bucket, *(r[c] for c in rollups.COLUMNS))
                         .where(r.run_id == run_id)).tuples())


def stored_rows(s, run_id: int) -> dict[str, list[tuple[int, float | None, float]]]:
    return {key: list(zip(series.step, series.value, series.timestamp))
            for key, series in metric_store.read_metrics(s, run_id).items()}


values = st.one_of(st.floats(-1e3, 1e3, allow_nan=False), st.sampled_from([math.nan, math.inf, 0.0, 1.0]))
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
        assert rows == {"loss": [(3, 2.0, 1.0), (900, 1.5, 2.0), (70000, None, 3.0)], "acc": [(5, 0.25, 4.0)]}
        assert stored_rollups(s, 1) == expected_rollups(rows)
    engine.dispose()
