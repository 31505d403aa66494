"""The engine knows nothing of web servers, databases or the dashboard (ARCHITECTURE.md: one-way house)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aah_core

ENGINE = Path(aah_core.__file__).resolve().parent
FORBIDDEN = {"fastapi", "sqlalchemy", "alembic", "streamlit", "uvicorn", "httpx", "starlette",
             "backend", "frontend", "aah_client", "aah_launcher"}


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
