"""Registered checkpoints and saved views: the store's two small catalogues."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

from sqlalchemy import CursorResult, delete, func, select
from sqlalchemy.orm import Session

from backend.schemas.errors import InvalidInput, NotFound
from backend.schemas.views import ViewCreate, ViewPublic
from backend.store.run_store import iso, now_ms
from backend.store.tables import Checkpoint, View


@dataclass(frozen=True)
class CheckpointEntry:
    id: str
    name: str
    path: str  # relative to the data dir
    run_id: int | None
    preset: str | None
    fingerprint: str | None
    seq_len: int | None = None  # evaluation context of a registered model folder (None: its default)
    eval_tokens: int | None = None  # tokens per evaluation set (None: the service's default batch)


def _entry(row: Checkpoint) -> CheckpointEntry:
    return CheckpointEntry(row.id, row.name, row.path, row.run_id, row.preset, row.fingerprint, row.seq_len,
                           row.eval_tokens)


def register_checkpoint(s: Session, entry: CheckpointEntry) -> None:
    """Insert or replace the checkpoint with this id."""
    row = s.get(Checkpoint, entry.id)
    if row is None:
        row = Checkpoint(id=entry.id, created_at=now_ms())
        s.add(row)
    row.name, row.path, row.run_id = entry.name, entry.path, entry.run_id
    row.preset, row.fingerprint, row.seq_len = entry.preset, entry.fingerprint, entry.seq_len
    row.eval_tokens = entry.eval_tokens


def find_checkpoint_by_path(s: Session, path: str) -> CheckpointEntry | None:
    row = s.scalars(select(Checkpoint).where(Checkpoint.path == path)).first()
    return None if row is None else _entry(row)


def list_checkpoints(s: Session) -> list[CheckpointEntry]:
    return [_entry(r) for r in s.scalars(select(Checkpoint).order_by(Checkpoint.created_at, Checkpoint.id))]


def get_checkpoint(s: Session, model_id: str) -> CheckpointEntry:
    row = s.get(Checkpoint, model_id)
    if row is None:
        raise NotFound(f"model {model_id!r} not found; GET /api/v1/models lists the available ones")
    return _entry(row)


def count_checkpoints(s: Session) -> int:
    return s.scalar(select(func.count(Checkpoint.id))) or 0


def _view_public(row: View) -> ViewPublic:
    return ViewPublic(id=row.id, name=row.name, page=row.page, state=json.loads(row.state_json),
                      created_at=iso(row.created_at), position=row.position)


def create_view(s: Session, body: ViewCreate) -> ViewPublic:
    row = View(name=body.name, page=body.page, state_json=json.dumps(body.state), created_at=now_ms())
    s.add(row)
    s.flush()
    return _view_public(row)


def list_views(s: Session) -> list[ViewPublic]:
    """Reordered views by position, then the others (newer ones) by id."""
    order = (View.position.is_(None), View.position, View.id)
    return [_view_public(r) for r in s.scalars(select(View).order_by(*order))]


def rename_view(s: Session, view_id: int, name: str) -> ViewPublic:
    row = s.get(View, view_id)
    if row is None:
        raise NotFound(f"view {view_id} not found")
    row.name = name
    s.flush()
    return _view_public(row)


def order_views(s: Session, ids: list[int]) -> list[ViewPublic]:
    """Give the views the order of `ids`, which must name every saved view once."""
    have = set(s.scalars(select(View.id)))
    if len(ids) != len(set(ids)) or set(ids) != have:
        missing, unknown = sorted(have - set(ids)), sorted(set(ids) - have)
        raise InvalidInput("ids: list every saved view once" + (f"; missing {missing}" if missing else "")
                           + (f"; no such view {unknown}" if unknown else "")
                           + ("; repeated ids" if len(ids) != len(set(ids)) else ""))
    for position, view_id in enumerate(ids):
        view = s.get(View, view_id)
        assert view is not None, "ids name the saved views (checked above)"
        view.position = position
    s.flush()
    return list_views(s)


def get_view(s: Session, view_id: int) -> ViewPublic:
    row = s.get(View, view_id)
    if row is None:
        raise NotFound(f"view {view_id} not found")
    return _view_public(row)


def delete_view(s: Session, view_id: int) -> None:
    # a DELETE's result is a cursor's (Session types it Result)
    if cast(CursorResult, s.execute(delete(View).where(View.id == view_id))).rowcount == 0:
        raise NotFound(f"view {view_id} not found")
