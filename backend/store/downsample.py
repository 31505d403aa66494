"""Downsampled metric reads: at most ``max_points`` points per series, computed in the database.

A series (one key, optionally within a step range) with more rows than asked for is cut into at
most ``(max_points - 1) // 2`` buckets of steps (``layout``). From each bucket the read returns the
row holding its minimum and the row holding its maximum finite value (one row when they are the
same, or the bucket's first row when no value in it is finite), and the series' last row is always
kept. So a spike or a dip never disappears, the final value is exact, and no more than
``2 * buckets + 1 <= max_points`` points come back, each of them a stored row (step, value and
timestamp unchanged). Buckets are by step, so a zoomed read (a step range) gets finer buckets over
just that range.

Where the work goes: a range of at least 16 steps per bucket is cut along the buckets of a rollup
level (backend/rollups.py: their extreme rows are kept in the database as rows are written), so the
read merges fewer than four rollup rows per bucket, plus the rows of the two rollup buckets at the
range's ends; a shorter range (under 16 steps per bucket, so at most 16 x max_points rows) is cut
step by step and summarized from its rows. Either way a read touches a few rows per point returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, select
from sqlalchemy.orm import Session

from backend.schemas.runs import MetricSeries
from backend.store import rollups
from backend.store.run_store import run_exists
from backend.store.tables import LatestMetric, Metric

MIN_POINTS = 3  # one bucket's minimum and maximum, and the last point
MAX_POINTS = 100_000  # the most a request may ask for (a downsampled response stays a few MB)


def n_buckets(max_points: int) -> int:
    return (max_points - 1) // 2


@dataclass(frozen=True)
class Cut:
    """How a step range is cut into buckets: ``cells`` cells of ``unit`` steps from cell ``first_cell``
    (``unit`` is a rollup level's width, or 1 step), shared out in order, as evenly as they go, among
    ``buckets`` buckets."""

    unit: int
    first_cell: int
    cells: int
    buckets: int
    level: int | None  # the rollup level whose buckets are the cells; None: cells are single steps

    def bucket(self, step: int) -> int:
        return (step // self.unit - self.first_cell) * self.buckets // self.cells


def layout(first_step: int, last_step: int, max_points: int) -> Cut:
    """The cut of ``[first_step, last_step]`` into at most ``n_buckets(max_points)`` buckets: along the
    buckets of the coarsest rollup level that still has that many in the range (so each rollup bucket
    falls in one bucket), or, for a range under 16 steps per bucket, step by step."""
    nb = n_buckets(max_points)
    span = last_step - first_step + 1
    fitting = [level for level in range(rollups.LEVELS) if rollups.width(level) * nb <= span]
    level = fitting[-1] if fitting else None
    unit = 1 if level is None else rollups.width(level)
    cells = last_step // unit - first_step // unit + 1
    return Cut(unit, first_step // unit, cells, min(nb, cells), level)


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
                            .order_by(Metric.step, Metric.id).limit(limit)).tuples().all()
        if len(rows) > max_points:
            rows = _reduced(conn, where, run_id, key, rows[0][0], max_points)
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


def _rows(conn: Connection, where: list[ColumnElement[bool]], *steps: ColumnElement[bool],
          ) -> Sequence[tuple[int, float | None, float]]:
    return conn.execute(select(Metric.step, Metric.value, Metric.timestamp).where(*where, *steps)).tuples().all()


def _reduced(conn: Connection, where: list[ColumnElement[bool]], run_id: int, key: str, first: int,
             max_points: int) -> list[tuple[int, float | None, float]]:
    """The chosen rows of the range ``where`` (first step ``first``), by step."""
    last_row = conn.execute(select(Metric.step, Metric.value, Metric.timestamp).where(*where)
                            .order_by(Metric.step.desc()).limit(1)).one()
    cut = layout(first, last_row.step, max_points)
    if cut.level is None:  # fewer than 16 steps per bucket: the range's own rows
        buckets = rollups.summarize(_rows(conn, where), cut.bucket)
    else:
        w = cut.unit
        r0, r1 = first // w, last_row.step // w
        # rollup buckets strictly inside the range hold only steps of it; the two at its ends may hold
        # steps outside a zoomed range, so they are summarized from the range's own rows
        parts = rollups.read(conn, run_id, key, cut.level, r0 + 1, r1 - 1)
        for lo, hi in {(first, (r0 + 1) * w - 1), (r1 * w, last_row.step)}:
            edge = _rows(conn, where, Metric.step.between(lo, hi))
            parts.update(rollups.summarize(edge, lambda step: step // w))
        buckets = rollups.regroup(parts, lambda b: cut.bucket(b * w))
    chosen = {row[0]: row for bucket in buckets.values() for row in bucket.rows()}
    chosen[last_row.step] = last_row.tuple()
    return [chosen[step] for step in sorted(chosen)]
