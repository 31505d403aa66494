"""Metric points: the batch write (with each key's latest value, row count and rollups) and the reads
over them (series, keys, version, per-run aggregates).

Like ``backend.store.run_store``, functions over a ``Session`` whose commit belongs to the caller; each run's
latest values for summaries stay in ``backend.store.run_store.latest_values`` (``runs_public`` reads them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import case, func, null, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.schemas.errors import InvalidInput, NotFound
from backend.schemas.runs import MetricSeries, MetricValue
from backend.store import rollups
from backend.store.db import driver_rows, upsert
from backend.store.downsample import nonfinite_of
from backend.store.run_store import batched, run_exists
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


def log_metrics(s: Session, run_id: int, rows: Iterable[MetricRow], max_keys: int | None = None) -> int:
    """Insert metric rows, ignoring (run, key, step) already stored; move each key's latest value forward
    and its row count up; returns rows written. With ``max_keys``, a batch that would give the run more
    keys than that is refused whole (422): every read and summary of a run is bounded by its keys.

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
    if max_keys is not None:
        _check_key_count(s, run_id, list(counts), max_keys)
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


def _check_key_count(s: Session, run_id: int, keys: list[str], max_keys: int) -> None:
    held = s.scalar(select(func.count()).where(LatestMetric.run_id == run_id)) or 0
    if held + len(keys) <= max_keys:  # cheap: even were every key new, the run stays within the limit
        return
    known = sum(len(s.scalars(select(LatestMetric.key).where(LatestMetric.run_id == run_id,
                                                             LatestMetric.key.in_(chunk))).all())
                for chunk in batched(keys))
    if held + len(keys) - known > max_keys:
        raise InvalidInput(f"metrics: run {run_id} holds {held} metric keys and this batch adds "
                           f"{len(keys) - known}; a run may hold at most {max_keys} (AAH_MAX_METRIC_KEYS)")


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
    for chunk in batched(keys):
        s.execute(update(LatestMetric).where(LatestMetric.run_id == run_id, LatestMetric.key.in_(chunk))
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
    """Every row of the series per key, ordered by step (one row per step), non-finite values as their
    kind. Unbounded: for the engine's own use (tests, migrations); HTTP reads are downsampled or paged."""
    run_exists(s, run_id)
    out: dict[str, MetricSeries] = {}
    for chunk in [None] if keys is None else batched(list(keys)):
        out.update(_series(s.connection().execute(_rows_query(run_id, chunk, min_step, max_step))))
    return out


Cursor = tuple[str, int]  # the (key, step) a page starts at


def read_page(s: Session, run_id: int, keys: Sequence[str] | None, min_step: int | None, max_step: int | None,
              cursor: Cursor | None, limit: int) -> tuple[dict[str, MetricSeries], Cursor | None]:
    """One page of the full series: at most ``limit`` rows in (key, step) order from ``cursor`` (None:
    the first row), and the cursor of the next page (None after the last row)."""
    run_exists(s, run_id)
    query = _rows_query(run_id, keys, min_step, max_step)
    if cursor is not None:
        key, step = cursor
        query = query.where((Metric.key > key) | ((Metric.key == key) & (Metric.step >= step)))
    rows = s.connection().execute(query.limit(limit + 1)).all()
    following = (rows[limit].key, rows[limit].step) if len(rows) > limit else None
    return _series(rows[:limit]), following


def _rows_query(run_id: int, keys: Sequence[str] | None, min_step: int | None, max_step: int | None):  # noqa: ANN202
    query = select(Metric.key, Metric.step, Metric.value, Metric.special, Metric.timestamp).where(
        Metric.run_id == run_id)
    if keys is not None:
        query = query.where(Metric.key.in_(list(keys)))
    if min_step is not None:
        query = query.where(Metric.step >= min_step)
    if max_step is not None:
        query = query.where(Metric.step <= max_step)
    return query.order_by(Metric.key, Metric.step)


def _series(rows: Iterable) -> dict[str, MetricSeries]:
    """MetricSeries per key of (key, step, value, special, timestamp) rows in (key, step) order."""
    cols: dict[str, tuple[list, list, list]] = {}
    # Core rows on the session's connection: a third faster than ORM rows for long series.
    for key, step, value, special, ts in rows:
        steps, values, stamps = cols.setdefault(key, ([], [], []))
        steps.append(step)
        values.append(value if special is None else special)
        stamps.append(ts)
    return {key: MetricSeries(step=steps, value=values, timestamp=stamps,
                              nonfinite=nonfinite_of(list(zip(steps, values, stamps)), len(steps)))
            for key, (steps, values, stamps) in cols.items()}


def metrics_version(s: Session, run_id: int) -> tuple[int, int]:
    """(metric rows, metric keys) of a run: changes whenever a row is added (one row per key to read)."""
    ((rows, keys),) = driver_rows(s.connection(), _VERSION, {"run": run_id})
    return int(rows), int(keys)


# as text: building the select and its cache key cost more than the read (every metrics request runs it)
_VERSION = text("SELECT coalesce(sum(n_rows), 0), count(*) FROM latest_metrics WHERE run_id = :run")


def aggregate_metrics(s: Session, run_ids: Sequence[int], keys: Sequence[str], agg: str,
                      step: int | None = None) -> dict[int, dict[str, MetricValue | None]]:
    """One value per (run, key): the last, min or max value, or the value at the last step <= ``step``
    (a non-finite one as its kind).

    Non-finite values are NULL in the store, so min/max skip them.
    """
    out: dict[int, dict[str, MetricValue | None]] = {r: dict.fromkeys(keys) for r in run_ids}
    for ids in batched(list(run_ids), 100):
        for chunk in batched(list(keys), 400):  # at most 500 ids and keys a statement
            for run_id, key, value, special in s.execute(_aggregate(ids, chunk, agg, step)):
                out[run_id][key] = value if special is None else special
    return out


def _aggregate(run_ids: list[int], keys: list[str], agg: str, step: int | None):  # noqa: ANN202
    if agg == "last":
        return select(LatestMetric.run_id, LatestMetric.key, LatestMetric.value, LatestMetric.special).where(
            LatestMetric.run_id.in_(run_ids), LatestMetric.key.in_(keys))
    if agg in ("min", "max"):
        fn = func.min if agg == "min" else func.max
        return select(Metric.run_id, Metric.key, fn(Metric.value), null()).where(
            Metric.run_id.in_(run_ids), Metric.key.in_(keys)).group_by(Metric.run_id, Metric.key)
    last = _steps_at_or_before(run_ids, keys, step).subquery()
    return select(Metric.run_id, Metric.key, Metric.value, Metric.special).join(
        last, (Metric.run_id == last.c.run_id) & (Metric.key == last.c.key) & (Metric.step == last.c.step))


def _steps_at_or_before(run_ids: Sequence[int], keys: Sequence[str], step: int | None):
    return (select(Metric.run_id, Metric.key, func.max(Metric.step).label("step"))
            .where(Metric.run_id.in_(run_ids), Metric.key.in_(keys), Metric.step <= step)
            .group_by(Metric.run_id, Metric.key))


def steps_at_or_before(s: Session, run_ids: Sequence[int], keys: Sequence[str],
                       step: int) -> dict[int, dict[str, int | None]]:
    """Per (run, key): the stored step that `aggregate_metrics(..., "at_step", step)` reads (the last
    step <= ``step``), or None when the series starts later."""
    out: dict[int, dict[str, int | None]] = {r: dict.fromkeys(keys) for r in run_ids}
    for ids in batched(list(run_ids), 100):
        for chunk in batched(list(keys), 400):
            for run_id, key, found in s.execute(_steps_at_or_before(ids, chunk, step)):
                out[run_id][key] = found
    return out
