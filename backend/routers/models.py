"""Models: list, windows, bundled texts, live evaluation, heatmaps, diagnostics, allocation, cost,
generation, rounding to serving grains and export.

Everything that runs the model goes through the heavy executor (services/executor.py): bounded,
429 with Retry-After when full, identical concurrent requests computed once. Those routes are
``async`` and only wait; the quick ones are plain ``def`` (FastAPI's thread pool)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import FileResponse

from aah_core.windows import coverage_metrics, plan_to_json
from backend.api.deps import HeavyDep, RegistryDep
from backend.schemas.base import OWN_WINDOW, AttentionWindow, EvalSet
from backend.schemas.models import (
    AllocateRequest,
    AllocateResponse,
    AttentionRequest,
    AttentionResponse,
    CostRequest,
    CostResponse,
    EvaluateRequest,
    EvaluateResponse,
    GenerateRequest,
    GenerateResponse,
    ModelCreate,
    ModelInfo,
    ModelUnavailable,
    ModelWindowsResponse,
    RetainedMassRequest,
    RetainedMassResponse,
    RetrievalRequest,
    RetrievalResponse,
    SensitivityResponse,
    TextInfo,
)
from backend.schemas.serving import ExportRequest, RoundRequest, RoundResponse
from backend.services import analysis, inference, serving
from backend.services.executor import BUSY
from backend.services.registry import Registry

router = APIRouter(prefix="/models", tags=["models"])
ModelId = Annotated[str, Path(max_length=64)]
TextId = Annotated[str | None, Query(max_length=64)]
PREVIEW_CHARS = 80


@router.get("")
def read_models(registry: RegistryDep) -> list[ModelInfo]:
    """Registered checkpoints (the demo model first on a fresh store)."""
    return registry.list_models()


@router.get("/unavailable")
def read_unavailable_models(registry: RegistryDep) -> list[ModelUnavailable]:
    """Registered models that cannot be served here (unreadable, inconsistent or too large for this
    machine's memory), each with the reason. They are left out of GET /models."""
    return registry.list_unavailable()


@router.post("", status_code=201, responses=BUSY)
async def create_model(body: ModelCreate, registry: RegistryDep, heavy: HeavyDep) -> ModelInfo:
    """Register a local model folder (a Hugging Face causal LM with config.json, *.safetensors and
    tokenizer.json, or an AAH Studio checkpoint) that lies under a model root (AAH_MODEL_DIRS). Its
    description (the config's model built on the meta device) runs in the heavy executor."""
    return await heavy.run(None, lambda: registry.register(body.path, body.name, body.seq_len, body.eval_tokens))


@router.get("/{model_id}")
def read_model(model_id: ModelId, registry: RegistryDep) -> ModelInfo:
    """One model's shape, buckets and parameter count."""
    return registry.info(model_id)


def _own_windows(registry: Registry, model_id: str) -> ModelWindowsResponse:
    lm = registry.get(model_id)
    T = lm.info.seq_len
    return ModelWindowsResponse(model_id=model_id, seq_len=T, windows=plan_to_json(lm.plan, T),
                                **coverage_metrics(lm.plan, T, lm.model.sinks),
                                **analysis.cost_fields(analysis.exact_cost(lm, lm.plan, T)).model_dump())


def _texts(registry: Registry, model_id: str) -> list[TextInfo]:
    lm = registry.get(model_id)
    return [TextInfo(id=t.id, name=t.name, kind=t.kind, n_tokens=int(t.ids.numel()),
                     preview=lm.tokenizer.decode(t.ids.tolist())[:PREVIEW_CHARS]) for t in lm.texts().values()]


# These two may be a model's first use: its load runs in the heavy executor, not on a request thread.
@router.get("/{model_id}/windows", response_model=ModelWindowsResponse, responses=BUSY)
async def read_model_windows(model_id: ModelId, registry: RegistryDep, heavy: HeavyDep) -> Response:
    """The model's own window plan and its coverage."""
    return await heavy.json_response(("windows", model_id), lambda: _own_windows(registry, model_id))


@router.get("/{model_id}/texts", responses=BUSY)
async def read_model_texts(model_id: ModelId, registry: RegistryDep, heavy: HeavyDep) -> list[TextInfo]:
    """Bundled evaluation texts usable for heatmaps and retained-mass curves."""
    return await heavy.run(("texts", model_id), lambda: _texts(registry, model_id))


@router.post("/{model_id}/evaluate", response_model=EvaluateResponse, responses=BUSY)
async def evaluate_model(model_id: ModelId, body: EvaluateRequest, registry: RegistryDep,
                         heavy: HeavyDep) -> Response:
    """Loss under a window plan vs the model's own plan, on a fixed evaluation batch."""
    return await heavy.json_response(("evaluate", model_id, body.model_dump_json()),
                                     lambda: analysis.evaluate(registry, registry.get(model_id), body))


@router.get("/{model_id}/attention", response_model=AttentionResponse, responses=BUSY)
async def read_attention(
    model_id: ModelId,
    registry: RegistryDep,
    heavy: HeavyDep,
    layer: Annotated[int, Query(ge=0, le=1024)] = 0,
    head: Annotated[int, Query(ge=0, le=1024)] = 0,
    text_id: TextId = None,
    window: Annotated[str, Query(pattern=r"^(own|full|[1-9][0-9]{0,9})$",
                                 description='"own" (default): the head\'s own window; "full"; or an int >= 1')]
    = OWN_WINDOW,
) -> Response:
    """One head's attention map on a bundled text, full and windowed, with the mass the window cuts."""
    chosen: AttentionWindow = OWN_WINDOW if window == OWN_WINDOW else None if window == "full" else int(window)
    return await heavy.json_response(("attention", model_id, layer, head, text_id, chosen),
                                     lambda: analysis.attention(registry.get(model_id), layer, head, None, text_id,
                                                                chosen))


@router.post("/{model_id}/attention", response_model=AttentionResponse, responses=BUSY)
async def create_attention(model_id: ModelId, body: AttentionRequest, registry: RegistryDep,
                           heavy: HeavyDep) -> Response:
    """As GET, for a posted text (<= 100,000 characters; seq_len tokens from `offset` are shown) or a
    bundled one."""
    return await heavy.json_response(("attention", model_id, body.model_dump_json()),
                                     lambda: analysis.attention(registry.get(model_id), body.layer, body.head,
                                                                body.text, body.text_id, body.window, body.offset))


@router.get("/{model_id}/retained-mass", response_model=RetainedMassResponse, responses=BUSY)
async def read_retained_mass(model_id: ModelId, registry: RegistryDep, heavy: HeavyDep,
                             text_id: TextId = None) -> Response:
    """Per head: mean attention mass within the last w keys, for w over the model's buckets
    (averaged over all bundled texts when text_id is omitted)."""
    return await heavy.json_response(("retained-mass", model_id, text_id),
                                     lambda: analysis.retained_mass(registry, registry.get(model_id),
                                                                    text_id))


@router.post("/{model_id}/retained-mass", response_model=RetainedMassResponse, responses=BUSY)
async def create_retained_mass(model_id: ModelId, body: RetainedMassRequest, registry: RegistryDep,
                               heavy: HeavyDep) -> Response:
    """As GET, on a posted text: the seq_len tokens shown from `offset` (the span POST /attention shows)."""
    return await heavy.json_response(("retained-mass", model_id, body.model_dump_json()),
                                     lambda: analysis.retained_mass_of_text(registry.get(model_id), body))


@router.get("/{model_id}/sensitivity", response_model=SensitivityResponse, responses=BUSY)
async def read_sensitivity(model_id: ModelId, registry: RegistryDep, heavy: HeavyDep,
                           eval_set: EvalSet = "mixed") -> Response:
    """Per head and bucket: the loss increase when that head alone gets that window."""
    return await heavy.json_response(("sensitivity", model_id, eval_set),
                                     lambda: analysis.sensitivity(registry, registry.get(model_id), eval_set))


@router.post("/{model_id}/retrieval", response_model=RetrievalResponse, responses=BUSY)
async def read_retrieval(model_id: ModelId, body: RetrievalRequest, registry: RegistryDep,
                         heavy: HeavyDep) -> Response:
    """Passkey retrieval under a plan: accuracy by distance with the key's repeat ending the sequence, and with
    the key planted at fixed starts (a model that copies only from the sequence's start shows there)."""
    return await heavy.json_response(("retrieval", model_id, body.model_dump_json()),
                                     lambda: analysis.passkey_retrieval(registry, registry.get(model_id), body))


@router.post("/{model_id}/allocate", response_model=AllocateResponse, responses=BUSY)
async def allocate_windows(model_id: ModelId, body: AllocateRequest, registry: RegistryDep,
                           heavy: HeavyDep) -> Response:
    """Windows under a coverage budget, with the path the allocator walked."""
    return await heavy.json_response(("allocate", model_id, body.model_dump_json()),
                                     lambda: analysis.allocate(registry, registry.get(model_id), body))


@router.post("/{model_id}/cost", response_model=CostResponse, responses=BUSY)
async def read_cost(model_id: ModelId, body: CostRequest, registry: RegistryDep, heavy: HeavyDep) -> Response:
    """A plan's exact KV-cache bytes and attention pairs at a context (beside the full plan's);
    with measure=true also prefill and decode-step times measured against the full plan in the same run."""
    return await heavy.json_response(("cost", model_id, body.model_dump_json()),
                                     lambda: inference.cost(registry.get(model_id), body))


@router.post("/{model_id}/generate", response_model=GenerateResponse, responses=BUSY)
async def generate_text(model_id: ModelId, body: GenerateRequest, registry: RegistryDep,
                        heavy: HeavyDep) -> Response:
    """Continue a prompt under a plan (default: the model's own) with per-head KV caches (seeded:
    identical requests give identical text, so concurrent ones share one generation)."""
    return await heavy.json_response(("generate", model_id, body.model_dump_json()),
                                     lambda: inference.generate_text(registry.get(model_id), body))


@router.post("/{model_id}/round", response_model=RoundResponse, responses=BUSY)
async def round_windows(model_id: ModelId, body: RoundRequest, registry: RegistryDep, heavy: HeavyDep) -> Response:
    """A plan rounded to a serving grain (head, kv_group, layer, transformers) in mode up or budget, with
    its loss (equal to POST /evaluate of the rounded plan), its delta to the plan's and its exact KV bytes."""
    return await heavy.json_response(("round", model_id, body.model_dump_json()),
                                     lambda: serving.round_windows(registry, registry.get(model_id), body))


@router.post("/{model_id}/export", response_class=FileResponse, responses=BUSY)
async def export_model(model_id: ModelId, body: ExportRequest, registry: RegistryDep, heavy: HeavyDep) -> FileResponse:
    """Round the plan and write a folder serving engines load under <data dir>/exports (a Hugging Face
    folder at granularity transformers, or an AAH Studio checkpoint); answers the folder as a zip."""
    archive = await heavy.run(("export", model_id, body.model_dump_json()),
                              lambda: serving.export(registry, registry.get(model_id), body))
    return FileResponse(archive, media_type="application/zip", filename=archive.name,
                        headers={"X-Export-Folder": f"{serving.EXPORTS}/{archive.stem}"})
