"""frontend.api: only reads are cached, and a grid click is read in one place."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from aah_client import ApiClient
from frontend import api, components

FRONTEND = Path(api.__file__).resolve().parent


def test_every_cacheable_name_is_a_client_method():
    assert api.CACHEABLE <= {name for name, _ in inspect.getmembers(ApiClient, inspect.isfunction)}


@pytest.mark.parametrize("method", ["create_run", "cancel_run", "update_run", "create_view", "delete_view",
                                    "register_model", "allocate"])
def test_calls_that_change_or_spend_are_never_cached(fake_api, method):
    with pytest.raises(ValueError, match="not a cacheable read"):
        api.cached(method, 1)
    assert fake_api.calls == []


def test_a_cached_read_is_asked_once(fake_api):
    plan = [[4, 8, None, 16], [8, None, 4, 4]]
    first = api.cached("evaluate", "demo", plan, eval_set="mixed")
    assert api.cached("evaluate", "demo", plan, eval_set="mixed") == first
    assert len(fake_api.called("evaluate")) == 1


@pytest.mark.parametrize("event, picked", [
    ({"selection": {"points": [{"x": 3, "y": 1, "z": 16}]}}, (1, 3)),
    ({"selection": {"points": []}}, None), ({}, None), (None, None),
])
def test_a_grid_click_picks_layer_y_and_head_x(event, picked):
    assert components.picked_head(event) == picked


def test_the_grid_click_is_read_in_one_place():
    """Pages draw clickable grids with components.head_grid; none reads a chart's selected points itself."""
    readers = sorted(str(p.relative_to(FRONTEND)) for p in FRONTEND.rglob("*.py") if '"points"' in p.read_text())
    assert readers == ["components.py"]
