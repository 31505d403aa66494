"""The engine knows nothing of web servers, databases or the dashboard (ARCHITECTURE.md: one-way house)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aah_core

ENGINE = Path(aah_core.__file__).resolve().parent
FORBIDDEN = {"fastapi", "sqlalchemy", "alembic", "streamlit", "uvicorn", "httpx", "starlette",
             "backend", "frontend", "aah_client", "aah_launcher", "aah_tracking"}


def imported_modules(source: str) -> set[str]:
    """Top-level names of every module a source file imports (relative imports excluded)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_the_scanner_sees_imports_at_any_depth() -> None:
    source = "import os\ndef f():\n    from fastapi import APIRouter\n    import sqlalchemy.orm as orm\n"
    assert imported_modules(source) == {"os", "fastapi", "sqlalchemy"}


ENGINE_FILES = sorted(ENGINE.rglob("*.py"))


@pytest.mark.parametrize("path", ENGINE_FILES, ids=[str(p.relative_to(ENGINE)) for p in ENGINE_FILES])
def test_engine_module_imports_no_web_or_database_code(path: Path) -> None:
    bad = imported_modules(path.read_text()) & FORBIDDEN
    assert not bad, f"aah_core/{path.relative_to(ENGINE)} imports {sorted(bad)}; keep web code out of the engine"


def test_the_process_supervisor_lives_outside_the_engine() -> None:
    assert not (ENGINE / "serve.py").exists()
    assert len(ENGINE_FILES) > 20  # the scan found the engine's modules


def engine_imports(source: str, module: str, known: set[str]) -> set[str]:
    """Modules of `known` that `module` (its source given) imports outside functions, with their packages
    (importing a.b.c runs a/__init__ and a/b/__init__ first) except the module's own, which are importing
    already, unless it names them. Imports under TYPE_CHECKING count: a circle only for the type checker
    is still a circle a reader has to untangle."""
    tree = ast.parse(source)
    deferred = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in deferred:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    own = module.split(".")
    ancestors = {".".join(own[:i]) for i in range(1, len(own))}  # already importing when this file runs
    targets = set(names)
    for name in names:
        parts = name.split(".")
        targets.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return (targets - (ancestors - names)) & known


def _module_name(path: Path) -> str:
    parts = ("aah_core", *path.relative_to(ENGINE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports) as a path, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_circle_only_for_the_type_checker_is_a_cycle() -> None:
    known = {"aah_core", "aah_core.a", "aah_core.b"}
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from aah_core.b import B\n"
    b = "from aah_core.a import A\ndef f():\n    import aah_core.c\n"
    graph = {"aah_core.a": engine_imports(a, "aah_core.a", known), "aah_core.b": engine_imports(b, "aah_core.b", known)}
    assert graph == {"aah_core.a": {"aah_core.b"}, "aah_core.b": {"aah_core.a"}}  # function bodies do not count
    assert find_cycle(graph) == ["aah_core.a", "aah_core.b", "aah_core.a"]


def test_no_engine_modules_import_each_other() -> None:
    """A cycle (presets.py registering variants that import presets) works or breaks by which module a
    program happens to import first; registration is data in presets.py instead. Imports for typing
    count too (config.py and controller_config.py both take ModelConfig from model_config.py)."""
    modules = {_module_name(p) for p in ENGINE_FILES}
    graph = {_module_name(p): engine_imports(p.read_text(), _module_name(p), modules) - {_module_name(p)}
             for p in ENGINE_FILES}
    assert "aah_core.presets" in graph["aah_core.suite"]  # the scan sees real edges
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


@pytest.mark.parametrize("first", ["aah_core.controller.per_layer", "aah_core.presets"])
def test_every_preset_is_there_whichever_module_is_imported_first(first: str) -> None:
    code = (f"import {first}\nfrom aah_core.presets import PRESETS, get_preset\n"
            "from aah_core.controller import build_controller\nfrom aah_core.model import WindowedGPT\n"
            "cfg = get_preset('static_per_layer')\nbuild_controller(cfg, WindowedGPT(cfg.model))\n"
            "print(' '.join(sorted(PRESETS)))")
    env = {**os.environ, "PYTHONPATH": str(ENGINE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"baseline", "full_adaptive", "static_per_layer", "learned_budget", "tiny"} <= set(out.stdout.split())
