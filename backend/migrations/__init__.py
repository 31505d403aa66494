"""Alembic migrations of the run store, one linear chain (versions/); env.py wires them to the ORM tables.
``backend.store.migrate.upgrade`` runs them at start-up.

May import: settings, store.
"""
