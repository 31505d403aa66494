import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from backend.store.db import sqlite_url
from tests.postgres import PostgresServer, find_bin_dir

DATABASES = ("sqlite", "postgresql")
# FastAPI's TestClient and schemathesis send "Host: testserver": the in-process apps of the tests
# answer to it too (set before any test module builds an app; the Host check itself is tested
# against a real server in tests/backend/test_host_header.py, without this name).
os.environ.setdefault("AAH_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")


@pytest.fixture(autouse=True)
def _restore_torch_defaults():
    """Tests may switch the default dtype or seed; put both back afterwards."""
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


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
    return sqlite_url(tmp_dir / "aah.db")


@pytest.fixture(params=DATABASES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store on each database (function scope)."""
    return database_url(request, tmp_path)
