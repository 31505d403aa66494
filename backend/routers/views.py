"""Saved views: a name, a dashboard page and its UI state, for presenting; renamed, reordered, deleted."""

from __future__ import annotations

from fastapi import APIRouter, Path, Response

from backend.api.deps import SessionDep
from backend.schemas.base import MAX_DB_ID
from backend.schemas.views import ViewCreate, ViewOrder, ViewPublic, ViewUpdate
from backend.store import catalog

router = APIRouter(prefix="/views", tags=["views"])
ViewId = Path(ge=1, le=MAX_DB_ID)


@router.get("")
def read_views(session: SessionDep) -> list[ViewPublic]:
    """All saved views, oldest first."""
    return catalog.list_views(session)


@router.post("", status_code=201)
def create_view(body: ViewCreate, session: SessionDep) -> ViewPublic:
    """Save a view (state: any JSON object up to 64 KB)."""
    return catalog.create_view(session, body)


@router.put("/order")
def order_views(body: ViewOrder, session: SessionDep) -> list[ViewPublic]:
    """Reorder the saved views: `ids` names every view once, in the new order."""
    return catalog.order_views(session, body.ids)


@router.get("/{view_id}")
def read_view(session: SessionDep, view_id: int = ViewId) -> ViewPublic:
    """One saved view."""
    return catalog.get_view(session, view_id)


@router.patch("/{view_id}")
def update_view(body: ViewUpdate, session: SessionDep, view_id: int = ViewId) -> ViewPublic:
    """Rename a saved view."""
    return catalog.rename_view(session, view_id, body.name)


@router.delete("/{view_id}", status_code=204)
def delete_view(session: SessionDep, view_id: int = ViewId) -> Response:
    """Delete a saved view."""
    catalog.delete_view(session, view_id)
    return Response(status_code=204)
