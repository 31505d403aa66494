"""Downsampled metric reads: at most ``max_points`` points per series, computed in the database.

A series (one key, optionally within a step range) with more rows than asked for is cut into
``(max_points - 1) // 2`` buckets of equal step width. From each bucket the database returns the
row holding its minimum and the row holding its maximum finite value (one row when they are the
same, or when every value in the bucket is non-finite), and the series' last row (highest step,
the latest written on a tie) is always kept. So a spike or a dip never disappears, the final
value is exact, and no more than ``2 * buckets + 1 <= max_points`` points come back, each of them
a stored row (step, value and timestamp unchanged). Buckets are by step, so a zoomed read (a step
range) gets finer buckets over just that range.

The work is two grouped scans of the range on the ``(run_id, key, step)`` index (bucket minimum and
maximum, then the first row holding each) plus indexed lookups: portable SQL that SQLite and
PostgreSQL both run, with nothing brought into Python but the chosen rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from backend.models import LatestMetric, Metric
from backend.schemas import MetricSeries
from backend.store import run_exists

MIN_POINTS = 3  # one bucket's minimum and maximum, and the last point
MAX_POINTS = 100_000  # the most a request may ask for (a downsampled response stays a few MB)


def n_buckets(max_points: int) -> int:
    return (max_points - 1) // 2


def bucket_width(first_step: int, last_step: int, max_points: int) -> int:
    """Steps per bucket, so that [first_step, last_step] falls into at most n_buckets buckets."""
    span = last_step - first_step + 1
    return -(-span // n_buckets(max_points))


def read_downsampled(s: Session, run_id: int, max_points: int, keys: Sequence[str] | None = None,
                     min_step: int | None = None, max_step: int | None = None,
                     ) -> tuple[dict[str, MetricSeries], list[str]]:
    """Series per key with at most ``max_points`` points each, and the keys that were downsampled."""
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}")
    run_exists(s, run_id)
    counts = dict(s.execute(select(LatestMetric.key, LatestMetric.n_rows).where(LatestMetric.run_id == run_id)
                            .order_by(LatestMetric.key)).tuples().all())
    wanted = list(counts) if keys is None else [k for k in dict.fromkeys(keys) if k in counts]
    conn = s.connection()
    out: dict[str, MetricSeries] = {}
    reduced: list[str] = []
    for key in wanted:
        where = _range(run_id, key, min_step, max_step)
        # a short series is sent whole; LIMIT keeps the probe cheap when the count is stale or partial
        limit = max_points + 1 if min_step is not None or max_step is not None or counts[key] > max_points else None
        rows = conn.execute(select(Metric.step, Metric.value, Metric.timestamp).where(*where)
                            .order_by(Metric.step, Metric.id).limit(limit)).all()
        if len(rows) > max_points:
            rows = _bucketed(conn, where, rows[0].step, max_points)
            reduced.append(key)
        if rows:
            out[key] = MetricSeries(step=[r[0] for r in rows], value=[r[1] for r in rows],
                                    timestamp=[r[2] for r in rows])
    return out, reduced


def _range(run_id: int, key: str, min_step: int | None, max_step: int | None) -> list[ColumnElement[bool]]:
    where = [Metric.run_id == run_id, Metric.key == key]
    if min_step is not None:
        where.append(Metric.step >= min_step)
    if max_step is not None:
        where.append(Metric.step <= max_step)
    return where


def _bucketed(conn: Connection, where: list[ColumnElement[bool]], first_step: int, max_points: int) -> list:
    last_step = conn.scalar(select(func.max(Metric.step)).where(*where))
    width = bucket_width(first_step, last_step, max_points)
    if conn.dialect.name == "postgresql":
        # Right after a bulk write the table's statistics are stale: PostgreSQL then estimates the range
        # at 2 rows and joins the rows with their buckets' extremes in a nested loop (a minute for 100 k
        # rows, 55 s measured). A hash join takes 1-2 s; this read's transaction only.
        conn.exec_driver_sql("SET LOCAL enable_nestloop = off")
    points = select(Metric.id, Metric.value, ((Metric.step - first_step) // width).label("b")).where(*where).subquery()
    extremes = (select(points.c.b, func.min(points.c.value).label("lo"), func.max(points.c.value).label("hi"))
                .group_by(points.c.b).subquery())
    chosen = (select(func.min(points.c.id)).join(extremes, extremes.c.b == points.c.b)
              .where(or_(points.c.value == extremes.c.lo, points.c.value == extremes.c.hi, extremes.c.lo.is_(None)))
              .group_by(points.c.b, points.c.value))
    last = select(Metric.id).where(*where).order_by(Metric.step.desc(), Metric.id.desc()).limit(1).scalar_subquery()
    return conn.execute(select(Metric.step, Metric.value, Metric.timestamp)
                        .where(or_(Metric.id.in_(chosen), Metric.id == last))
                        .order_by(Metric.step, Metric.id)).all()
