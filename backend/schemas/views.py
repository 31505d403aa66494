"""Request and response models of saved views (docs/api.md, "Saved views (presenting)"): a page's
state under a name, renamed and reordered.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator

from backend.schemas.base import DbId, Request, Response

MAX_VIEW_STATE_BYTES = 64 * 1024
MAX_VIEW_STATE_DEPTH = 64  # nesting of a saved view's state (the dashboard's is 3 deep)


class ViewCreate(Request):
    name: str = Field(min_length=1, max_length=120)
    page: str = Field(min_length=1, max_length=64)
    state: dict[str, Any]

    @field_validator("state", mode="before")
    @classmethod
    def _state_shape(cls, value: Any) -> Any:
        _check_json_tree(value, "state")
        return value

    @field_validator("state")
    @classmethod
    def _state_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, allow_nan=False).encode())
        if size > MAX_VIEW_STATE_BYTES:
            raise ValueError(f"state is {size} bytes as JSON; the limit is {MAX_VIEW_STATE_BYTES}")
        return value


class ViewUpdate(Request):
    name: str = Field(min_length=1, max_length=120)


class ViewOrder(Request):
    ids: list[DbId] = Field(max_length=10_000, description="every saved view's id once, in the new order")


def _check_json_tree(value: Any, name: str) -> None:
    """Walk free-form JSON without recursion: at most MAX_VIEW_STATE_DEPTH levels, text that is valid
    Unicode (no lone surrogates, which no JSON encoder can write back) and integers that fit 64 bits."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_VIEW_STATE_DEPTH:
            raise ValueError(f"{name} is nested deeper than {MAX_VIEW_STATE_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{name} holds text that is not valid Unicode (a lone surrogate)") from None
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            raise ValueError(f"{name} holds an integer out of range (|value| must be below 2**63)")


class ViewPublic(Response):
    id: int
    name: str
    page: str
    state: dict[str, Any]
    created_at: str
    position: int | None = Field(None, description="its place once the views were reordered (null: never)")
