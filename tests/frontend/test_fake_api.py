"""The page tests' FakeApi stays in step with the real ApiClient: same public methods, same signatures."""

from __future__ import annotations

import inspect

import pytest

from aah_client import ApiClient
from tests.frontend.fake_api import FakeApi

PUBLIC = sorted(name for name, member in inspect.getmembers(ApiClient, inspect.isfunction) if not name.startswith("_"))


def shape(function) -> list[tuple[str, inspect._ParameterKind, object]]:
    """Parameter names, kinds and defaults (annotations aside: the fake is untyped)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_client_has_public_methods_to_compare() -> None:
    assert {"models", "evaluate", "attention", "create_run", "generate"} <= set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_the_fake_has_every_client_method_with_the_same_signature(name: str) -> None:
    fake = getattr(FakeApi, name, None)
    assert fake is not None, f"FakeApi lacks ApiClient.{name}; add it to tests/frontend/fake_api.py"
    assert shape(fake) == shape(getattr(ApiClient, name)), f"FakeApi.{name} differs from ApiClient.{name}"
