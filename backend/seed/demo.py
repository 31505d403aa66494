"""First-start content: the shipped demo checkpoint with its training history, and the paper's
reference experiment. Both are idempotent; the demo is re-imported when the shipped files change
(e.g. the trained checkpoint replacing the quick placeholder)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import uuid
from pathlib import Path

from sqlalchemy.orm import Session

from aah_core.checkpoint import FILES as CHECKPOINT_FILES
from aah_core.checkpoint import read_checkpoint_info
from aah_core.errors import CheckpointError
from aah_core.windows import plan_to_json
from backend.settings import Settings
from backend.store import catalog, metric_store, run_store
from backend.store.tables import Checkpoint

logger = logging.getLogger(__name__)
DEMO_ID = "demo"
DEMO_EXPERIMENT = "demo"
HISTORY = "history.jsonl"


def fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in (*CHECKPOINT_FILES, HISTORY):
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def _place_inside(src: Path, data_dir: Path) -> str:
    """The demo's path relative to the data dir, copying it in (atomically) when it lives elsewhere."""
    src = src.resolve()
    if src.is_relative_to(data_dir):
        return str(src.relative_to(data_dir))
    dest = data_dir / "models" / DEMO_ID
    tmp = dest.parent / f".{DEMO_ID}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    for name in (*CHECKPOINT_FILES, HISTORY):
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return str(dest.relative_to(data_dir))


def read_history(path: Path) -> list[metric_store.MetricRow]:
    """Rows of a JSONL metrics file ({"step", "time", key: value, ...}); null values become NaN."""
    if not path.is_file():
        return []
    events = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError:
                logger.warning("%s:%d: not JSON, skipped", path, line_no)
    return metric_rows(events, str(path))


def metric_rows(events: list, where: str) -> list[metric_store.MetricRow]:
    """Metric events ({"step", "time", key: value, ...}) as store rows; null values become NaN,
    events without a step are skipped (with a warning naming `where` and the event's position)."""
    rows: list[metric_store.MetricRow] = []
    for n, event in enumerate(events, 1):
        try:
            event = dict(event)
            step, ts = int(event.pop("step")), float(event.pop("time", 0.0))
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning("%s: event %d is not a metrics event, skipped", where, n)
            continue
        for key, value in event.items():
            if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((str(key), step, math.nan if value is None else float(value), ts))
    return rows


def seed_demo(s: Session, settings: Settings) -> bool:
    """Register the shipped demo checkpoint and its history as a FINISHED run; False if up to date."""
    src = settings.demo_dir
    if src is None or not all((src / name).is_file() for name in CHECKPOINT_FILES):
        logger.info("no demo checkpoint at %s; skipping demo seeding", src)
        return False
    fp = fingerprint(src)
    existing = s.get(Checkpoint, DEMO_ID)
    if existing is not None and existing.fingerprint == fp:
        return False
    try:
        info = read_checkpoint_info(src)  # config, meta and plan validated by the engine
    except CheckpointError as exc:
        logger.error("demo checkpoint not registered: %s", exc)
        return False
    if existing is not None and existing.run_id is not None:
        run_store.delete_runs(s, [existing.run_id])
    relative = _place_inside(src, settings.data_dir)
    config, meta, seq_len = info.config.to_dict(), info.meta, info.config.model.seq_len
    history = read_history(src / HISTORY)
    last_step = max((row[1] for row in history), default=int(meta.get("step", 0)))
    run_id = run_store.create_run(
        s, name="demo model (shipped)", experiment=DEMO_EXPERIMENT, status="FINISHED",
        preset=info.config.preset, params=run_store.flatten_params(config), config=config,
        seq_len=seq_len, checkpoint=relative, data_hash=meta.get("data_hash"),
        git_rev=meta.get("git_rev"), total_steps=info.config.train.max_steps, source="imported",
        seed=info.config.train.seed, description="The shipped demo checkpoint (make demo-model).",
    )
    stamps = [row[3] for row in history if row[3] > 0]
    run_store.update_run(s, run_id, progress_step=last_step,
                     started_at=int(min(stamps) * 1000) if stamps else None,
                     ended_at=int(max(stamps) * 1000) if stamps else None)
    metric_store.log_metrics(s, run_id, history)
    run_store.log_plan(s, run_id, last_step, plan_to_json(info.plan, seq_len))
    catalog.register_checkpoint(s, catalog.CheckpointEntry(
        id=DEMO_ID, name="Demo model", path=relative, run_id=run_id, preset=info.config.preset, fingerprint=fp))
    logger.info("demo checkpoint registered from %s (%d metric rows)", src, len(history))
    return True
