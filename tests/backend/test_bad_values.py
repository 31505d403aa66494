"""Bad values are a 422 at the schema on both databases (issue 21 item 5): a NUL or another control
character in any string of any request (body, query or path), and an id outside the signed 32-bit range.

The cases are generated from the app's OpenAPI document, so every endpoint (and every one added later) is
covered: for each operation, each string parameter gets a NUL, each id parameter 2**31, and a body built
from the request schema (every property filled, each union branch in turn) gets a NUL at each of its
strings and dictionary keys, and 2**31 at each of its ids, one place at a time. PostgreSQL refuses NUL in
text and ids above int4 with an error of its own (500 before this check); SQLite stored them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from tests.backend.conftest import make_settings
from tests.conftest import DATABASES, database_url

NUL = "\x00"
BIG_ID = 2**31
# path parameters that exist in the seeded store (a bad value elsewhere must be refused before any lookup)
PATH_VALUES = {"model_id": "demo", "run_id": 1, "view_id": 1, "name": "config.json"}
SCHEMA_REFUSALS = {"control_character", "string_pattern_mismatch", "literal_error", "enum"}
Where = tuple[str | int, ...]


@pytest.fixture(scope="module", params=DATABASES)
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_demo) -> Iterator[TestClient]:
    data_dir = tmp_path_factory.mktemp("bad-values")
    settings = make_settings(data_dir, tiny_demo, database_url=database_url(request, data_dir), max_jobs=0)
    with TestClient(create_app(settings)) as c:
        yield c


def _resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _string(schema: dict) -> str:
    pattern = schema.get("pattern")
    for candidate in ("abcdefgh1", "own", "x" * max(1, schema.get("minLength", 1)), "a" * 40):
        if pattern is None or re.search(pattern, candidate):
            return candidate
    raise AssertionError(f"no sample string for pattern {pattern!r}")


class Instance:
    """A JSON value for a schema with every property filled; ``choice`` picks the branch of each union
    (by its place in the value); the unions seen are collected in ``unions`` (place -> branch count)."""

    def __init__(self, spec: dict, choice: dict[Where, int]) -> None:
        self.spec, self.choice = spec, choice
        self.unions: dict[Where, int] = {}
        self.strings: list[Where] = []  # places of strings (values)
        self.maps: list[Where] = []  # places of free-key objects (a NUL key is added there)
        self.ids: list[Where] = []  # places of ids (integers named *id / *ids)

    def make(self, schema: dict, where: Where = (), name: str = "") -> Any:
        schema = _resolve(self.spec, schema)
        branches = [b for b in schema.get("anyOf", schema.get("oneOf", [])) if _resolve(self.spec, b).get("type") != "null"]
        if branches:
            self.unions[where] = len(branches)
            return self.make(branches[self.choice.get(where, 0)], where, name)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            props = schema.get("properties", {})
            value = {key: self.make(sub, (*where, key), key) for key, sub in props.items()}
            extra = schema.get("additionalProperties")
            if not props:
                self.maps.append(where)
                if extra is True or isinstance(extra, dict):
                    value["k"] = self.make(extra if isinstance(extra, dict) else {}, (*where, "k"), "k")
            return value
        if kind == "array":
            n = max(1, schema.get("minItems", 1))
            return [self.make(schema.get("items", {}), (*where, i), name) for i in range(n)]
        if kind == "string":
            self.strings.append(where)
            return _string(schema)
        if kind == "integer":
            if re.search(r"(^|_)ids?$", name):
                self.ids.append(where)
            return max(1, schema.get("minimum", 1))
        if kind == "number":
            return 0.5
        if kind == "boolean":
            return False
        self.strings.append(where)  # free JSON (Any): a string is as good a value as any
        return "x"


def _put(value: Any, where: Where, new: Any) -> Any:
    if not where:
        return new
    head, rest = where[0], where[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _put(value[head], rest, new)
    return copy


def _add_key(value: Any, where: Where, key: str) -> Any:
    if not where:
        return {**value, key: value.get("k", "x")}
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[where[0]] = _add_key(value[where[0]], where[1:], key)
    return copy


def bad_bodies(spec: dict, schema: dict) -> Iterator[tuple[str, Any]]:
    """(what was put where, body) for one request schema: each string, map key and id made bad once."""
    first = Instance(spec, {})
    base = first.make(schema)
    variants = [(first, base)]
    for where, n in first.unions.items():
        for branch in range(1, n):
            other = Instance(spec, {where: branch})
            variants.append((other, other.make(schema)))
    for inst, body in variants:
        for where in inst.strings:
            yield f"NUL at {where}", _put(body, where, f"a{NUL}b")
            yield f"ESC at {where}", _put(body, where, "a\x1bb")
        for where in inst.maps:
            yield f"NUL key at {where}", _add_key(body, where, f"k{NUL}")
        for where in inst.ids:
            yield f"2**31 at {where}", _put(body, where, BIG_ID)


def operations(spec: dict) -> Iterator[tuple[str, str, dict]]:
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def _url(path: str, overrides: dict[str, Any]) -> str:
    values = {**PATH_VALUES, **overrides}
    return re.sub(r"\{(\w+)\}", lambda m: quote(str(values[m.group(1)]), safe=""), path)


def _refused_at_the_schema(response) -> None:  # noqa: ANN001
    assert response.status_code == 422, response.text[:500]
    types = {e["type"] for e in response.json().get("errors", [])}
    assert types & (SCHEMA_REFUSALS | {"less_than_equal"}), response.text[:500]


def _sample(spec: dict, schema: dict) -> Any:
    return Instance(spec, {}).make(schema)


def _cases(spec: dict) -> Iterator[tuple[str, str, str, dict]]:
    """(label, method, url, request kwargs) of every bad-value request the spec allows; the rest of each
    request (required query parameters, the body) is well-formed."""
    seen: set[str] = set()
    for label, method, url, kwargs in _all_cases(spec):
        if label not in seen:  # union variants repeat the places they share
            seen.add(label)
            yield label, method, url, kwargs


def _all_cases(spec: dict) -> Iterator[tuple[str, str, str, dict]]:
    for method, path, op in operations(spec):
        params = op.get("parameters", [])
        content = op.get("requestBody", {}).get("content", {}).get("application/json")
        base: dict[str, Any] = {"params": {p["name"]: _sample(spec, p["schema"]) for p in params
                                           if p["in"] == "query" and p.get("required")}}
        if content:
            base["json"] = _sample(spec, content["schema"])
        for param in params:
            schema = _resolve(spec, param["schema"])
            kinds = {_resolve(spec, s).get("type") for s in schema.get("anyOf", [schema])}
            name, where = param["name"], param["in"]
            bad = [f"a{NUL}b"] if "string" in kinds else []
            if "integer" in kinds and re.search(r"(^|_)ids?$", name):
                bad.append(BIG_ID)
            for value in bad:
                label = f"{method} {path} {where} {name}={value!r}"
                if where == "path":
                    yield label, method, _url(path, {name: value}), base
                elif where == "query":
                    yield label, method, _url(path, {}), {**base, "params": {**base["params"], name: value}}
        if content:
            for what, body in bad_bodies(spec, content["schema"]):
                yield f"{method} {path} body {what}", method, _url(path, {}), {**base, "json": body}


def test_cases_cover_every_kind_of_place(client):
    """The generator reaches strings in bodies, queries and paths, free keys and ids (a guard against a
    generator that silently yields nothing)."""
    labels = [label for label, *_ in _cases(client.app.openapi())]
    for kind in ("path model_id=", "path run_id=2147483648", "query experiment=", "body NUL at ('name',)",
                 "body NUL key at ('overrides',)", "body 2**31 at ('run_ids', 0)", "body NUL at ('a', 'model_id')",
                 "body NUL at ('config', 'k')", "body 2**31 at ('ids', 0)"):
        assert any(kind in label for label in labels), kind
    assert len(labels) > 100


def test_control_characters_and_out_of_range_ids_are_a_422(client):
    failures = []
    for label, method, url, kwargs in _cases(client.app.openapi()):
        response = client.request(method, url, **kwargs)
        try:
            _refused_at_the_schema(response)
        except AssertionError as exc:
            failures.append(f"{label}: {exc}")
    assert not failures, f"{len(failures)} bad values not refused at the schema:\n" + "\n".join(failures[:40])
