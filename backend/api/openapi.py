"""OpenAPI as the service really behaves: errors are ``{"detail": str}`` (not FastAPI's list), and
when the server has a token (AAH_API_TOKEN) the mutating operations require it: ``security:
[{bearerAuth: []}]``, with no anonymous alternative. Without a token nothing requires auth, and the
spec says so by carrying no security requirement (and no 401) at all."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

MUTATING = ("post", "put", "patch", "delete")
ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {"type": "string", "description": "what went wrong, naming the field"},
        "errors": {"type": "array", "items": {"type": "object"}, "description": "validation errors (422 only)"},
    },
}
ERROR_STATUSES = {
    "400": "The Host header is not in AAH_ALLOWED_HOSTS, or the body is not parseable JSON",
    "401": "Missing or wrong bearer token (only when AAH_API_TOKEN is set)",
    "403": "A write from another site's page (Origin / Sec-Fetch-Site), or a tracking write without the run's "
           "write secret",
    "404": "Unknown id",
    "409": "Conflict (e.g. cancelling a run that already ended)",
    "413": "Request body larger than AAH_MAX_BODY_BYTES",
    "422": "Validation error; detail names the field",
    "503": "Not available now (job cap reached, model cannot be loaded, store locked or full: see Retry-After)",
}


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = spec.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        schemas["Error"] = ERROR_SCHEMA
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        secured = app.state.settings.token() is not None
        if secured:
            components.setdefault("securitySchemes", {})["bearerAuth"] = {
                "type": "http", "scheme": "bearer", "description": "the server's AAH_API_TOKEN"}
        for path_item in spec.get("paths", {}).values():
            for method, op in path_item.items():
                responses = op.setdefault("responses", {})
                for status, description in ERROR_STATUSES.items():
                    if status == "401" and not (secured and method in MUTATING):
                        continue
                    if status in ("403", "413") and method not in MUTATING:
                        continue
                    responses[status] = _error_response(description)
                if secured and method in MUTATING:
                    op["security"] = [{"bearerAuth": []}]
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
