"""Backend fixtures: a tiny trained checkpoint laid out like the shipped demo, and apps on temp stores."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from aah_core.checkpoint import load_checkpoint, save_checkpoint
from aah_core.config import apply_overrides
from aah_core.presets import get_preset
from aah_core.train import JsonlSink, train
from aah_core.windows import validate_plan
from backend.app import create_app
from backend.settings import Settings
from backend.store.db import make_engine, make_session_factory
from backend.store.migrate import alembic_config, upgrade
from tests.conftest import DATABASES, database_url

TINY_PLAN = [[4, None], [16, 8]]  # a non-trivial own plan: 2 layers x 2 heads, seq_len 64


OLD_EXPERIMENT = "INSERT INTO experiments (id, name, read_only, created_at) VALUES (1, 'e', false, 0)"


def old_store(url: str, revision: str, *inserts: str) -> Engine:
    """A store migrated only up to `revision`, holding the rows of `inserts`: SQL of that revision's
    schema (today's ORM models have columns the old tables lack)."""
    engine = make_engine(url)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        for sql in inserts:
            conn.execute(text(sql))
    return engine


@pytest.fixture(scope="module", params=DATABASES)
def module_sessions(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    ) -> Iterator[sessionmaker[Session]]:
    """One migrated store per test module and database (SQLite, PostgreSQL), for tests that make their
    own runs."""
    engine = make_engine(database_url(request, tmp_path_factory.mktemp("store")))
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer model trained for 2 steps, saved with TINY_PLAN plus its history, as data/demo is."""
    root = tmp_path_factory.mktemp("tiny-demo")
    config = apply_overrides(get_preset("tiny"), {"train.max_steps": 2, "train.eval_every": 2})
    train(config, root / "trained", [JsonlSink(root / "history.jsonl")])
    ckpt = load_checkpoint(root / "trained")
    plan = validate_plan(TINY_PLAN, 2, 2, config.model.seq_len)
    ckpt.model.set_plan(plan)
    save_checkpoint(root / "demo", ckpt.model, ckpt.config, plan=plan, meta=ckpt.meta)
    shutil.copy(root / "history.jsonl", root / "demo" / "history.jsonl")
    return root / "demo"


def make_settings(data_dir: Path, demo_dir: Path | None, **overrides: object) -> Settings:
    """Settings on a temp data dir; the shipped suites are left out unless a test passes `suite_files`."""
    return Settings(data_dir=data_dir, demo_dir=demo_dir, **{"suite_files": [], **overrides})


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           tiny_demo: Path) -> Iterator[TestClient]:
    """A module-wide app on its own temp store, seeded with the tiny demo and the paper tables.

    The store is SQLite unless a module parametrizes this fixture over ``tests.conftest.DATABASES``.
    """
    data_dir = tmp_path_factory.mktemp("data")
    settings = make_settings(data_dir, tiny_demo, database_url=database_url(request, data_dir))
    with TestClient(create_app(settings)) as c:
        yield c
