"""Serving grains: a plan rounded to what serving engines support (aah_core.inference.serving), evaluated like any
other plan, and exported as a folder under <data dir>/exports (aah_core.inference.export), sent as a zip."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from aah_core.inference.cost import ModelShape
from aah_core.inference.export import ExportFacts, write_export
from aah_core.inference.serving import Rounding, round_plan
from aah_core.windows import coverage_metrics, plan_to_json
from backend.schemas.errors import Conflict, InvalidInput, Unavailable
from backend.schemas.serving import ExportRequest, RoundRequest, RoundResponse
from backend.services.analysis import cost_fields, exact_cost, parse_plan, plan_loss
from backend.services.registry import LoadedModel, Registry

EXPORTS = "exports"


def _round(registry: Registry, lm: LoadedModel, body: RoundRequest) -> tuple[Rounding, float, float]:
    """(the rounding, its loss, the per-head plan's loss), losses from the service's evaluation cache."""
    plan = parse_plan(lm, body.windows)

    def loss_of(p):
        return plan_loss(registry, lm, p, body.eval_set)

    rounding = round_plan(plan, ModelShape.of(lm.model), body.granularity, body.mode, lm.model.buckets, loss_of)
    return rounding, loss_of(rounding.plan), loss_of(plan)


def round_windows(registry: Registry, lm: LoadedModel, body: RoundRequest) -> RoundResponse:
    rounding, loss, base = _round(registry, lm, body)
    T = lm.info.seq_len
    return RoundResponse(
        **cost_fields(exact_cost(lm, rounding.plan, T)).model_dump(), **coverage_metrics(rounding.plan, T, lm.model.sinks),
        windows=plan_to_json(rounding.plan, T),
        granularity=body.granularity, mode=body.mode, loss=loss, plan_loss=base, delta=loss - base,
        kv_bytes_plan=rounding.kv_bytes_plan, window=rounding.chosen.window, candidates=len(rounding.candidates),
        note=rounding.note,
    )


def _export_dir(root: Path, lm: LoadedModel, body: ExportRequest) -> Path:
    """The export's folder: the given name, or one derived from the request (the same request, the same
    folder); always directly under root."""
    name = body.name or f"{lm.id}-{body.granularity}-{body.mode}-" + hashlib.sha256(
        body.model_dump_json(exclude={"name"}).encode()).hexdigest()[:10]
    out = (root / name).resolve()
    if out.parent != root.resolve():
        raise InvalidInput(f"name: {body.name!r} does not name a folder directly under {EXPORTS}/")
    return out


def _zip(out: Path, archive: Path) -> None:
    tmp = archive.with_name(archive.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:  # weights do not compress; store them
        for file in sorted(out.iterdir()):
            z.write(file, f"{out.name}/{file.name}")
    tmp.replace(archive)


def export(registry: Registry, lm: LoadedModel, body: ExportRequest) -> Path:
    """Write (or reuse) the export folder and its zip under <data dir>/exports; returns the zip."""
    root = registry.settings.data_dir / EXPORTS
    out = _export_dir(root, lm, body)
    archive = out.with_name(out.name + ".zip")
    if out.exists() and body.name is not None:
        raise Conflict(f"{EXPORTS}/{out.name} exists already; choose another name")
    if out.exists() and archive.is_file():  # the same request again
        return archive
    try:
        if not out.exists():
            rounding, loss, base = _round(registry, lm, body)
            facts = ExportFacts(loss, base, body.eval_set, f"POST /api/v1/models/{lm.id}/export, {body.mode} mode")
            write_export(registry.folder(lm.id), lm.info.family, rounding, ModelShape.of(lm.model), out, facts)
        _zip(out, archive)
    except OSError as exc:  # disk full, read-only data dir: the request may succeed later
        raise Unavailable(f"cannot write the export under {EXPORTS}/ in the data dir ({exc.strerror or exc})") from None
    return archive
