"""The shared bases and types of every request and response model (pydantic v2).

Requests forbid unknown fields so a typo ("window" for "windows") is a 422, not a silent
default. Non-finite floats serialise as null (``ser_json_inf_nan``), never as a 500.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

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
# Ids and steps are SQLite integers (64-bit signed): anything larger is a 422, not an overflow.
DbId = Annotated[int, Field(ge=1, le=2**62)]
DbStep = Annotated[int, Field(ge=0, le=2**62)]


class Response(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
