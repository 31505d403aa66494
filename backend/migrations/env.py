"""Alembic environment. The service calls ``backend.store.migrate.upgrade`` at startup, which
passes its own connection; the ``alembic`` CLI (``alembic -c backend/alembic.ini``) builds
an engine from ``AAH_DATABASE_URL`` (default: ``aah.db`` in ``AAH_DATA_DIR``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from backend.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from backend.settings import Settings
    from backend.store.db import make_engine

    engine = make_engine(Settings().db_url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
