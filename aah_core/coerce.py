"""One coercer for every config override: a raw value (a CLI string, or a JSON value from the API) to the
type a dataclass field is annotated with, or InvalidConfig naming the key."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from aah_core.errors import InvalidConfig

NULLS = ("null", "none", "")


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config dataclass (``from __future__ import annotations`` safe)."""
    return typing.get_type_hints(cls)


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Convert ``value`` to ``hint`` (bool, int, float, str, X | None, list[X]); raise InvalidConfig otherwise."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in NULLS):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        return _to_bool(value, key)
    if hint is int or hint is float:
        return _to_number(value, hint, key)
    if hint is str:
        if not isinstance(value, str):
            raise InvalidConfig(f"{key} expects a string; got {value!r}")
        return value
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(_to_list(value, key))]
    raise InvalidConfig(f"{key}: unsupported value {value!r}")


def _to_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidConfig(f"{key} expects true/false; got {value!r}")


def _to_number(value: Any, hint: type, key: str) -> int | float:
    try:
        if isinstance(value, bool) or value is None:
            raise ValueError
        number = float(value)
        if hint is float:
            return number
        if number != int(number):
            raise ValueError
        return int(number)
    except (TypeError, ValueError, OverflowError):
        raise InvalidConfig(f"{key} expects a {hint.__name__}; got {value!r}") from None


def _to_list(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise InvalidConfig(f"{key} expects a JSON list; got {value!r}") from None
        else:
            value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, list):
        raise InvalidConfig(f"{key} expects a list; got {value!r}")
    return value
