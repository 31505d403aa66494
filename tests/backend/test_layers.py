"""The service's folders stack one way (docs/layout.md): a sub-package imports only the floors below it,
never a sibling on its own floor, and never a private name from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import backend

BACKEND = Path(backend.__file__).resolve().parent
# Top to bottom. Packages on one floor do not import each other. `backend` itself (the version) is
# below everything.
FLOORS: list[set[str]] = [
    {"backend.app"},
    {"backend.routers"},
    {"backend.api"},
    {"backend.services"},
    {"backend.jobs", "backend.seed", "backend.migrations"},
    {"backend.settings"},
    {"backend.store"},
    {"backend.schemas"},
]
FILES = sorted(BACKEND.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = ("backend", *path.relative_to(BACKEND).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str | None:
    """The floor entry (`backend.store`, `backend.app`) a backend module belongs to; None for `backend`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def floor(entry: str) -> int:
    return next(i for i, units in enumerate(FLOORS) if entry in units)


def imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of a backend module, at any depth (typing-only ones too)."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.startswith("backend")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("backend"):
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def violations(module: str, source: str) -> list[str]:
    own = unit(module)
    bad = []
    for target, names in imports(source):
        # `from backend.store import run_store` imports the module backend.store.run_store
        targets = [f"{target}.{n}" if target.count(".") == 1 and target != "backend.settings" else target
                   for n in names] or [target]
        for name in targets:
            other = unit(name)
            if other is None or other == own:
                continue
            if floor(other) <= floor(own):
                bad.append(f"{module} imports {name} ({'a sibling' if floor(other) == floor(own) else 'a floor above'})")
        bad += [f"{module} takes the private {n} from {target}" for n in names
                if n.startswith("_") and not n.startswith("__")]
    return bad


def test_every_backend_module_sits_on_a_floor() -> None:
    entries = {unit(module_name(p)) for p in FILES} - {None}
    assert entries == set().union(*FLOORS), "a new sub-package needs a floor in FLOORS and docs/layout.md"


def test_the_checker_sees_upward_sibling_and_private_imports() -> None:
    assert violations("backend.store.run_store", "from backend.services import registry\n") == [
        "backend.store.run_store imports backend.services.registry (a floor above)"]
    assert violations("backend.jobs.worker", "def f():\n    import backend.seed.demo\n") == [
        "backend.jobs.worker imports backend.seed.demo (a sibling)"]
    assert violations("backend.store.metric_store", "from backend.store.run_store import _upsert\n") == [
        "backend.store.metric_store takes the private _upsert from backend.store.run_store"]
    assert violations("backend.routers.runs", "from backend.store import run_store\nfrom backend import __version__\n") == []


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(BACKEND)) for p in FILES])
def test_imports_go_down_the_floors(path: Path) -> None:
    assert violations(module_name(path), path.read_text()) == []


@pytest.mark.parametrize("package", sorted(set().union(*FLOORS) - {"backend.app", "backend.settings"}))
def test_each_sub_package_says_what_it_owns(package: str) -> None:
    init = BACKEND / package.split(".")[1] / "__init__.py"
    assert len(ast.get_docstring(ast.parse(init.read_text())) or "") > 40, f"{init} needs a docstring"
