"""Each metric series' minimum and maximum per step bucket, kept as rows are written, so that a
downsampled read of a long range touches about as many rows as it returns (backend/downsample.py).

Level ``l`` cuts the steps into buckets of ``width(l) = 16 * 2**l`` steps (16, 32, 64, ... up to
about 67 M): bucket ``b`` holds steps ``[b * w, (b + 1) * w)``. A rollup row keeps a bucket's first
row and the rows of its minimum and of its maximum finite value (step, value and timestamp, so a
read needs no other row; NULL when no value in it is finite; on a tie, the smaller step), and how many
of its rows are not finite (NaN, +-inf), so that a read finds a divergence in a range of finite
buckets without scanning their rows. A bucket of level ``l + 1`` is the merge of two of level ``l``,
so levels are built from the one below. (Levels were four times apart until migration 0014: a zoom's buckets
then held 1-4 cells of the level it reads, 2.2-2.4 on average, and the cells were most of its work; two
times apart, 1-2. That costs a write about 1.5 times the rollup rows: README.md, "Zooms".)

The rows are kept in the transaction that writes the metric rows (metric_store.log_metrics): when every
row of a batch was new, the batch's own summaries are merged into the stored ones by one upsert;
when some steps were stored already (a retried batch: the first value stays), the buckets the batch
touches are recomputed from the stored rows instead, so a rollup never holds a value the store
does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

from sqlalchemy import Connection, delete, insert, select

from backend.store.tables import Metric, MetricRollup

logger = logging.getLogger(__name__)

BASE_WIDTH = 16
FACTOR = 2
LEVELS = 23  # the coarsest, 16 * 2**22 steps: about 67 M


def width(level: int) -> int:
    return BASE_WIDTH * FACTOR ** level


BASE_COLUMNS = ("first_step", "first_ts", "lo_step", "lo_value", "lo_ts", "hi_step", "hi_value", "hi_ts")
COLUMNS = (*BASE_COLUMNS, "n_nonfinite")  # the count came with migration 0011; 0008 builds the others


@dataclass(slots=True)
class Summary:
    """One bucket: (step, timestamp) of its first row and (step, value, timestamp) of its rows holding
    the finite minimum and maximum (None when no value in it is finite), and its non-finite rows."""

    first_step: int
    first_ts: float
    lo_step: int | None = None
    lo_value: float | None = None
    lo_ts: float | None = None
    hi_step: int | None = None
    hi_value: float | None = None
    hi_ts: float | None = None
    n_nonfinite: int = 0

    def merge(self, other: Summary) -> None:
        self.n_nonfinite += other.n_nonfinite
        if other.first_step < self.first_step:
            self.first_step, self.first_ts = other.first_step, other.first_ts
        mine, theirs = self.lo, other.lo
        if theirs is not None and (mine is None or (theirs[1], theirs[0]) < (mine[1], mine[0])):
            self.lo_step, self.lo_value, self.lo_ts = theirs
        mine, theirs = self.hi, other.hi
        if theirs is not None and (mine is None or (theirs[1], -theirs[0]) > (mine[1], -mine[0])):
            self.hi_step, self.hi_value, self.hi_ts = theirs

    @property
    def lo(self) -> tuple[int, float, float] | None:
        """(step, value, timestamp) of the minimum; None when no value is finite."""
        return _point(self.lo_step, self.lo_value, self.lo_ts)

    @property
    def hi(self) -> tuple[int, float, float] | None:
        """(step, value, timestamp) of the maximum; None when no value is finite."""
        return _point(self.hi_step, self.hi_value, self.hi_ts)

    def rows(self) -> list[tuple[int, float | None, float]]:
        """The (step, value, timestamp) rows a downsampled read keeps: minimum and maximum, else the first."""
        lo, hi = self.lo, self.hi
        if lo is None or hi is None:
            return [(self.first_step, None, self.first_ts)]
        return [lo, hi]


def _point(step: int | None, value: float | None, ts: float | None) -> tuple[int, float, float] | None:
    if value is None:
        return None
    assert step is not None and ts is not None, "a bucket's step, value and timestamp are set together"
    return step, value, ts


def summarize(points: Iterable[tuple[int, float | None, float]], bucket: Callable[[int], int],
              ) -> dict[int, Summary]:
    """Bucket -> summary of (step, value, timestamp) points (value None when it is not finite), one
    point per step; ``bucket(step)`` must not decrease with the step. min() and max() keep the first of
    equal values: in step order, the smaller step."""
    out: dict[int, Summary] = {}
    for b, grouped in groupby(sorted(points, key=itemgetter(0)), key=lambda p: bucket(p[0])):
        group = list(grouped)
        finite = [p for p in group if p[1] is not None]
        if finite:
            lo, hi = min(finite, key=itemgetter(1)), max(finite, key=itemgetter(1))
            out[b] = Summary(group[0][0], group[0][2], *lo, *hi, n_nonfinite=len(group) - len(finite))
        else:
            out[b] = Summary(group[0][0], group[0][2], n_nonfinite=len(group))
    return out


def regroup(buckets: dict[int, Summary], group: Callable[[int], int]) -> dict[int, Summary]:
    """Merge buckets into larger ones: ``group(b)`` is the one bucket ``b`` falls in. Consumes
    ``buckets``: the first of each group becomes the merged one (copying cost more than the merge)."""
    out: dict[int, Summary] = {}
    for b, summary in buckets.items():
        parent = out.get(group(b))
        if parent is None:
            out[group(b)] = summary
        else:
            parent.merge(summary)
    return out


def _level0(step: int) -> int:
    return step // BASE_WIDTH


def _parent(bucket: int) -> int:
    return bucket // FACTOR


def _levels(level0: dict[int, Summary], levels: int, factor: int = FACTOR) -> Iterator[tuple[int, dict[int, Summary]]]:
    """(level, buckets) for levels 0 .. levels - 1 from level 0's buckets. Each level is merged from the one
    before, whose summaries it takes over (regroup): read a level before asking for the next."""
    buckets = level0
    for level in range(levels):
        if level:
            buckets = regroup(buckets, lambda b: b // factor)
        yield level, buckets


def add(conn: Connection, run_id: int, points: dict[str, list[tuple[int, float | None, float]]]) -> None:
    """Merge newly stored points (per key) into their buckets at every level: one statement."""
    rows: list[tuple[object, ...]] = []  # (key, level, bucket, *COLUMNS)
    for key, key_points in points.items():
        for level, buckets in _levels(summarize(key_points, _level0), LEVELS):
            rows.extend((key, level, b, *(getattr(s, c) for c in COLUMNS)) for b, s in buckets.items())
    if not rows:
        return
    # Raw SQL, as metric_store.log_metrics: SQLAlchemy's per-row parameter handling (and psycopg's statement
    # per row of an executemany) cost more than the upsert itself
    insert = f"INSERT INTO metric_rollups (run_id, key, level, bucket, {', '.join(COLUMNS)}) "
    if conn.dialect.name == "postgresql":  # the run id and twelve arrays, sent in binary
        types = ("text", "int", "bigint", "bigint", "float8", "bigint", "float8", "float8", "bigint", "float8",
                 "float8", "bigint")
        arrays = ", ".join(f"%b::{t}[]" for t in types)
        conn.exec_driver_sql(f"{insert} SELECT %b::bigint, * FROM unnest({arrays}) {_MERGE}",
                             (run_id, *map(list, zip(*rows))))
    else:
        conn.exec_driver_sql(f"{insert} VALUES ({', '.join(['?'] * (len(COLUMNS) + 4))}) {_MERGE}",
                             [(run_id, *row) for row in rows])


def rebuild(conn: Connection, run_id: int, key: str, lo: int, hi: int, columns: tuple[str, ...] = COLUMNS) -> None:
    """Recompute, from the stored rows, every bucket (each level) holding a step in ``[lo, hi]``
    (``columns``: the rollup columns the store's revision has; migration 0008 predates the count)."""
    start, end = lo // BASE_WIDTH * BASE_WIDTH, (hi // BASE_WIDTH + 1) * BASE_WIDTH - 1
    buckets = summarize(conn.execute(select(Metric.step, Metric.value, Metric.timestamp).where(
        Metric.run_id == run_id, Metric.key == key, Metric.step.between(start, end))).tuples(), _level0)
    for level in range(LEVELS):
        w = width(level)
        if level:
            children = read(conn, run_id, key, level - 1, lo // w * FACTOR, hi // w * FACTOR + FACTOR - 1,
                            columns)
            buckets = regroup(children, _parent)
        rollup = MetricRollup.__table__.c
        conn.execute(delete(MetricRollup).where(rollup.run_id == run_id, rollup.key == key,
                                                rollup.level == level,
                                                rollup.bucket.between(lo // w, hi // w)))
        if buckets:
            conn.execute(insert(MetricRollup), [_row(run_id, key, level, b, s, columns) for b, s in buckets.items()])



def rebuild_levels(conn: Connection, factor: int = FACTOR, levels: int = LEVELS, chunk: int = 20_000) -> None:
    """Every level above 0 of every series, recomputed from the level below with ``factor`` of its buckets
    to a bucket (level 0, 16 steps, is the same at any factor; migration 0014 changed it from 4 to 2). A series
    whose level 0 fits in ``chunk`` rows gets every level in memory and one insert (most series are short);
    a longer one is read level by level in bucket order, ``chunk`` rows at a time, so memory does not grow
    with a series."""
    r = MetricRollup.__table__.c
    series = conn.execute(select(r.run_id, r.key).where(r.level == 0).distinct()).all()
    conn.execute(delete(MetricRollup).where(r.level > 0))
    logger.info("rebuilding the metric rollups of %d series, levels %d times apart (on a 2 vCPU box about 10 s "
                "for 8 M stored metric points)", len(series), factor)

    def rows_after(run_id: int, key: str, level: int, after: int | None) -> list:
        query = select(r.bucket, *(r[c] for c in COLUMNS)).where(r.run_id == run_id, r.key == key, r.level == level)
        if after is not None:
            query = query.where(r.bucket > after)
        return list(conn.execute(query.order_by(r.bucket).limit(chunk)))

    for run_id, key in series:
        level0 = rows_after(run_id, key, 0, None)
        if len(level0) < chunk:
            conn.execute(insert(MetricRollup), [
                _row(run_id, key, level, b, s, COLUMNS)
                for level, buckets in _levels({b: Summary(*rest) for b, *rest in level0}, levels, factor) if level
                for b, s in buckets.items()])
            continue
        for level in range(1, levels):
            after = None
            while True:
                rows = rows_after(run_id, key, level - 1, after)
                whole = len(rows) < chunk
                if not whole:  # the last parent may go on past this chunk: left to the next (chunk > factor)
                    last = rows[-1][0] // factor
                    while rows[-1][0] // factor == last:
                        rows.pop()
                if rows:
                    after = rows[-1][0]
                    merged = regroup({b: Summary(*rest) for b, *rest in rows}, lambda b: b // factor)
                    conn.execute(insert(MetricRollup), [_row(run_id, key, level, b, s, COLUMNS)
                                                        for b, s in merged.items()])
                if whole:
                    break

def read(conn: Connection, run_id: int, key: str, level: int, first_bucket: int, last_bucket: int,
         columns: tuple[str, ...] = COLUMNS) -> dict[int, Summary]:
    """The stored buckets ``first_bucket..last_bucket`` of one series at one level."""
    r = MetricRollup.__table__.c
    rows = conn.execute(select(r.bucket, *(r[c] for c in columns)).where(
        r.run_id == run_id, r.key == key, r.level == level,
        r.bucket.between(first_bucket, last_bucket))).all()
    return {b: Summary(*rest) for b, *rest in rows}


def _row(run_id: int, key: str, level: int, bucket: int, s: Summary, columns: tuple[str, ...]) -> dict:
    return {"run_id": run_id, "key": key, "level": level, "bucket": bucket,
            **{c: getattr(s, c) for c in columns}}


def _case(condition: str, columns: tuple[str, ...]) -> list[str]:
    return [f"{c} = CASE WHEN {condition} THEN excluded.{c} ELSE metric_rollups.{c} END" for c in columns]


# Merge a bucket into the stored one (SQL evaluates every SET on the old row): the earlier first row,
# the lower minimum and the higher maximum (on a tie, the smaller step; NULL = none finite yet), and the
# sum of the non-finite counts (add() merges only rows that were all new).
_MERGE = "ON CONFLICT (run_id, key, level, bucket) DO UPDATE SET " + ", ".join([
    "n_nonfinite = metric_rollups.n_nonfinite + excluded.n_nonfinite",
    *_case("excluded.first_step < metric_rollups.first_step", ("first_step", "first_ts")),
    *_case("metric_rollups.lo_value IS NULL OR excluded.lo_value < metric_rollups.lo_value OR "
           "(excluded.lo_value = metric_rollups.lo_value AND excluded.lo_step < metric_rollups.lo_step)",
           ("lo_step", "lo_value", "lo_ts")),
    *_case("metric_rollups.hi_value IS NULL OR excluded.hi_value > metric_rollups.hi_value OR "
           "(excluded.hi_value = metric_rollups.hi_value AND excluded.hi_step < metric_rollups.hi_step)",
           ("hi_step", "hi_value", "hi_ts"))])
