"""Seeds as groups: runs that share an experiment and a ``group`` (a suite row, say) summarised as
mean, sample std, min and max over their runs, as one number per metric or as a curve by step.

Honest aggregation rules (docs/api.md, "Groups"):

- A group is (experiment, group): the paper's reported ``full_adaptive`` and our suite's
  ``full_adaptive`` never mix, because they live in different experiments.
- Non-finite values (stored as null) are left out; ``n`` says how many values went into each number.
- ``std`` is the sample standard deviation (``ddof=1``, numpy's ``np.std(x, ddof=1)``); with one
  value it is null, never 0.
- Curves are aligned by step, as Compare's ``at_step`` reads a run: at every step that any run of
  the group logged, within the span every run covers (from the latest first step to the earliest
  last step), each run contributes its last value at or before that step. Dense series logged at the
  same steps (losses) are thus compared step for step; a series logged only when it changes (the
  coverage metrics, written when the controller changes the plan) holds its value until the next
  change. ``steps_dropped`` counts the steps outside the common span (a run still training shortens
  the curve). A step logged twice counts its last value.
- Curves are bounded like every series read: each run's series is read downsampled by the store
  (backend/downsample.py, at most ``max_points`` points: its bucket minima and maxima and its last
  point) before the runs are aligned, and the aligned curve is reduced by the same rule, ranked by
  its mean. ``nonfinite`` lists each run's NaN and inf points, which the mean leaves out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from aah_core.suite import paired
from backend.schemas.base import Response
from backend.schemas.errors import NotFound
from backend.schemas.runs import DEFAULT_POINTS, NonFinite
from backend.store import metric_store, run_store
from backend.store.downsample import read_downsampled, reduce_points
from backend.store.tables import Experiment, Run, RunTag

MAX_GROUP_RUNS = 1000


class GroupStat(Response):
    n: int = Field(description="finite values aggregated")
    mean: float
    std: float | None = Field(description="sample std (ddof=1); null with one value")
    min: float
    max: float


class GroupSummary(Response):
    experiment: str
    group: str
    run_ids: list[int]
    seeds: list[int | None]
    sources: list[str]
    stats: dict[str, GroupStat | None] = Field(description="per key; null when no run has a finite value")


class PairedDifference(Response):
    group: str
    base: str = Field(description="the group every run of `group` is paired with, seed by seed")
    key: str
    seeds: list[int] = Field(description="the seeds both groups have a finite value of `key` for")
    deltas: list[float] = Field(description="per seed: the group's value minus the base's")
    n: int
    mean: float | None
    std: float | None = Field(description="sample std of the deltas (ddof=1); null under 2 seeds")
    ci95: float | None = Field(description="95% Student t half-interval of the mean; null under 2 seeds")
    resolved: bool = Field(description="the interval excludes 0: a difference is resolved over these seeds")


class GroupCurve(Response):
    step: list[int]
    mean: list[float | None]
    std: list[float | None]
    min: list[float | None]
    max: list[float | None]
    n: list[int]
    run_ids: list[int] = Field(description="the runs of the group that logged this key")
    steps_dropped: int = Field(description="steps read from some of these runs but not all (left out)")
    nonfinite: dict[str, NonFinite] = Field(default_factory=dict, description="per run id (those with any): "
                                            "its non-finite points, which the statistics leave out")


class GroupSeriesResponse(Response):
    experiment: str
    group: str
    run_ids: list[int]
    seeds: list[int | None]
    series: dict[str, GroupCurve]


def describe(values: Sequence[float | str | None]) -> GroupStat | None:
    """Mean, sample std, min and max of the finite values; None when there are none."""
    xs = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not xs:
        return None
    mean = math.fsum(xs) / len(xs)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return GroupStat(n=len(xs), mean=mean, std=std, min=min(xs), max=max(xs))


def align(runs: dict[int, tuple[Sequence[int], Sequence[float | str | None]]],
          max_points: int = DEFAULT_POINTS) -> GroupCurve:
    """One curve from several runs' (steps, values) of one key, aligned by step (see module doc),
    reduced to at most `max_points` steps by the store's rule, ranked by the mean."""
    per_run = [sorted(dict(zip(steps, values)).items()) for steps, values in runs.values() if steps]
    if not per_run:
        return GroupCurve(step=[], mean=[], std=[], min=[], max=[], n=[], run_ids=sorted(runs), steps_dropped=0)
    lo, hi = max(r[0][0] for r in per_run), min(r[-1][0] for r in per_run)
    every = sorted({step for r in per_run for step, _ in r})
    common = [step for step in every if lo <= step <= hi]
    dropped = len(every) - len(common)
    stats = []
    cursors = [0] * len(per_run)
    for step in common:
        values = []
        for i, series in enumerate(per_run):  # each run's last value at or before `step`
            while cursors[i] + 1 < len(series) and series[cursors[i] + 1][0] <= step:
                cursors[i] += 1
            values.append(series[cursors[i]][1])
        stats.append((step, describe(values)))
    stats = reduce_points(stats, max_points, lambda point: None if point[1] is None else point[1].mean)
    curve: dict[str, list] = {"step": [step for step, _ in stats],
                              "n": [0 if stat is None else stat.n for _, stat in stats]}
    for field in ("mean", "std", "min", "max"):
        curve[field] = [None if stat is None else getattr(stat, field) for _, stat in stats]
    return GroupCurve(**curve, run_ids=sorted(runs), steps_dropped=dropped)


def _group_runs(s: Session, *, experiment: str | None = None, group: str | None = None, source: str | None = None,
                tag: str | None = None) -> dict[tuple[str, str], list[tuple[int, int | None, str]]]:
    """(experiment, group) -> [(run id, seed, source)] for runs that have a group, by seed."""
    query = select(Experiment.name, Run.group_name, Run.id, Run.seed, Run.source).join(Experiment).where(
        Run.group_name.is_not(None))
    if experiment is not None:
        query = query.where(Experiment.name == experiment)
    if group is not None:
        query = query.where(Run.group_name == group)
    if source is not None:
        query = query.where(Run.source == source)
    if tag is not None:
        query = query.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
    out: dict[tuple[str, str], list[tuple[int, int | None, str]]] = defaultdict(list)
    for exp, grp, run_id, seed, src in s.execute(query.order_by(Run.id).limit(MAX_GROUP_RUNS)):
        assert grp is not None, "the query keeps runs that have a group"
        out[(exp, grp)].append((run_id, seed, src))
    for runs in out.values():  # by seed (runs without one last), then age
        runs.sort(key=lambda r: (r[1] is None, r[1] or 0, r[0]))
    return out


def group_summaries(s: Session, *, keys: Sequence[str] | None = None, agg: str = "last",
                    experiment: str | None = None, group: str | None = None, source: str | None = None,
                    tag: str | None = None) -> list[GroupSummary]:
    """Every matching group with the stats of each key over its runs (one value per run: its last,
    min or max); keys default to every key the runs' summaries hold."""
    groups = _group_runs(s, experiment=experiment, group=group, source=source, tag=tag)
    run_ids = [r[0] for runs in groups.values() for r in runs]
    if keys is None:
        latest = run_store.latest_values(s, run_ids, run_store.SUMMARY_KEYS)
        keys = sorted({k for values in latest.values() for k in values})
    values = metric_store.aggregate_metrics(s, run_ids, list(keys), agg) if run_ids and keys else {}
    out = []
    for (exp, grp), runs in groups.items():
        ids = [r[0] for r in runs]
        out.append(GroupSummary(
            experiment=exp, group=grp, run_ids=ids, seeds=[r[1] for r in runs], sources=sorted({r[2] for r in runs}),
            stats={k: describe([values[i][k] for i in ids]) for k in keys}))
    return out


def group_series(s: Session, experiment: str, group: str, keys: Sequence[str] | None = None,
                 max_points: int = DEFAULT_POINTS) -> GroupSeriesResponse:
    """The group's curves: per key, mean / std / min / max over its runs at each aligned step."""
    runs = _group_runs(s, experiment=experiment, group=group).get((experiment, group))
    if not runs:
        raise NotFound(f"no runs in group {group!r} of experiment {experiment!r}")
    per_key: dict[str, dict[int, tuple[Sequence[int], Sequence[float | str | None]]]] = defaultdict(dict)
    nonfinite: dict[str, dict[str, NonFinite]] = defaultdict(dict)
    for run_id, _, _ in runs:
        for key, series in read_downsampled(s, run_id, max_points, keys)[0].items():
            per_key[key][run_id] = (series.step, series.value)
            if series.nonfinite.total:
                nonfinite[key][str(run_id)] = series.nonfinite
    curves = {}
    for key, by_run in sorted(per_key.items()):
        curves[key] = align(by_run, max_points)
        curves[key].nonfinite = nonfinite[key]
    return GroupSeriesResponse(experiment=experiment, group=group, run_ids=[r[0] for r in runs],
                               seeds=[r[1] for r in runs], series=curves)


def paired_differences(s: Session, experiment: str, base: str, keys: Sequence[str], agg: str = "last"
                       ) -> list[PairedDifference]:
    """Every other group of `experiment` against `base`, per key: the differences of the runs' values (each
    run's last, min or max) paired by seed (same init and data order), their mean and 95% t interval."""
    groups = _group_runs(s, experiment=experiment)
    if (experiment, base) not in groups:
        raise NotFound(f"no runs in group {base!r} of experiment {experiment!r}")
    run_ids = [r[0] for runs in groups.values() for r in runs]
    values = metric_store.aggregate_metrics(s, run_ids, list(keys), agg)
    ref = {seed: values[run_id] for run_id, seed, _ in groups[(experiment, base)] if seed is not None}
    out = []
    for (_, grp), runs in groups.items():
        if grp == base:
            continue
        for key in keys:
            pairs = [(seed, a - b) for run_id, seed, _ in runs if seed is not None and seed in ref
                     if (a := _number(values[run_id][key])) is not None and (b := _number(ref[seed][key])) is not None]
            deltas = [d for _, d in pairs]
            stat = paired(deltas) if len(deltas) > 1 else None
            out.append(PairedDifference(
                group=grp, base=base, key=key, seeds=[seed for seed, _ in pairs], deltas=deltas, n=len(deltas),
                mean=math.fsum(deltas) / len(deltas) if deltas else None, std=stat and stat["std"],
                ci95=stat and stat["ci95"], resolved=bool(stat and not stat["within_noise"])))
    return out


def _number(value: object) -> float | None:
    """A stored value as a float; None for a missing or non-finite one (stored as its kind)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
