"""The pytest-xdist schedule of `make test` (tests/conftest.py): tests that share a resource go to one worker,
and the costliest scope left is sent first."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from tests.conftest import SCOPE_COST_S, SHARED_RESOURCES, scope_cost, scope_scheduler, xdist_scope

ROOT = Path(__file__).resolve().parents[1]


def test_every_measured_scope_exists() -> None:
    """A renamed or removed test file leaves no stale cost behind (its scope would fall back to its count)."""
    groups = set(SHARED_RESOURCES.values())
    assert [scope for scope in SCOPE_COST_S if scope not in groups and not (ROOT / scope).is_file()] == []


def test_scopes_group_shared_resources_and_modules() -> None:
    assert xdist_scope("tests/frontend/test_browser_clicks.py::test_x") == "browser"
    assert xdist_scope("tests/clusters/test_slurmrestd.py::test_x[a]") == "clusters"
    assert xdist_scope("tests/core/test_model.py::test_x") == "flex"
    assert xdist_scope("tests/core/test_windows.py::test_x[1-2]") == "tests/core/test_windows.py"
    assert scope_cost("browser", 1) == SCOPE_COST_S["browser"] and scope_cost("tests/new.py", 10) > scope_cost("tests/new.py", 1)


class _Node:
    shutting_down = False

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)


def test_the_costliest_scope_left_is_sent_first() -> None:
    ids = ["tests/a.py::t1", "tests/a.py::t2", "tests/a.py::t3",  # unlisted: 3 tests of the mean cost
           "tests/core/test_presets.py::t", "tests/frontend/test_browser.py::t", "tests/b.py::t"]
    # pytest-xdist's own __init__ wants a whole config; the queue and the bookkeeping it reads are set here
    scheduler = object.__new__(scope_scheduler())
    scheduler.workqueue = OrderedDict()
    for nodeid in ids:
        scheduler.workqueue.setdefault(xdist_scope(nodeid), {})[nodeid] = False
    node = _Node()
    scheduler.assigned_work, scheduler.registered_collections = {}, {node: ids}
    while scheduler.workqueue:
        scheduler._assign_work_unit(node)
    assert list(scheduler.assigned_work[node]) == ["browser", "tests/core/test_presets.py", "tests/a.py", "tests/b.py"]
    assert node.sent == [[4], [3], [0, 1, 2], [5]]
