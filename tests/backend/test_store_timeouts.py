"""PostgreSQL timeouts (issue 21 item 5): a statement that waits past AAH_DB_STATEMENT_TIMEOUT_S (here on
a lock another client holds) and a connection the server does not answer within AAH_DB_CONNECT_TIMEOUT_S
are cancelled, and the request answers 503 with Retry-After instead of waiting for ever."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from backend.app import create_app
from backend.schemas.errors import store_fault
from backend.store.db import make_engine
from backend.store.migrate import upgrade
from tests.backend.conftest import make_settings

API = "/api/v1"


def test_a_statement_past_the_timeout_answers_503(postgres, tmp_path):
    url = postgres.new_database()
    settings = make_settings(tmp_path, None, database_url=url, db_statement_timeout_s=0.5, seed_suite=False)
    with TestClient(create_app(settings)) as client:
        run_id = client.get(f"{API}/runs").json()[0]["id"]  # a paper run (seeded)
        schema = url.rsplit("%3D", 1)[1]
        with psycopg.connect(host=str(postgres.socket_dir), port=5432, user="postgres", dbname="postgres") as other:
            other.execute(f"LOCK TABLE {schema}.runs IN ACCESS EXCLUSIVE MODE")  # held until this block ends
            t0 = time.monotonic()
            r = client.get(f"{API}/runs/{run_id}")
            waited = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert "took too long" in r.json()["detail"] and int(r.headers["retry-after"]) > 0
        assert waited < 30  # cancelled by the timeout, not released by the lock's end
        assert client.get(f"{API}/runs/{run_id}").status_code == 200  # and the store works again


def test_migrations_have_no_statement_timeout(postgres):
    """A migration may rewrite a large table: the API's statement timeout does not apply to it (1 ms here,
    shorter than creating the store's tables takes)."""
    url = postgres.new_database()
    engine = make_engine(url, statement_timeout_s=0.001)
    upgrade(engine)
    engine.dispose()
    plain = make_engine(url)
    with plain.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
    plain.dispose()


def test_a_server_that_does_not_answer_a_connection_is_a_store_fault(postgres):
    engine = make_engine(postgres.new_database(), connect_timeout_s=2)
    postmaster = int((postgres.data / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGSTOP)  # accepts on its socket, never answers
    try:
        with pytest.raises(OperationalError) as caught:
            with engine.connect():
                pass
    finally:
        os.kill(postmaster, signal.SIGCONT)
        engine.dispose()
    reason, wait = store_fault(caught.value)
    assert "did not answer in time" in reason and wait > 0
