"""First-start content: the project's own reproductions of the paper (the shipped suite files, data/suite/,
written by ``aah suite paper ... --pack``: Table 1's rows at the mini scale, the baselines and passkey retrieval
at the long scale) as FINISHED runs with ``source: suite``.

One experiment per suite scale and corpus (``paper suite · mini scale`` for the code corpus, ``paper suite ·
mini scale · english`` for the English one), one group per suite row (the preset names, as the paper's
reference runs use them), one run per seed, each with its full config as params (and ``suite.corpus``,
``suite.lr_scale``), its metric history and its window plans over training. The learning-rate sweep's runs
(lr scale other than 1) go to ``paper suite · mini scale · lr sensitivity``, group ``<row> · lr×<scale>``.
Idempotent: the runs carry the file's content hash (param ``suite.pack``) and are replaced only when the
shipped file changes.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from aah_core.config import RunConfig
from aah_core.errors import AAHError
from aah_core.paper import PAPER_ROWS
from aah_core.suite import MATCHED_ROWS
from aah_core.suite_pack import PackedRun, read_pack
from aah_core.windows import plan_to_json, validate_plan
from backend.seed.demo import metric_rows
from backend.settings import Settings
from backend.store import metric_store, run_store
from backend.store.tables import Experiment, Param, Run

logger = logging.getLogger(__name__)
PACK_PARAM = "suite.pack"
ROWS = (*PAPER_ROWS, *MATCHED_ROWS)


LR_EXPERIMENT = "lr sensitivity"


def experiment_name(header: dict, corpus: str = "code", lr_scale: float = 1.0) -> str:
    """The experiment of a packed run: the code corpus at x1 keeps the name it had before the study."""
    base = f"paper suite · {header.get('scale', '?')} scale"
    if lr_scale != 1:
        return f"{base} · {LR_EXPERIMENT}"
    return base if corpus == "code" else f"{base} · {corpus}"


def group_name(run: PackedRun) -> str:
    group = run.row if run.impl == "faithful" or run.row == "baseline" else f"{run.row}-{run.impl}"
    return group if run.lr_scale == 1 else f"{group} · lr×{run.lr_scale:g}"


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def seed_suite(s: Session, settings: Settings) -> int:
    """Import each of the settings' suite files once (again when a file changes); how many were imported now.
    A missing or bad file is logged and skipped: it never stops the others, nor the server's start."""
    return sum(seed_pack(s, path) for path in settings.suite_files)


def seed_pack(s: Session, path: Path) -> bool:
    """Import one packed suite, all of it or nothing; False if up to date, absent or refused."""
    if not path.is_file():
        logger.info("no shipped suite at %s; skipping", path)
        return False
    fp = file_hash(path)
    try:
        header, lines = read_pack(path)
        runs = list(lines)
    except AAHError as exc:
        logger.error("shipped suite not imported: %s", exc)
        return False
    experiments = {experiment_name(header), *(experiment_name(header, r.corpus, r.lr_scale) for r in runs)}
    existing = list(s.execute(
        select(Run.id, Param.value).join(Experiment)
        .outerjoin(Param, (Param.run_id == Run.id) & (Param.key == PACK_PARAM))
        .where(Experiment.name.in_(experiments), Run.source == "suite")))
    if existing and all(value == fp for _, value in existing):
        return False
    try:
        with s.begin_nested():  # all of it or nothing: a bad file never leaves half an experiment
            if existing:
                run_store.delete_runs(s, [run_id for run_id, _ in existing])
            # the last imported is listed first (GET /runs is newest first): import in reverse row order,
            # so the Runs page reads baseline seed 0, seed 1, ..., then the next row; the code corpus first,
            # the learning-rate sweep (one seed per group) last
            ordered = sorted(runs, key=lambda r: (r.lr_scale != 1, r.corpus != "code", r.corpus, r.lr_scale,
                                                  ROWS.index(r.row) if r.row in ROWS else len(ROWS), r.row, r.seed))
            n = sum(1 for run in reversed(ordered) if _import_run(s, run, header, fp))
    except AAHError as exc:
        logger.error("shipped suite not imported: %s", exc)
        return False
    logger.info("shipped suite imported from %s: %d runs in %s", path, n, ", ".join(sorted(experiments)))
    return True


def _thinned(header: dict) -> str:
    """What the description says of a pack whose training histories were thinned (aah_core/suite_pack.py)."""
    every = header.get("history_every", 1)
    return "" if every == 1 else (f" Training metrics shipped every {every}th step, with every evaluation, every "
                                  "non-finite value and each window's lowest and highest train_loss; window plans: "
                                  f"the first of every {every} steps, and the last.")


def _import_run(s: Session, run: PackedRun, header: dict, fp: str) -> int:
    config = RunConfig.from_dict(run.config)  # validated by the engine, as a job's config is
    m = config.model
    experiment, group = experiment_name(header, run.corpus, run.lr_scale), group_name(run)
    params = {**run_store.flatten_params(config.to_dict()), PACK_PARAM: fp, "suite.scale": str(header.get("scale")),
              "suite.impl": run.impl, "suite.command": str(header.get("command", "")), "suite.corpus": run.corpus,
              "suite.lr_scale": f"{run.lr_scale:g}"}
    run_id = run_store.create_run(
        s, name=f"{group} · seed {run.seed}", experiment=experiment, status="FINISHED", preset=config.preset,
        params=params, config=config.to_dict(), seq_len=m.seq_len, total_steps=config.train.max_steps,
        data_hash=run.meta.get("data_hash"), git_rev=run.meta.get("git_rev"),
        source="suite", group=group, seed=run.seed, tags=["reproduction", str(header.get("scale"))],
        description=f"Our reproduction of the paper's {run.row} row ({header.get('scale')} scale, {run.corpus} corpus, "
        f"lr ×{run.lr_scale:g}, seed {run.seed}): "
        f"`{header.get('command') or 'aah suite paper'}`; see docs/reproduction.md." + _thinned(header))
    history = metric_rows(run.metrics, f"{experiment}/{group}/seed {run.seed}")
    metric_store.log_metrics(s, run_id, history)
    plans = []
    for event in run.plans:
        try:
            plan = validate_plan(event["windows"], m.n_layer, m.n_head, m.seq_len)
            step = int(event["step"])
        except (KeyError, TypeError, ValueError, AAHError) as exc:
            raise AAHError(f"{group} seed {run.seed}: a window plan is not valid ({exc})") from exc
        plans.append((step, plan_to_json(plan, m.seq_len)))
    run_store.log_plans(s, run_id, plans)
    stamps = [row[3] for row in history if row[3] > 0]
    run_store.update_run(s, run_id, progress_step=max((row[1] for row in history), default=0),
                     started_at=int(min(stamps) * 1000) if stamps else None,
                     ended_at=int(max(stamps) * 1000) if stamps else None)
    return run_id
