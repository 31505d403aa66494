"""One coercer for every config override: a raw value (a CLI string, or a JSON value from the API) to the
type a dataclass field is annotated with, or InvalidConfig naming the key; and `check_bounds`, the one
range check of the config dataclasses.

Integers stay exact (a JSON integer or a decimal string is never routed through a float), a float given
for an integer field must be integral, and no number is accepted outside what a 64-bit integer or a
finite double holds: ``train.max_steps: 1e30`` is refused here, not by the database later."""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from aah_core.errors import InvalidConfig

NULLS = ("null", "none", "")
INT64_MAX = 2**63 - 1
Bounds = Mapping[str, tuple[float, float]]  # field -> (lowest, highest) allowed, both inclusive
STEPS_MAX = 10**9  # steps of any kind (training, warmup, intervals): beyond any run this tool makes
SEQ_LEN_MAX = 1 << 17  # the longest context a config may name (windows, spans, feature rows)


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
    wrong = InvalidConfig(f"{key} expects {'an integer' if hint is int else 'a finite number'}; got {value!r}")
    if isinstance(value, bool) or value is None:
        raise wrong
    if hint is int and isinstance(value, int):
        number: int | float = value
    elif hint is int and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        if len(value.strip()) > 20:  # more digits than any int64 (and int() refuses > 4300 digits)
            raise InvalidConfig(f"{key}={value[:30]!r}... is out of range (|value| must be below 2**63)")
        number = int(value.strip())
    else:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise wrong from None
        if not math.isfinite(number):
            raise wrong
        if hint is int:
            if number != math.floor(number):
                raise wrong
            number = int(number)
    if abs(number) > INT64_MAX:
        raise InvalidConfig(f"{key}={value!r} is out of range (|value| must be below 2**63)")
    return number


def check_bounds(obj: Any, prefix: str, bounds: Bounds) -> None:
    """Every named field of ``obj`` is a number (not a bool; an int for int bounds) within its bounds;
    InvalidConfig names the first one that is not, with its range."""
    for name, (low, high) in bounds.items():
        value = getattr(obj, name)
        integral = isinstance(low, int) and isinstance(high, int)
        kind = (int,) if integral else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not (low <= value <= high):
            what = "an integer" if integral else "a number"
            raise InvalidConfig(f"{prefix}.{name} must be {what} in [{low:,}, {high:,}]; got {value!r}")


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
