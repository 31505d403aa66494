"""Metric points: the batch write (with each key's latest value, row count and rollups) and the reads
over them (series, keys, version, per-run aggregates).

Like ``backend.store.run_store``, functions over a ``Session`` whose commit belongs to the caller; each run's
latest values for summaries stay in ``backend.store.run_store.latest_values`` (``runs_public`` reads them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.schemas.errors import NotFound
from backend.schemas.runs import MetricSeries
from backend.store import rollups
from backend.store.db import upsert
from backend.store.run_store import run_exists
from backend.store.tables import LatestMetric, Metric, Run

MetricRow = tuple[str, int, float, float]  # key, step, value, timestamp (epoch seconds)


def split_value(value: float) -> tuple[float | None, str | None]:
    """A float as (value, special): NaN and +-inf are stored as NULL plus a tag."""
    value = float(value)
    if math.isnan(value):
        return None, "nan"
    if math.isinf(value):
        return None, "inf" if value > 0 else "-inf"
    return value, None


_METRIC_COLUMNS = ("run_id", "key", "step", "value", "special", "timestamp")
UNIQUE_VIOLATION = "23505"  # PostgreSQL's SQLSTATE


def log_metrics(s: Session, run_id: int, rows: Iterable[MetricRow]) -> int:
    """Insert metric rows, ignoring (run, key, step) already stored; move each key's latest value forward
    and its row count up; returns rows written.

    A step sent twice is stored once (the first value stays): a tracking client that retries a batch or
    replays its spool cannot duplicate a point. One statement per table and batch, bypassing SQLAlchemy's
    per-row parameter processing (it cost more than SQLite's insert itself): SQLite's executemany of plain
    tuples, PostgreSQL's INSERT ... SELECT FROM unnest(arrays) (psycopg's executemany would send a
    statement per row: 3,400 points/s against 11,500 on SQLite in bench/store.py), its arrays sent in
    binary (in text, psycopg quotes every element in Python: tens of ms a 9,000-point batch). A late row
    with an older step counts, but does not replace the latest value.
    """
    # the run must exist and stay while the batch is written (metric rows have no foreign key: see Metric)
    if s.scalar(select(Run.id).where(Run.id == run_id).with_for_update(read=True, key_share=True)) is None:
        raise NotFound(f"run {run_id} not found")
    records: dict[tuple[str, int], tuple] = {}  # (key, step) -> the row as inserted; the first one stays
    newest: dict[str, tuple] = {}  # key -> its record of the highest step
    points: dict[str, list[tuple[int, float | None, float]]] = defaultdict(list)  # for the rollups
    isfinite = math.isfinite
    for key, step, value, timestamp in rows:  # one pass (three cost 2-3 ms more a 9,000-point batch)
        step = int(step)
        if (key, step) in records:
            continue
        value, timestamp = float(value), float(timestamp)
        rec = ((run_id, key, step, value, None, timestamp) if isfinite(value)
               else (run_id, key, step, *split_value(value), timestamp))
        records[key, step] = rec
        points[key].append((step, rec[3], timestamp))
        top = newest.get(key)
        if top is None or step > top[2]:
            newest[key] = rec
    if not records:
        return 0
    counts = {key: len(key_points) for key, key_points in points.items()}
    conn = s.connection()
    insert = f"INSERT INTO metrics ({', '.join(_METRIC_COLUMNS)}) "
    if conn.dialect.name == "postgresql":
        written = _pg_insert_metrics(s, insert, run_id, records.values())
    else:  # SQLite runs executemany as one prepared statement stepped per row, in C
        written = conn.exec_driver_sql(f"{insert} VALUES ({', '.join(['?'] * len(_METRIC_COLUMNS))}) "
                                       "ON CONFLICT (run_id, key, step) DO NOTHING", list(records.values())).rowcount
    stmt = upsert(s)(LatestMetric)
    newer = stmt.excluded.step > LatestMetric.step
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["run_id", "key"],
        set_={"n_rows": LatestMetric.n_rows + stmt.excluded.n_rows,
              **{c: case((newer, stmt.excluded[c]), else_=LatestMetric.__table__.c[c])
                 for c in ("step", "value", "special", "timestamp")}},
    ), [{**dict(zip(_METRIC_COLUMNS, rec)), "n_rows": counts[key]} for key, rec in newest.items()])
    if written == len(records):
        rollups.add(conn, run_id, points)
    else:  # some steps were there already (or the driver could not say): recount, redo their buckets
        _recount(s, run_id, list(counts))
        for key, key_points in points.items():
            rollups.rebuild(conn, run_id, key, min(p[0] for p in key_points), max(p[0] for p in key_points))
        written = max(written, 0)
    return written


def _pg_insert_metrics(s: Session, insert: str, run_id: int, records: Iterable[tuple]) -> int:
    """One INSERT of the run id and five arrays, sent in binary; returns rows written.

    A plain INSERT first, in a savepoint: PostgreSQL's ON CONFLICT checks every row before inserting it
    (a third of the insert once the rows' other costs are down). When a step is stored already (a
    retried batch), it fails and the same rows go again with ON CONFLICT DO NOTHING.
    """
    arrays = ", ".join(f"%b::{t}[]" for t in ("text", "bigint", "float8", "text", "float8"))
    statement = f"{insert} SELECT %b::bigint, * FROM unnest({arrays})"
    params = (run_id, *map(list, list(zip(*records))[1:]))
    try:
        with s.begin_nested():
            return s.connection().exec_driver_sql(statement, params).rowcount
    except IntegrityError as exc:
        if getattr(exc.orig, "sqlstate", None) != UNIQUE_VIOLATION:
            raise
    return s.connection().exec_driver_sql(f"{statement} ON CONFLICT (run_id, key, step) DO NOTHING",
                                          params).rowcount


def _recount(s: Session, run_id: int, keys: list[str]) -> None:
    count = (select(func.count()).select_from(Metric)
             .where(Metric.run_id == LatestMetric.run_id, Metric.key == LatestMetric.key).scalar_subquery())
    s.execute(update(LatestMetric).where(LatestMetric.run_id == run_id, LatestMetric.key.in_(keys))
              .values(n_rows=count))


def stored_values(s: Session, run_id: int, key: str, steps: Sequence[int],
                  chunk: int = 500) -> dict[int, tuple[float | None, str | None]]:
    """The stored (value, special) of a series at those of ``steps`` it holds (IN lists of ``chunk`` steps)."""
    found: dict[int, tuple[float | None, str | None]] = {}
    steps = list(steps)
    for i in range(0, len(steps), chunk):
        found.update((step, (value, special)) for step, value, special in s.execute(
            select(Metric.step, Metric.value, Metric.special)
            .where(Metric.run_id == run_id, Metric.key == key, Metric.step.in_(steps[i:i + chunk]))))
    return found


def metric_keys(s: Session, run_id: int) -> list[str]:
    return list(s.scalars(select(LatestMetric.key).where(LatestMetric.run_id == run_id)
                          .order_by(LatestMetric.key)))


def read_metrics(s: Session, run_id: int, keys: Sequence[str] | None = None, min_step: int | None = None,
                 max_step: int | None = None) -> dict[str, MetricSeries]:
    """Series per key, ordered by step (one row per step)."""
    run_exists(s, run_id)
    query = select(Metric.key, Metric.step, Metric.value, Metric.timestamp).where(Metric.run_id == run_id)
    if keys is not None:
        query = query.where(Metric.key.in_(list(keys)))
    if min_step is not None:
        query = query.where(Metric.step >= min_step)
    if max_step is not None:
        query = query.where(Metric.step <= max_step)
    cols: dict[str, tuple[list, list, list]] = {}
    # Core rows on the session's connection: a third faster than ORM rows for long series.
    for key, step, value, ts in s.connection().execute(query.order_by(Metric.key, Metric.step)):
        steps, values, stamps = cols.setdefault(key, ([], [], []))
        steps.append(step)
        values.append(value)
        stamps.append(ts)
    return {k: MetricSeries(step=a, value=b, timestamp=c) for k, (a, b, c) in cols.items()}


def metrics_version(s: Session, run_id: int) -> tuple[int, int]:
    """(metric rows, metric keys) of a run: changes whenever a row is added (one row per key to read)."""
    rows, keys = s.execute(select(func.coalesce(func.sum(LatestMetric.n_rows), 0), func.count())
                           .where(LatestMetric.run_id == run_id)).one()
    return int(rows), int(keys)


def aggregate_metrics(s: Session, run_ids: Sequence[int], keys: Sequence[str], agg: str,
                      step: int | None = None) -> dict[int, dict[str, float | None]]:
    """One value per (run, key): the last, min or max value, or the value at the last step <= ``step``.

    Non-finite values are NULL in the store, so min/max skip them.
    """
    out: dict[int, dict[str, float | None]] = {r: dict.fromkeys(keys) for r in run_ids}
    if agg == "last":
        query = select(LatestMetric.run_id, LatestMetric.key, LatestMetric.value)
        query = query.where(LatestMetric.run_id.in_(run_ids), LatestMetric.key.in_(keys))
    elif agg in ("min", "max"):
        fn = func.min if agg == "min" else func.max
        query = select(Metric.run_id, Metric.key, fn(Metric.value)).where(
            Metric.run_id.in_(run_ids), Metric.key.in_(keys)).group_by(Metric.run_id, Metric.key)
    else:
        last = _steps_at_or_before(run_ids, keys, step).subquery()
        query = select(Metric.run_id, Metric.key, Metric.value).join(
            last, (Metric.run_id == last.c.run_id) & (Metric.key == last.c.key) & (Metric.step == last.c.step)
        )
    for run_id, key, value in s.execute(query):
        out[run_id][key] = value
    return out


def _steps_at_or_before(run_ids: Sequence[int], keys: Sequence[str], step: int | None):
    return (select(Metric.run_id, Metric.key, func.max(Metric.step).label("step"))
            .where(Metric.run_id.in_(run_ids), Metric.key.in_(keys), Metric.step <= step)
            .group_by(Metric.run_id, Metric.key))


def steps_at_or_before(s: Session, run_ids: Sequence[int], keys: Sequence[str],
                       step: int) -> dict[int, dict[str, int | None]]:
    """Per (run, key): the stored step that `aggregate_metrics(..., "at_step", step)` reads (the last
    step <= ``step``), or None when the series starts later."""
    out: dict[int, dict[str, int | None]] = {r: dict.fromkeys(keys) for r in run_ids}
    for run_id, key, found in s.execute(_steps_at_or_before(run_ids, keys, step)):
        out[run_id][key] = found
    return out
