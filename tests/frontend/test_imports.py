"""The dashboard's modules are imported by their names, so `groups.` means the same module in every page."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import frontend

FILES = sorted(Path(frontend.__file__).resolve().parent.rglob("*.py"))


def aliased_frontend_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                if full.startswith("frontend") and alias.asname and alias.asname != alias.name:
                    found.append(f"{full} as {alias.asname}")
    return found


def test_the_check_sees_an_alias() -> None:
    assert aliased_frontend_imports("from frontend import groups as G\nimport frontend.plans as P\n") == [
        "frontend.groups as G", "frontend.plans as P"]
    assert aliased_frontend_imports("from frontend import groups\nimport numpy as np\n") == []


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_frontend_modules_are_imported_by_name(path: Path) -> None:
    assert aliased_frontend_imports(path.read_text()) == []
