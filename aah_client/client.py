"""`ApiClient`: one method per endpoint of docs/api.md, returning the server's JSON as plain dicts.

Usage from a notebook::

    from aah_client import ApiClient
    api = ApiClient("http://127.0.0.1:8000")
    model = api.models()[0]
    plan = api.model_windows(model["id"])["windows"]
    plan[0][0] = 16
    result = api.evaluate(model["id"], plan, per_token=True)
    print(result["loss"], result["delta"], result["causal_coverage"])

Errors: an HTTP error response raises `ApiError(status, detail)` carrying the server's `detail`;
a server that cannot be reached (refused connection, DNS failure, timeout) raises `ServiceUnavailable`,
a subclass of `ApiError` with `status=None`, so callers may catch `ApiError` alone.

A busy server (429: its queue of heavy jobs is full) says when to ask again (`Retry-After`). The
client then waits that long (at most `BUSY_WAIT_MAX_S`) and retries, `busy_retries` times, before it
raises `ServerBusy` (an `ApiError` with status 429 and `retry_after`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, Literal, TypeVar

import httpx

logger = logging.getLogger(__name__)

T = TypeVar("T")
Window = int | None
Plan = list[list[Window]]
"""A window plan: one list per layer, one entry per head; `None` means full causal attention."""
OWN_WINDOW: Final = "own"  # Final: typed Literal["own"]
"""`attention(window=OWN_WINDOW)` (the default): the head's own window in the model's plan."""

Json = dict[str, Any]
EvalSet = Literal["mixed", "text", "english", "copy"]
Agg = Literal["last", "min", "max", "at_step"]
Granularity = Literal["head", "kv_group", "layer", "transformers"]
RoundMode = Literal["up", "budget"]
API_PREFIX = "/api/v1"
BUSY_RETRIES = 3
BUSY_WAIT_MAX_S = 10.0


class ApiError(Exception):
    """The server answered with an error status (or, for `ServiceUnavailable`, not at all)."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(f"{status}: {detail}" if status is not None else detail)
        self.status = status
        self.detail = detail


class ServiceUnavailable(ApiError):
    """The API could not be reached: not running, wrong `AAH_API_URL`, or it timed out."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


class ServerBusy(ApiError):
    """429: the server has too many heavy jobs running or queued; ask again after `retry_after` seconds."""

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(429, detail)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float:
    """The `Retry-After` header in seconds (1 when missing or given as a date)."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return 1.0


def retry_when_busy(request: Callable[[], T], retries: int, wait: Callable[[float, int], None],
                    max_wait: float = BUSY_WAIT_MAX_S) -> T:
    """``request()``, asked again up to ``retries`` times while it raises ServerBusy; before each retry
    ``wait(seconds, attempt)`` is called with the server's Retry-After (at most ``max_wait``)."""
    attempt = 0
    while True:
        try:
            return request()
        except ServerBusy as exc:
            if attempt >= retries:
                raise
            attempt += 1
            wait(min(exc.retry_after, max_wait), attempt)


def _detail(response: httpx.Response) -> str:
    """The server's human-readable `detail`, or a short fallback when the body is not our JSON."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:300] or response.reason_phrase or "no detail"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # FastAPI's default validation shape: [{"loc": [...], "msg": ...}]
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", []) if x != "body")
                parts.append(f"{loc}: {item.get('msg', '')}".strip(": "))
        return "; ".join(parts) or str(detail)
    return str(body)[:300]


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class ApiClient:
    """Typed access to the AAH Studio API.

    Args:
        base_url: where the service listens, e.g. ``http://127.0.0.1:8000`` (the ``/api/v1`` prefix is added).
        token: sent as ``Authorization: Bearer <token>`` when given (needed for POST/DELETE when the
            server sets ``AAH_API_TOKEN``).
        timeout: seconds per request.
        busy_retries: how often a 429 (server busy) is retried after its `Retry-After` before
            `ServerBusy` is raised (0: raise at once, for callers that retry themselves).
        transport: an httpx transport, for tests (``httpx.MockTransport``).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 30.0,
        busy_retries: int = BUSY_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.busy_retries = busy_retries
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ApiClient({self.base_url!r})"

    # -- transport ---------------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, params: dict | None = None, json: Any = None,
                 raw: bool = False) -> Any:
        def wait(seconds: float, attempt: int) -> None:
            logger.info("API busy on %s %s; retry %d/%d in %.0f s", method, path, attempt, self.busy_retries,
                        seconds)
            time.sleep(seconds)

        return retry_when_busy(lambda: self._request_once(method, path, params=params, json=json, raw=raw),
                               self.busy_retries, wait)

    def _request_once(self, method: str, path: str, *, params: dict | None, json: Any, raw: bool = False) -> Any:
        """The answer's JSON (None when empty), or with `raw` its bytes (downloads)."""
        try:
            response = self._http.request(method, path, params=_clean(params or {}), json=json)
        except httpx.TimeoutException as exc:
            raise ServiceUnavailable(f"the API at {self.base_url} timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"cannot reach the API at {self.base_url}: {exc}") from exc
        if response.status_code == 429:
            raise ServerBusy(_detail(response), _retry_after(response))
        if response.is_error:
            raise ApiError(response.status_code, _detail(response))
        if raw:
            return response.content
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(response.status_code, f"the API sent a non-JSON answer to {method} {path}") from exc

    def _get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params)

    def _post(self, path: str, body: Any) -> Any:
        return self._request("POST", path, json=body)

    # -- health, models, presets ---------------------------------------------------------------------
    def health(self) -> Json:
        return self._get("/health")

    def models(self) -> list[Json]:
        return self._get("/models")

    def unavailable_models(self) -> list[Json]:
        """Registered models the server cannot open, each ``{"id", "name", "reason"}`` (not in `models()`)."""
        return self._get("/models/unavailable")

    def model(self, model_id: str) -> Json:
        return self._get(f"/models/{model_id}")

    def register_model(self, path: str, name: str | None = None, seq_len: int | None = None) -> Json:
        """Register a local model folder (under the server's AAH_MODEL_DIRS); returns its ModelInfo."""
        return self._post("/models", {"path": path, "name": name, "seq_len": seq_len})

    def model_windows(self, model_id: str) -> Json:
        """The model's own plan with its `acr`, `causal_coverage` and `tile_coverage`."""
        return self._get(f"/models/{model_id}/windows")

    def model_texts(self, model_id: str) -> list[Json]:
        return self._get(f"/models/{model_id}/texts")

    def presets(self) -> list[Json]:
        return self._get("/presets")

    # -- live evaluation and diagnostics -------------------------------------------------------------
    def evaluate(
        self, model_id: str, windows: Plan, eval_set: EvalSet = "mixed", per_token: bool = False,
        sinks: int | None = None,
    ) -> Json:
        """The loss of `windows`; `sinks`: sink tokens to evaluate with (None: the model's own)."""
        body: dict[str, Any] = {"windows": windows, "eval_set": eval_set, "per_token": per_token}
        if sinks is not None:
            body["sinks"] = sinks
        return self._post(f"/models/{model_id}/evaluate", body)

    def attention(
        self,
        model_id: str,
        layer: int,
        head: int,
        text_id: str | None = None,
        window: Window | Literal["own"] = OWN_WINDOW,
        text: str | None = None,
        offset: int = 0,
    ) -> Json:
        """One head's full and windowed attention maps (GET for bundled texts, POST for free text).

        ``window``: "own" (the head's window in the model's plan), an int >= 1, or None (full).
        ``offset``: with ``text``, the first token shown (the answer's ``offset`` and ``text_tokens``
        say which span of the whole text the maps cover)."""
        if text is not None:
            body = {"layer": layer, "head": head, "text": text, "text_id": None, "window": window, "offset": offset}
            return self._post(f"/models/{model_id}/attention", body)
        query = "full" if window is None else window  # a query string has no null
        return self._get(f"/models/{model_id}/attention", layer=layer, head=head, text_id=text_id, window=query)

    def retained_mass(self, model_id: str, text_id: str | None = None) -> Json:
        return self._get(f"/models/{model_id}/retained-mass", text_id=text_id)

    def retained_mass_of_text(self, model_id: str, text: str, offset: int = 0) -> Json:
        """Retained-mass curves on a posted text's span from `offset` (the span POST /attention shows)."""
        return self._post(f"/models/{model_id}/retained-mass", {"text": text, "offset": offset})

    def sensitivity(self, model_id: str, eval_set: EvalSet = "mixed") -> Json:
        return self._get(f"/models/{model_id}/sensitivity", eval_set=eval_set)

    def allocate(
        self, model_id: str, budget: float, metric: str = "causal_coverage", eval_set: EvalSet = "mixed",
        held_out: EvalSet | None = None,
    ) -> Json:
        """A plan chosen on `eval_set` under the budget, scored on `held_out` too (None: the server's default)."""
        body: dict[str, Any] = {"budget": budget, "metric": metric, "eval_set": eval_set}
        if held_out is not None:
            body["held_out"] = held_out
        return self._post(f"/models/{model_id}/allocate", body)

    # -- inference: cost of a plan, generation ---------------------------------------------------------
    def cost(self, model_id: str, windows: Plan, context: int, measure: bool = False) -> Json:
        """Exact KV-cache bytes and attention pairs of a plan at `context` (<= seq_len), beside the full
        plan's; with `measure`, prefill and decode-step times measured against the full plan too."""
        body = {"windows": windows, "context": context, "measure": measure}
        return self._post(f"/models/{model_id}/cost", body)

    def generate(
        self, model_id: str, prompt: str, windows: Plan | None = None, max_new_tokens: int = 64,
        temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
    ) -> Json:
        """Continue `prompt` under a plan (None: the model's own); greedy at temperature 0."""
        body = {"prompt": prompt, "windows": windows, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        return self._post(f"/models/{model_id}/generate", body)

    def retrieval(self, model_id: str, windows: Plan | None = None, per_cell: int = 16) -> Json:
        """Passkey retrieval under a plan (None: the model's own): accuracy by distance with the key's repeat
        ending the sequence (`end`) and with the key planted at fixed `starts` (`by_start`)."""
        return self._post(f"/models/{model_id}/retrieval", {"windows": windows, "per_cell": per_cell})

    # -- serving grains and export -------------------------------------------------------------------
    def round_plan(
        self, model_id: str, windows: Plan, granularity: Granularity = "transformers", mode: RoundMode = "up",
        eval_set: EvalSet = "mixed",
    ) -> Json:
        """The plan rounded to a serving grain ("head", "kv_group", "layer", "transformers"): `windows`, `loss`
        (what `evaluate` gives for it), `delta` to the plan's loss, `kv_bytes` (and the plan's, the full
        plan's), `window` (transformers: the one sliding window) and a `note` naming the engines."""
        body = {"windows": windows, "granularity": granularity, "mode": mode, "eval_set": eval_set}
        return self._post(f"/models/{model_id}/round", body)

    def export(
        self, model_id: str, windows: Plan, granularity: Granularity = "transformers", mode: RoundMode = "up",
        eval_set: EvalSet = "mixed", name: str | None = None,
    ) -> bytes:
        """Round the plan and export it (the server writes <data dir>/exports/<name>); returns the folder as
        zip bytes. A Hugging Face model exports at "transformers" only; a refusal is an ApiError (422)."""
        body = {"windows": windows, "granularity": granularity, "mode": mode, "eval_set": eval_set, "name": name}
        return self._request("POST", f"/models/{model_id}/export", json=body, raw=True)

    # -- runs ----------------------------------------------------------------------------------------
    def runs(
        self,
        experiment: str | None = None,
        preset: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        source: str | None = None,
        group: str | None = None,
        tag: str | None = None,
    ) -> list[Json]:
        return self._get("/runs", experiment=experiment, preset=preset, status=status, limit=limit, offset=offset,
                         source=source, group=group, tag=tag)

    def run(self, run_id: int) -> Json:
        return self._get(f"/runs/{run_id}")

    def update_run(self, run_id: int, **fields: Any) -> Json:
        """PATCH the run's name, description, notes or tags (a list; replaces the tags)."""
        return self._request("PATCH", f"/runs/{run_id}", json=fields)

    def run_groups(
        self,
        keys: list[str] | None = None,
        agg: Agg = "last",
        experiment: str | None = None,
        group: str | None = None,
        source: str | None = None,
        tag: str | None = None,
    ) -> list[Json]:
        """Runs with a group, by (experiment, group): per key the mean, sample std, min and max over runs."""
        return self._get("/runs/groups", keys=",".join(keys) if keys else None, agg=agg, experiment=experiment,
                         group=group, source=source, tag=tag)

    def group_series(self, experiment: str, group: str, keys: list[str] | None = None,
                     max_points: int | None = None) -> Json:
        """One group's curves by aligned step: mean, std, min, max and n per key, at most ``max_points``
        steps (the server's default 2000), and each run's NaN/inf points (``nonfinite``)."""
        return self._get("/runs/groups/series", experiment=experiment, group=group,
                         keys=",".join(keys) if keys else None, max_points=max_points)

    def group_paired(self, experiment: str, base: str, keys: list[str], agg: Agg = "last") -> list[Json]:
        """Every other group of ``experiment`` against group ``base`` per key: the differences of the runs'
        values paired by seed, their mean, std and 95% t half-interval (``ci95``), and ``resolved``."""
        return self._get("/runs/groups/paired", experiment=experiment, base=base, keys=",".join(keys), agg=agg)

    def run_metrics(
        self,
        run_id: int,
        keys: list[str] | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        max_points: int | None = None,
        cursor: str | None = None,
    ) -> Json:
        """Series by key. A series longer than ``max_points`` (>= 3; the server's default 2000) is
        downsampled by the server (every step bucket's min and max and the last point kept; the keys
        are in ``downsampled``). A NaN or inf value comes as its kind ("nan", "inf", "-inf"), and each
        series lists its non-finite points in ``nonfinite``, also those downsampling left out.

        With ``cursor`` ("start", then each answer's ``next_cursor`` until it is None) the full series
        come in pages of ``max_points`` rows: see `metric_history`."""
        return self._get(
            f"/runs/{run_id}/metrics",
            keys=",".join(keys) if keys else None,
            min_step=min_step,
            max_step=max_step,
            max_points=max_points,
            cursor=cursor,
        )

    def metric_history(self, run_id: int, keys: list[str] | None = None, page_size: int = 50_000) -> Json:
        """Every stored point of the series (no downsampling), read page by page: {key: {"step",
        "value", "timestamp"}}."""
        out: Json = {}
        cursor: str | None = "start"
        while cursor is not None:
            page = self.run_metrics(run_id, keys, max_points=page_size, cursor=cursor)
            for key, series in page["series"].items():
                into = out.setdefault(key, {"step": [], "value": [], "timestamp": []})
                for field in into:
                    into[field].extend(series[field])
            cursor = page["next_cursor"]
        return out

    def run_windows(self, run_id: int, step: int | None = None) -> Json:
        return self._get(f"/runs/{run_id}/windows", step=step)

    def create_run(
        self,
        preset: str,
        overrides: dict[str, Any] | None = None,
        name: str | None = None,
        experiment: str | None = None,
        target: str = "local",
        resources: dict[str, Any] | None = None,
    ) -> Json:
        """Start a job on ``target`` (local, ray, slurm: see ``targets``) asking for ``resources``
        (gpus, cpus, memory_gb, nodes, time_limit_min)."""
        body = {"preset": preset, "overrides": overrides or {}, "name": name, "experiment": experiment,
                "target": target, "resources": resources or {}}
        return self._post("/runs", body)

    def cancel_run(self, run_id: int) -> Json:
        return self._post(f"/runs/{run_id}/cancel", None)

    def targets(self) -> list[Json]:
        """Where jobs may run: name, kind, available, detail (free CPUs/GPUs, or why unavailable)."""
        return self._get("/targets")

    def run_logs(self, run_id: int, tail: int = 100) -> Json:
        """The last ``tail`` lines of a job's output (``lines``), wherever it runs."""
        return self._get(f"/runs/{run_id}/logs", tail=tail)

    def compare_runs(
        self, run_ids: list[int], keys: list[str] | None = None, agg: Agg = "last", step: int | None = None,
        max_points: int | None = None,
    ) -> Json:
        """Runs side by side: a table of one value per (run, key) and each series, downsampled to
        ``max_points`` (the server's default 2000) like `run_metrics`."""
        body = {"run_ids": list(run_ids), "keys": keys, "agg": agg, "step": step,
                **({} if max_points is None else {"max_points": max_points})}
        return self._post("/runs/compare", body)

    def windows_diff(self, a: Json, b: Json) -> Json:
        """Diff two plan references: ``{"run_id", "step"}``, ``{"model_id"}`` or ``{"windows": plan}``."""
        return self._post("/windows/diff", {"a": a, "b": b})

    # -- saved views ---------------------------------------------------------------------------------
    def views(self) -> list[Json]:
        return self._get("/views")

    def view(self, view_id: int) -> Json:
        return self._get(f"/views/{view_id}")

    def create_view(self, name: str, page: str, state: Json) -> Json:
        return self._post("/views", {"name": name, "page": page, "state": state})

    def rename_view(self, view_id: int, name: str) -> Json:
        return self._request("PATCH", f"/views/{view_id}", json={"name": name})

    def order_views(self, ids: list[int]) -> list[Json]:
        return self._request("PUT", "/views/order", json={"ids": ids})

    def delete_view(self, view_id: int) -> None:
        self._request("DELETE", f"/views/{view_id}")
