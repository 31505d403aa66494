"""The shared bases and types of every request and response model (pydantic v2).

Requests forbid unknown fields so a typo ("window" for "windows") is a 422, not a silent
default, and refuse text that no store keeps the same: control characters (NUL above all, which
PostgreSQL cannot store) and lone surrogates, anywhere in a request, keys of free-form objects included.
Non-finite floats serialise as null (``ser_json_inf_nan``), never as a 500.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from pydantic_core import PydanticCustomError

Window = Annotated[StrictInt, Field(ge=1, description="keys seen by the head (>= 1); null = full")]
Plan = Annotated[
    list[Annotated[list[Window | None], Field(max_length=1024)]],
    Field(description="per layer, per head: int >= 1 or null (full)", max_length=1024),
]
OWN_WINDOW: Final = "own"  # Final: typed Literal["own"], so it is an AttentionWindow
# /attention's window: "own" (the head's window in the model's own plan; the default), an int >= 1, or
# null (full), the same null as in a plan.
AttentionWindow = Window | Literal["own"] | None
EvalSet = Literal["mixed", "text", "english", "copy"]
# Ids are 32-bit integer columns (PostgreSQL's int4): a larger id is a 422, not a database error. Steps
# are 64-bit columns.
MAX_DB_ID = 2**31 - 1
DbId = Annotated[int, Field(ge=1, le=MAX_DB_ID)]
DbStep = Annotated[int, Field(ge=0, le=2**62)]
# Free-form JSON in a request (a run's config, a view's state) nests at most this deep: deeper values
# are refused before anything walks them recursively (json.dumps, the config parser).
MAX_JSON_DEPTH = 64
# C0 and C1 control characters and DEL, except tab, newline and carriage return (text may hold those)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored as it is (a control character, a lone surrogate), or None."""
    if (found := _CONTROL.search(text)) is not None:
        char = found.group()
        name = unicodedata.name(char, "a control character")
        return f"control character U+{ord(char):04X} ({name}) at position {found.start()}; it is not allowed in text"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"lone surrogate at position {exc.start}; text must be valid Unicode"
    return None


_WALKED = (str, dict, list, tuple)  # what may hold text; numbers, booleans, null and validated models do not
_WALKED_TYPES = frozenset(_WALKED)


def check_json_text(value: Any) -> None:
    """Every string (and key) in `value`, walked without recursion, stored as it is; at most
    MAX_JSON_DEPTH levels. Validated models inside are skipped: their own fields were checked."""
    stack: list[tuple[Any, tuple, int]] = [(value, (), 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise PydanticCustomError("json_too_deep", "nested deeper than {limit} levels", {"limit": MAX_JSON_DEPTH})
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                at = ".".join(map(str, where))
                raise PydanticCustomError("control_character", "{where}{problem}",
                                          {"where": f"at {at}: " if at else "", "problem": problem})
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, where, depth))  # a key is text too
                if isinstance(child, _WALKED):
                    stack.append((child, (*where, key), depth + 1))
        # a list of numbers (a batch's 20,000 steps) is passed over at C speed
        elif isinstance(item, (list, tuple)) and not _WALKED_TYPES.isdisjoint(map(type, item)):
            stack.extend((child, (*where, i), depth + 1) for i, child in enumerate(item) if isinstance(child, _WALKED))


class Response(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        # the common cases pass at once (a batch holds 20,000 points): a number, a plain ASCII string
        if isinstance(value, str) and value.isascii() and _CONTROL.search(value) is None:
            return value
        if isinstance(value, _WALKED):
            check_json_text(value)
        return value
