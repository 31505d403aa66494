"""Downsampled metric reads: at most ``max_points`` points per series, computed in the database.

A series (one key, optionally within a step range) with more rows than asked for is cut into at
most ``(max_points - 1) // 2`` buckets of steps (``layout``). From each bucket the read returns the
row holding its minimum and the row holding its maximum finite value (one row when they are the
same, or the bucket's first row when no value in it is finite), and the series' last row is always
kept. So a spike or a dip never disappears, the final value is exact, and no more than
``2 * buckets + 1 <= max_points`` points come back, each of them a stored row (step, value and
timestamp unchanged). Buckets are by step, so a zoomed read (a step range) gets finer buckets over
just that range.

Where the work goes: no read handles more than about 4 stored rows per point it returns, at any zoom of
any run. A range of at least 8 steps per bucket is cut along the buckets of a rollup level
(backend/rollups.py keeps their extreme rows as rows are written): the coarsest with at least one cell
per bucket (so fewer than two cells a bucket, levels being two times apart), else level 0 (16 steps) with
fewer, whole buckets. Its cells inside the range are that level's rollup rows; the parts of the two cells
the range's ends cut are whole rollup buckets of finer levels (at most one a level) and fewer than 16 rows
at each end. A shorter range (under 8 steps per bucket) is summarized from its own rows. One statement
of index searches (``_cells``) returns each cell with its bucket, and one loop (``merge_cells``) keeps
each bucket's extremes. (Window functions that rank the cells in SQL cost more than that loop on both
databases; what costs is building Python objects per row, so the cells come back as the driver's
tuples.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, Row, TextClause, bindparam, or_, select, text
from sqlalchemy.orm import Session

from backend.schemas.runs import MIN_POINTS, MetricSeries, NonFinite
from backend.store import rollups
from backend.store.db import driver_rows
from backend.store.run_store import IN_BATCH, batched, run_exists
from backend.store.tables import LatestMetric, Metric

# Python's sqlite3 lets go of the GIL for every row it steps. Two threads fetching a zoom's ~2,000 cells
# at once handed the GIL back and forth row by row: under 50 clients 13-375 context switches and 4-10 ms of
# CPU a zoom; fetching one at a time, 4-9 switches and 3.5-4 ms (README.md, "Zooms, third round").
# psycopg fetches a result whole, so PostgreSQL reads do not take it.
_FETCH_LOCK = threading.Lock()

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

    def steps(self, bucket: int) -> tuple[int, int]:
        """The first and last step of ``bucket``'s cells (the inverse of ``bucket``)."""
        first = -(-bucket * self.cells // self.buckets)
        last = -(-(bucket + 1) * self.cells // self.buckets) - 1
        return (self.first_cell + first) * self.unit, (self.first_cell + last + 1) * self.unit - 1


def layout(first_step: int, last_step: int, max_points: int) -> Cut:
    """The cut of ``[first_step, last_step]`` into at most ``n_buckets(max_points)`` buckets: along the
    buckets of the coarsest rollup level that still has that many in the range (so each rollup bucket
    falls in one bucket); a range with fewer than 16 steps per bucket but at least 8 along level 0's
    16-step buckets, one per bucket (fewer buckets, so that no read handles more than about 4 rows per
    point it returns); a shorter range step by step."""
    nb = n_buckets(max_points)
    span = last_step - first_step + 1
    fitting = [level for level in range(rollups.LEVELS) if rollups.width(level) * nb <= span]
    level = fitting[-1] if fitting else 0 if 2 * span >= rollups.width(0) * nb else None
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
        rows = None
        if min_step is None and max_step is None and counts[key] <= max_points:  # a short series, whole
            rows = conn.execute(select(*_POINT).where(*_range(run_id, key, min_step, max_step))
                                .order_by(Metric.step).limit(max_points + 1)).all()
        if rows is None or len(rows) > max_points:  # (LIMIT: on PostgreSQL the count read above may be stale)
            points, nonfinite, was_reduced = _read_range(conn, run_id, key, min_step, max_step, max_points)
            if was_reduced:
                reduced.append(key)
        else:
            points = [_point(row) for row in rows]
            nonfinite = nonfinite_of(points, max_points)
        if points:
            out[key] = series_of(points, nonfinite)
    return out, reduced


def series_of(points: Sequence[Point], nonfinite: NonFinite) -> MetricSeries:
    """A series from stored points, not validated again: the store's columns are its schema's types
    (integer steps, float values and timestamps, a non-finite value as its kind), and validating
    thousands of numbers cost more than the read (tests/backend/test_downsample.py checks the two agree)."""
    step, value, timestamp = map(list, zip(*points)) if points else ([], [], [])
    return MetricSeries.model_construct(step=step, value=value, timestamp=timestamp, nonfinite=nonfinite)


_ROW_COUNTS = text("SELECT key, n_rows FROM latest_metrics WHERE run_id = :run AND key IN :keys").bindparams(
    bindparam("keys", expanding=True))
_ROW_COUNT = text("SELECT key, n_rows FROM latest_metrics WHERE run_id = :run AND key = :key")  # (a zoom's one key)


def _row_counts(s: Session, run_id: int, keys: Sequence[str] | None) -> dict[str, int]:
    if keys is None:
        query = select(LatestMetric.key, LatestMetric.n_rows).where(LatestMetric.run_id == run_id)
        return dict(s.execute(query.order_by(LatestMetric.key)).all())
    unique = list(dict.fromkeys(keys))
    if len(unique) == 1:  # (an expanding IN is compiled again for every read)
        return dict(driver_rows(s.connection(), _ROW_COUNT, {"run": run_id, "key": unique[0]}))
    return {k: n for chunk in batched(unique) for k, n in s.execute(_ROW_COUNTS, {"run": run_id, "keys": chunk})}


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


# The range's ends, and the probe for a row past max_points (the index alone): statements a reduced read runs,
# as text (SQLAlchemy's building and cache-key walk of a select cost more than running it)
_IN_RANGE = "FROM metrics WHERE run_id = :run AND key = :key AND step BETWEEN :lo AND :hi ORDER BY step"
# in one statement: the last row and the first step; no row when the range is empty
_ENDS = text(f"SELECT l.step, l.value, l.special, l.timestamp, (SELECT step {_IN_RANGE} LIMIT 1) "
             f"FROM (SELECT step, value, special, timestamp {_IN_RANGE} DESC LIMIT 1) AS l")
# the step max_points rows after the range's first (none when the range holds no more rows than that)
_PAST = text(f"SELECT step {_IN_RANGE} LIMIT 1 OFFSET :n")
_ALL_STEPS = (-2**63, 2**63 - 1)


def _holds_more(conn: Connection, cells: Sequence[tuple], params: Mapping[str, Any], max_points: int) -> bool:
    """Whether the range holds more than max_points rows. Its cells say so without a read when they hold more
    between them (at least one row a cell, two where its minimum and maximum are different rows: a dense
    series' zoom, whose ~1,000-2,000 cells hold 3,000 and more); else the probe for the row max_points on
    (which walks max_points index entries: most of a zoom's time on PostgreSQL, 0.6-0.9 of 1.5 ms)."""
    if len(cells) > max_points or len(cells) + sum(1 for c in cells if c[4] is not None and c[4] != c[1]) > max_points:
        return True
    return bool(_read_past(conn, {**params, "n": max_points}))


def _read_past(conn: Connection, params: Mapping[str, Any]) -> Sequence[Any]:
    """``_PAST``'s row, read in index order on PostgreSQL too. PostgreSQL plans by statistics that lag a series
    being written (a live run, or one logged since autovacuum's last ANALYZE): estimating a few hundred rows in a
    range of 20 000, it found the row max_points on by sorting the whole range (a zoom read every row of it). A
    sort's plan is left to the planner only when no ordered one exists."""
    if conn.dialect.name != "postgresql":
        return driver_rows(conn, _PAST, params)
    conn.exec_driver_sql("SET LOCAL enable_sort = off")  # (undone by the next statement, or by a rollback)
    found = driver_rows(conn, _PAST, params)
    conn.exec_driver_sql("SET LOCAL enable_sort TO DEFAULT")
    return found


Piece = tuple[int | None, int, int]  # (None, first step, last step) or (level, first bucket, last bucket)


def cover(first: int, last: int, top: int | None) -> list[Piece]:
    """``[first, last]`` as the fewest whole rollup buckets of levels ``<= top`` and single steps, in
    step order: (None, first, last) step ranges (fewer than 16 steps at each end) and (level, first
    bucket, last bucket) ranges (fewer than FACTOR buckets of each level under ``top`` at each end, and
    the ``top`` buckets between). ``top`` None: the steps themselves."""
    if top is None:
        return [(None, first, last)]
    left_pieces: list[Piece] = []
    right_pieces: list[Piece] = []
    lo, hi = first, last + 1  # [lo, hi) still to cover; after level l, both are multiples of its parent's width
    for level in range(-1, top):  # -1: single steps
        parent = rollups.width(level + 1)
        left = min(-(-lo // parent) * parent, hi)
        right = max(hi // parent * parent, left)
        for a, b, pieces in ((lo, left, left_pieces), (right, hi, right_pieces)):
            if a < b:
                if level < 0:
                    pieces.append((None, a, b - 1))
                else:
                    pieces.append((level, a // rollups.width(level), b // rollups.width(level) - 1))
        lo, hi = left, right
    if lo < hi:
        left_pieces.append((top, lo // rollups.width(top), hi // rollups.width(top) - 1))
    return left_pieces + right_pieces[::-1]


def _read_range(conn: Connection, run_id: int, key: str, min_step: int | None, max_step: int | None,
                max_points: int) -> tuple[list[Point], NonFinite, bool]:
    """The rows of ``key`` in ``min_step..max_step`` by step, whole when they are at most ``max_points``,
    else reduced (then True); and its non-finite rows."""
    bounds = {"run": run_id, "key": key, "lo": _ALL_STEPS[0] if min_step is None else min_step,
              "hi": _ALL_STEPS[1] if max_step is None else max_step}
    found = driver_rows(conn, _ENDS, bounds)
    if not found:
        return [], NonFinite(step=[], kind=[], total=0), False
    ends = found[0]
    last_row, first = _point(ends[:4]), ends[4]
    cut = layout(first, last_row[0], max_points)

    def where() -> list[ColumnElement[bool]]:  # built only for the rarer reads below (rows by step, non-finite rows)
        return _range(run_id, key, min_step, max_step)

    pieces = cover(first, last_row[0], cut.level)
    params: dict[str, object] = {"run": run_id, "key": key, "unit": cut.unit, "c0": cut.first_cell,
                                 "buckets": cut.buckets, "cells": cut.cells}
    for i, (level, a, b) in enumerate(pieces):
        params.update({f"l{i}": level, f"a{i}": a, f"b{i}": b})
    with _FETCH_LOCK if conn.dialect.name == "sqlite" else contextlib.nullcontext():
        # plain tuples from the driver: SQLAlchemy's rows cost more than the merge
        cells = driver_rows(conn, _cells(tuple(level is not None for level, _, _ in pieces)), params, binary=True)
    if cut.level is None and len(cells) <= max_points:  # the range's own rows (cut step by step), all of them
        points = sorted((cell[1], cell[2], cell[3]) for cell in cells)
        if any(value is None for _, value, _ in points):
            _name_kinds(conn, where(), points)
        return points, nonfinite_of(points, max_points), False
    if cut.level is not None and not _holds_more(conn, cells, bounds, max_points):  # few rows, many steps
        # (LIMIT: rows written since the probe, on PostgreSQL, come with the next read)
        points = [_point(row) for row in conn.execute(select(*_POINT).where(*where()).order_by(Metric.step)
                                                      .limit(max_points))]
        return points, nonfinite_of(points, max_points), False
    points, flagged = merge_cells(cells, last_row)
    if not flagged:
        return points, NonFinite(step=[], kind=[], total=0), True
    ranges = [(max(a, first), min(b, last_row[0])) for a, b in map(cut.steps, sorted(flagged))]
    nonfinite = _search_nonfinite(conn, where(), ranges, sum(flagged.values()), max_points)
    # (a point without a value is a bucket's first row, in a bucket with no finite value)
    _name_kinds(conn, where(), points)
    return points, nonfinite, True


# A cell's bucket and its non-finite rows in one integer (bucket + rows * NONFINITE): Python's sqlite3 lets go
# of the interpreter lock for every value it fetches, and that was a third of a zoom's instructions
# (README.md, "Zooms, fourth round"). Buckets are fewer (MAX_POINTS), a cell's rows are fewer than 2**31.
NONFINITE = 2**32


def merge_cells(cells: Sequence[tuple], last: Point) -> tuple[list[Point], dict[int, int]]:
    """The points a reduced read returns, by step, from the cells of its buckets (bucket + non-finite
    rows * NONFINITE, *minimum, *maximum; each extreme as step, value, timestamp, the minimum's being the
    cell's first row when it has no finite value), and the non-finite rows per bucket (those that have some).

    Per bucket (buckets are runs of steps): its minimum and its maximum, by step, one point when they
    are the same row, or when no cell has a finite value its first row (value None); then the range's
    ``last`` row. Ties: the smaller step, as in backend/rollups.py. The cells come in bucket order
    (``_cells`` reads the pieces of ``cover`` in step order) and are sorted only if they do not."""
    try:
        return _merge_in_order(cells, last)
    except _NotInOrder:
        return _merge_in_order(sorted(cells, key=lambda cell: cell[0] % NONFINITE), last)


class _NotInOrder(Exception):
    pass


# a cell past every bucket, read last: the loop adds the last bucket's extremes when it reaches it
_END = (NONFINITE - 1, 0, None, 0.0, 0, None, 0.0)


def _merge_in_order(cells: Sequence[tuple], last: Point) -> tuple[list[Point], dict[int, int]]:
    # one loop, the current bucket's extremes in locals, no call per cell: it runs over thousands a read
    points: list[Point] = []
    add = points.append
    nonfinite: dict[int, int] = {}
    current = None
    lo_step = lo_value = lo_ts = hi_step = hi_value = hi_ts = cast(Any, None)  # (set by the first cell)
    for bucket, cell_lo_step, cell_lo_value, cell_lo_ts, cell_hi_step, cell_hi_value, cell_hi_ts in chain(
            cells, (_END,)):
        if bucket >= NONFINITE:  # (rare) a cell with non-finite rows
            bucket, n = bucket % NONFINITE, bucket // NONFINITE
            nonfinite[bucket] = nonfinite.get(bucket, 0) + n
        if bucket != current:
            if current is not None:
                if bucket < current:
                    raise _NotInOrder
                # the bucket's minimum and maximum by step (one point when they are the same row or it has
                # no finite value)
                if hi_value is None or hi_step == lo_step:
                    add((lo_step, lo_value, lo_ts))
                elif hi_step < lo_step:
                    add((hi_step, hi_value, hi_ts))
                    add((lo_step, lo_value, lo_ts))
                else:
                    add((lo_step, lo_value, lo_ts))
                    add((hi_step, hi_value, hi_ts))
            current = bucket
            lo_step, lo_value, lo_ts = cell_lo_step, cell_lo_value, cell_lo_ts
            hi_step, hi_value, hi_ts = cell_hi_step, cell_hi_value, cell_hi_ts
        else:
            if cell_lo_value is None:  # no finite value in the cell: its first row, if the bucket has none
                if lo_value is None and cell_lo_step < lo_step:
                    lo_step, lo_ts = cell_lo_step, cell_lo_ts
            elif lo_value is None or cell_lo_value < lo_value or cell_lo_value == lo_value and cell_lo_step < lo_step:
                lo_step, lo_value, lo_ts = cell_lo_step, cell_lo_value, cell_lo_ts
            if cell_hi_value is not None and (hi_value is None or cell_hi_value > hi_value or
                                              cell_hi_value == hi_value and cell_hi_step < hi_step):
                hi_step, hi_value, hi_ts = cell_hi_step, cell_hi_value, cell_hi_ts
    if points and points[-1][0] == last[0]:
        points[-1] = last
    else:
        points.append(last)
    return points, nonfinite


_SHIFT = (rollups.BASE_WIDTH.bit_length() - 1, rollups.FACTOR.bit_length() - 1)  # width(l) = 1 << (a + b * l)
assert all(rollups.width(level) == 1 << (_SHIFT[0] + _SHIFT[1] * level) for level in range(rollups.LEVELS))


@lru_cache(maxsize=256)
def _cells(shape: tuple[bool, ...]) -> TextClause:
    """The cells of a range for ``merge_cells``, piece by piece of ``cover`` (``shape``: True for a
    rollup piece, False for a step range), in that order: the metric rows of steps :a{i}..:b{i}, or the
    rollup rows of level :l{i}, buckets :a{i}..:b{i}; each in bucket ``(cell - :c0) * :buckets / :cells``
    (integer division on both databases) of its cell, its first step ``/ :unit``, plus its non-finite rows
    times NONFINITE. Each piece is one index search."""
    # the bound integers cast: a driver may send them as numeric, whose division is not the integer one
    unit = "CAST(:unit AS BIGINT)"
    in_bucket = "- CAST(:c0 AS BIGINT)) * CAST(:buckets AS BIGINT) / CAST(:cells AS BIGINT)"
    first_if_none = ("CASE WHEN lo_value IS NULL THEN first_step ELSE lo_step END, lo_value, "
                     "CASE WHEN lo_value IS NULL THEN first_ts ELSE lo_ts END")
    # one SELECT a piece: an OR of ranges is one index search on neither database (SQLite reads the whole
    # series of the rollups, PostgreSQL may scan the table)
    sources = [f"SELECT ((bucket << ({_SHIFT[0]} + {_SHIFT[1]} * level)) / {unit} {in_bucket} + n_nonfinite * "
               f"{NONFINITE}, {first_if_none}, hi_step, hi_value, hi_ts FROM metric_rollups WHERE run_id = :run AND key = :key "
               f"AND level = :l{i} AND bucket BETWEEN :a{i} AND :b{i}" if rollup else
               f"SELECT (step / {unit} {in_bucket} + CASE WHEN value IS NULL THEN {NONFINITE} ELSE 0 END, "  # NULL: not finite
               f"step, value, timestamp, step, value, timestamp FROM metrics WHERE run_id = :run AND key = :key "
               f"AND step BETWEEN :a{i} AND :b{i}" for i, rollup in enumerate(shape)]
    return text(" UNION ALL ".join(sources))


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


def _name_kinds(conn: Connection, where: list[ColumnElement[bool]], points: list[Point]) -> None:
    """The kind of each non-finite point read from the rollups, in place (a bucket with no finite value
    is shown by its first row, whose value the rollups do not keep)."""
    unnamed = {step: i for i, (step, value, _) in enumerate(points) if value is None}
    for chunk in batched(list(unnamed)):
        for step, special in conn.execute(select(Metric.step, Metric.special).where(*where, Metric.step.in_(chunk))):
            points[unnamed[step]] = (step, special, points[unnamed[step]][2])
