import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import PostgresServer, find_bin_dir

DATABASES = ("sqlite", "postgresql")


def _one_default_ssl_context() -> None:
    """Every httpx client builds an SSL context and loads certifi's CA bundle into it: 21 ms of CPU for each
    `httpx.get(...)`, against 0.5 ms for the request itself to a loopback server. Tests poll servers with
    such calls (a job's progress every 0.1 s, a server's health while it starts), taking that CPU from the
    servers and workers they wait on. The test process builds the default context once (these tests speak
    plain HTTP to loopback; a client given its own `verify` or `cert` still gets a context of its own)."""
    import httpx._transports.default as transports

    build = transports.create_ssl_context
    shared = build()

    def create_ssl_context(verify: object = True, cert: object = None, trust_env: bool = True) -> object:
        if verify is True and cert is None and trust_env:
            return shared
        return build(verify=verify, cert=cert, trust_env=trust_env)

    transports.create_ssl_context = create_ssl_context


_one_default_ssl_context()

# OpenMP threads sleep at barriers instead of spinning, in the test processes and everything they start (set
# before anything imports torch). `make test` exports this (Makefile); a plain `pytest` did not, and with two
# xdist workers on two cores a thread spinning for a descheduled peer held the other worker's core: the whole
# suite took 960 s and 1,229 s of user CPU that way, against 555 s and 653 s under `make pytest` (2-core box).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# FastAPI's TestClient and schemathesis send "Host: testserver": the in-process apps of the tests
# answer to it too (set before any test module builds an app; the Host check itself is tested
# against a real server in tests/backend/test_host_header.py, without this name).
os.environ.setdefault("AAH_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")


# Test files that share one machine-wide resource, by node-id prefix. Under pytest-xdist (`make test` runs
# two workers) each group runs whole on one worker: the browser tests share one API, dashboard and Chromium
# (tests/frontend/conftest.py), the cluster tests one Ray head and one Slurm (tests/clusters/conftest.py). The
# files whose tests compile FlexAttention on CPU share one process: its first compile also pays Inductor's
# warm-up (imports, C++ ISA probes: measured 55 s for their three compiles in three processes, 49 s in one).
FLEX = ("tests/core/test_attention_flex.py", "tests/core/test_attention_sinks.py", "tests/core/test_model.py")
SHARED_RESOURCES = {"tests/frontend/test_browser": "browser", "tests/clusters/": "clusters",
                    **dict.fromkeys(FLEX, "flex")}


# Measured cost of the long scopes, in worker-seconds of `make test` on the 2-core box (the per-test durations of
# one whole run summed by scope: 1,383 s in all, two workers; the relative sizes are what count). The scheduler
# hands out the costliest scope left first (longest-processing-time first): ordered by their number of tests
# instead, the scopes of a few long tests (tracking, ship, ddp) came last and one worker finished alone. A scope
# not listed is estimated from its number of tests.
SCOPE_COST_S = {
    "browser": 384, "clusters": 163, "tests/backend/test_fuzz.py": 120, "flex": 78, "tests/tracking/test_tracking.py": 56,
    "tests/backend/test_suite_seed.py": 45, "tests/ship/test_serve.py": 32, "tests/core/test_suite.py": 31,
    "tests/backend/test_hostile_models.py": 31, "tests/backend/test_write_authority.py": 29,
    "tests/backend/test_bounded_reads.py": 23, "tests/backend/test_worker_lifecycle.py": 21,
    "tests/backend/test_final_checkpoint.py": 18, "tests/backend/test_server_faults.py": 18,
    "tests/core/test_presets.py": 17, "tests/frontend/test_pages.py": 17, "tests/backend/test_upload_faults.py": 17,
    "tests/ship/test_wheel.py": 15, "tests/backend/test_jobs.py": 15, "tests/backend/test_storage_faults.py": 14,
    "tests/ship/test_gpu_check.py": 13, "tests/core/test_suite_merge.py": 13, "tests/hf/test_serving_export.py": 13,
    "tests/core/test_checkpoint_train.py": 12, "tests/frontend/test_view_audit.py": 12}
UNLISTED_TEST_S = 0.2  # the mean test of the scopes not listed


def scope_cost(scope: str, n_tests: int) -> float:
    """The expected worker-seconds of a scope: measured (SCOPE_COST_S), else estimated from its test count."""
    return SCOPE_COST_S.get(scope, UNLISTED_TEST_S * n_tests)


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test is sent to a worker in: its shared-resource group, else its module (so that
    the module's own fixtures, its servers and stores, start once)."""
    return next((group for prefix, group in SHARED_RESOURCES.items() if nodeid.startswith(prefix)),
                nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis 4.32's items (one per API operation, tests/backend/test_fuzz.py) all carry their function's
    node id under pytest 9, so pytest-xdist, which sends tests to workers by node id, ran one of each: each
    gets its own name's id (private pytest API: Node._id, a NodeId; imported only there, since older pytests,
    such as the GPU machine's, have no _pytest.nodeid)."""
    for item in items:
        if item.name.endswith("]") and not item.nodeid.endswith("]"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid.rpartition('::')[0]}::{item.name}")
    shared = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if shared:  # fail loudly rather than let two workers run one test of each such id
        raise pytest.UsageError(f"tests share a node id (pytest-xdist would run one of them): {shared[:5]}")


def scope_scheduler() -> type:
    """pytest-xdist's load-by-scope scheduler, with xdist_scope as the scope and the costliest scope left sent
    first (scope_cost). The xdist_group mark cannot do this: pytest-xdist 3.8 renames node ids for it, which
    pytest 9 ignores."""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node: object) -> None:  # the base class sends the queue's first unit
            costliest = max(self.workqueue, key=lambda scope: scope_cost(scope, len(self.workqueue[scope])))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

    return ByScope


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return scope_scheduler()(config, log)


@pytest.fixture(autouse=True)
def _restore_torch_defaults():
    """Tests may switch the default dtype; put it back afterwards. torch is imported by the tests that use it,
    not here: a pytest process whose tests need none (the nested `make pytest` of tests/ship/test_make_test.py)
    does not import it (~2 s of CPU)."""
    loaded = sys.modules.get("torch")
    dtype = loaded.get_default_dtype() if loaded is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_default_dtype(dtype if dtype is not None else torch.float32)  # float32: torch's own default


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session (see tests/postgres.py)."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian package `postgresql`, which `make test` installs "
                    "when run as root): the PostgreSQL variants of the store tests are skipped")
    server = PostgresServer(bin_dir)
    yield server
    server.stop()


def database_url(request: pytest.FixtureRequest, tmp_dir: Path) -> str:
    """The store URL for the test's database parameter ("sqlite", the default, or "postgresql")."""
    if getattr(request, "param", "sqlite") == "postgresql":
        return request.getfixturevalue("postgres").new_database()
    # imported here, so that the engine's tests run where the service's packages are not (the GPU machine)
    from backend.store.db import sqlite_url

    return sqlite_url(tmp_dir / "aah.db")


@pytest.fixture(params=DATABASES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store on each database (function scope)."""
    return database_url(request, tmp_path)
