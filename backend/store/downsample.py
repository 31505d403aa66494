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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Row, or_, select
from sqlalchemy.orm import Session

from backend.schemas.runs import MIN_POINTS, MetricSeries, NonFinite
from backend.store import rollups
from backend.store.run_store import IN_BATCH, batched, run_exists
from backend.store.tables import LatestMetric, Metric

Point = tuple[int, float | str | None, float]  # step, value (or its non-finite kind), timestamp


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


def reduce_points(points: Sequence[tuple], max_points: int, value: Callable[[tuple], float | None]) -> list[tuple]:
    """The store's rule on points held in memory (by step; ``value(point)`` the number it ranks by,
    None when not finite): per bucket of ``layout`` the points of the minimum and the maximum (the
    first point when none is finite), and the last point. Group curves are reduced so."""
    if len(points) <= max_points:
        return list(points)
    cut = layout(points[0][0], points[-1][0], max_points)
    buckets = rollups.summarize([(p[0], value(p), i) for i, p in enumerate(points)], cut.bucket)
    chosen = {int(i) for b in buckets.values() for _, _, i in b.rows()} | {len(points) - 1}
    return [points[i] for i in sorted(chosen)]


def read_downsampled(s: Session, run_id: int, max_points: int, keys: Sequence[str] | None = None,
                     min_step: int | None = None, max_step: int | None = None,
                     ) -> tuple[dict[str, MetricSeries], list[str]]:
    """Series per key with at most ``max_points`` points each (and their non-finite points), and the
    keys that were downsampled."""
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}")
    run_exists(s, run_id)
    counts = _row_counts(s, run_id, keys)
    wanted = list(counts) if keys is None else [k for k in dict.fromkeys(keys) if k in counts]
    conn = s.connection()
    out: dict[str, MetricSeries] = {}
    reduced: list[str] = []
    for key in wanted:
        where = _range(run_id, key, min_step, max_step)
        # a short series is sent whole; LIMIT keeps the probe cheap when the count is stale or partial
        limit = max_points + 1 if min_step is not None or max_step is not None or counts[key] > max_points else None
        rows = conn.execute(select(*_POINT).where(*where).order_by(Metric.step).limit(limit)).all()
        if len(rows) > max_points:
            points, nonfinite = _reduced(conn, where, run_id, key, rows[0].step, max_points)
            reduced.append(key)
        else:
            points = [_point(row) for row in rows]
            nonfinite = nonfinite_of(points, max_points)
        if points:
            out[key] = MetricSeries(step=[p[0] for p in points], value=[p[1] for p in points],
                                    timestamp=[p[2] for p in points], nonfinite=nonfinite)
    return out, reduced


def _row_counts(s: Session, run_id: int, keys: Sequence[str] | None) -> dict[str, int]:
    query = select(LatestMetric.key, LatestMetric.n_rows).where(LatestMetric.run_id == run_id)
    if keys is None:
        return dict(s.execute(query.order_by(LatestMetric.key)).tuples().all())
    return {k: n for chunk in batched(list(dict.fromkeys(keys)))
            for k, n in s.execute(query.where(LatestMetric.key.in_(chunk))).tuples()}


# step, value and kind (NULL when finite), timestamp
_POINT = (Metric.step, Metric.value, Metric.special, Metric.timestamp)


def _point(row: Row | tuple) -> Point:
    step, value, special, ts = row
    return step, value if special is None else special, ts


def nonfinite_of(points: Sequence[Point], limit: int) -> NonFinite:
    """The first ``limit`` non-finite points (by the order given) and their total."""
    found = [(p[0], p[1]) for p in points if isinstance(p[1], str)]
    return NonFinite(step=[p[0] for p in found[:limit]], kind=[p[1] for p in found[:limit]], total=len(found))


def _range(run_id: int, key: str, min_step: int | None, max_step: int | None) -> list[ColumnElement[bool]]:
    where = [Metric.run_id == run_id, Metric.key == key]
    if min_step is not None:
        where.append(Metric.step >= min_step)
    if max_step is not None:
        where.append(Metric.step <= max_step)
    return where


def _rows(conn: Connection, where: list[ColumnElement[bool]], *steps: ColumnElement[bool]) -> list[Point]:
    return [_point(row) for row in conn.execute(select(*_POINT).where(*where, *steps))]


def _finite(points: Sequence[Point]) -> list[tuple[int, float | None, float]]:
    """Points as the rollups take them: a non-finite value is None."""
    return [(step, None if isinstance(value, str) else value, ts) for step, value, ts in points]


def _reduced(conn: Connection, where: list[ColumnElement[bool]], run_id: int, key: str, first: int,
             max_points: int) -> tuple[list[Point], NonFinite]:
    """The chosen rows of the range ``where`` (first step ``first``), by step, and its non-finite rows."""
    last_row = _point(conn.execute(select(*_POINT).where(*where).order_by(Metric.step.desc()).limit(1)).one())
    cut = layout(first, last_row[0], max_points)
    if cut.level is None:  # fewer than 16 steps per bucket: the range's own rows
        points = _rows(conn, where)
        nonfinite = nonfinite_of(sorted(points), max_points)
        buckets = rollups.summarize(_finite(points), cut.bucket)
    else:
        w = cut.unit
        r0, r1 = first // w, last_row[0] // w
        # rollup buckets strictly inside the range hold only steps of it; the two at its ends may hold
        # steps outside a zoomed range, so they are summarized from the range's own rows
        parts = rollups.read(conn, run_id, key, cut.level, r0 + 1, r1 - 1)
        for lo, hi in {(first, (r0 + 1) * w - 1), (r1 * w, last_row[0])}:
            edge = _finite(_rows(conn, where, Metric.step.between(lo, hi)))
            parts.update(rollups.summarize(edge, lambda step: step // w))
        flagged = [(max(b * w, first), min((b + 1) * w - 1, last_row[0]))
                   for b, part in sorted(parts.items()) if part.n_nonfinite]
        nonfinite = _search_nonfinite(conn, where, flagged, sum(p.n_nonfinite for p in parts.values()), max_points)
        buckets = rollups.regroup(parts, lambda b: cut.bucket(b * w))
    chosen: dict[int, Point] = {row[0]: row for bucket in buckets.values() for row in bucket.rows()}
    chosen[last_row[0]] = last_row
    _name_kinds(conn, where, chosen)
    return [chosen[step] for step in sorted(chosen)], nonfinite


def _search_nonfinite(conn: Connection, where: list[ColumnElement[bool]], ranges: list[tuple[int, int]],
                      total: int, limit: int) -> NonFinite:
    """The first ``limit`` non-finite rows in the step ``ranges`` (the buckets whose count says they
    hold some), ``total`` of them in all."""
    found: list[tuple[int, str]] = []
    for chunk in batched(ranges, IN_BATCH // 2):
        if len(found) >= limit:
            break
        steps = or_(*(Metric.step.between(lo, hi) for lo, hi in chunk))
        rows = conn.execute(select(Metric.step, Metric.special).where(*where, Metric.special.is_not(None), steps)
                            .order_by(Metric.step).limit(limit - len(found))).tuples()
        found += [(step, str(kind)) for step, kind in rows]
    return NonFinite(step=[f[0] for f in found], kind=[f[1] for f in found], total=total)


def _name_kinds(conn: Connection, where: list[ColumnElement[bool]], chosen: dict[int, Point]) -> None:
    """The kind of each chosen non-finite row (a bucket with no finite value is shown by its first row,
    whose value the rollups do not keep)."""
    unnamed = [step for step, (_, value, _) in chosen.items() if value is None]
    for chunk in batched(unnamed):
        for step, special in conn.execute(select(Metric.step, Metric.special).where(*where, Metric.step.in_(chunk))):
            chosen[step] = (step, special, chosen[step][2])
