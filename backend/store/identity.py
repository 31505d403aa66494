"""A run's editable identity: name, description, notes and tags (PATCH /runs/{id})."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete
from sqlalchemy.orm import Session

from backend.schemas.errors import Conflict, NotFound
from backend.schemas.runs import RunPublic, RunUpdate
from backend.store import run_store
from backend.store.tables import Run, RunTag


def set_tags(s: Session, run_id: int, tags: Sequence[str]) -> None:
    """Replace a run's tags."""
    s.execute(delete(RunTag).where(RunTag.run_id == run_id))
    s.add_all(RunTag(run_id=run_id, tag=tag) for tag in dict.fromkeys(tags))


def update_identity(s: Session, run_id: int, body: RunUpdate) -> RunPublic:
    """Apply the fields given in `body`; the paper's read-only runs refuse any edit."""
    run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.read_only:
        raise Conflict(f"run {run_id} is read-only (the paper's reported numbers)")
    fields = body.model_dump(exclude_unset=True)
    for key in ("name", "description", "notes"):
        if key in fields:
            if key == "name" and fields[key] is None:
                raise Conflict("name: a run keeps a name; send a non-empty string")
            setattr(run, key, fields[key])
    if fields.get("tags") is not None:
        set_tags(s, run_id, fields["tags"])
    s.flush()
    return run_store.get_run(s, run_id)
