"""Run the Alembic migrations shipped in ``backend/migrations`` (``upgrade head``)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest schema (a no-op when it is already there)."""
    migrate(engine, "head")
    logger.info("store schema at head")


def migrate(engine: Engine, target: str, down: bool = False) -> None:
    """Upgrade (or downgrade) the database to revision `target`, keeping every row, in one transaction.

    SQLite rebuilds a table to alter it (drop + copy). With foreign keys on, dropping ``runs``
    would cascade into params and metrics and silently delete them, so on SQLite the migrations
    run with foreign keys off (the pragma only takes effect outside a transaction), and the
    transaction is rolled back if ``foreign_key_check`` finds any dangling reference afterwards.
    PostgreSQL alters tables in place and its DDL is transactional: nothing else is needed.
    """
    config = alembic_config()
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()  # end SQLAlchemy's autobegun transaction (the driver never opened one)
        try:
            with conn.begin():
                if not sqlite:  # a migration may rewrite a large table: longer than any request may take
                    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                config.attributes["connection"] = conn
                (command.downgrade if down else command.upgrade)(config, target)
                dangling = conn.exec_driver_sql("PRAGMA foreign_key_check").all() if sqlite else []
                if dangling:
                    raise RuntimeError(f"migration left dangling references {dangling[:5]}; rolled back")
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()
