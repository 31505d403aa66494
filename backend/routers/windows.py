"""POST /windows/diff: compare two window plans (of runs, models or inline)."""

from __future__ import annotations

from fastapi import APIRouter

from aah_core.windows import JsonPlan, plan_to_json
from backend.api.deps import RegistryDep, SessionDep
from backend.schemas.errors import InvalidInput
from backend.schemas.runs import DiffRequest, DiffResponse, InlinePlanRef, ModelPlanRef, PlanRef
from backend.store import run_store

router = APIRouter(prefix="/windows", tags=["windows"])


def _resolve(ref: PlanRef, session: SessionDep, registry: RegistryDep) -> tuple[JsonPlan, int | None]:
    """(plan with full as null, seq_len when known)."""
    if isinstance(ref, ModelPlanRef):
        lm = registry.get(ref.model_id)
        return plan_to_json(lm.plan, lm.info.seq_len), lm.info.seq_len
    if isinstance(ref, InlinePlanRef):
        return [list(row) for row in ref.windows], None
    plan = run_store.read_plan(session, ref.run_id, ref.step)
    return plan.windows, plan.seq_len or None


def _normalise(plan: JsonPlan, seq_len: int | None) -> JsonPlan:
    return plan if seq_len is None else plan_to_json(plan, seq_len)


@router.post("/diff")
def diff_windows(body: DiffRequest, session: SessionDep, registry: RegistryDep) -> DiffResponse:
    """Which heads differ between plan a and plan b (same shape required)."""
    a, len_a = _resolve(body.a, session, registry)
    b, len_b = _resolve(body.b, session, registry)
    seq_len = len_a or len_b
    a, b = _normalise(a, seq_len), _normalise(b, seq_len)
    shape_a = [len(row) for row in a]
    shape_b = [len(row) for row in b]
    if shape_a != shape_b:
        raise InvalidInput(f"b: plan shape (layers x heads per layer) {shape_b} differs from a's {shape_a}")
    changed = [[x != y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
    return DiffResponse(a=a, b=b, changed=changed, n_changed=sum(map(sum, changed)))
