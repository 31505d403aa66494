"""Undo/redo over window plans for the editor. Pure: no Streamlit."""

from __future__ import annotations

from dataclasses import dataclass, field

from frontend.plans import Plan


@dataclass
class PlanHistory:
    """Undo/redo over plans."""

    base: Plan
    stack: list[Plan] = field(default_factory=list)
    pos: int = 0

    def __post_init__(self) -> None:
        if not self.stack:
            self.stack = [self.base]

    @property
    def current(self) -> Plan:
        return self.stack[self.pos]

    @property
    def can_undo(self) -> bool:
        return self.pos > 0

    @property
    def can_redo(self) -> bool:
        return self.pos < len(self.stack) - 1

    def push(self, plan: Plan) -> bool:
        """Record a new plan; returns False (and records nothing) if it equals the current one."""
        if plan == self.current:
            return False
        self.stack = self.stack[: self.pos + 1] + [plan]
        self.pos += 1
        return True

    def undo(self) -> Plan:
        if self.can_undo:
            self.pos -= 1
        return self.current

    def redo(self) -> Plan:
        if self.can_redo:
            self.pos += 1
        return self.current

    def reset(self) -> Plan:
        """Back to the base plan, kept as a new (undoable) step."""
        self.push(self.base)
        return self.current
