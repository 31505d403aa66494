"""A training job's own process and what it writes: the worker entry point
(``python -m backend.jobs.worker``), its metrics sink, the disk spool for writes the store refused, and the
worker's side of its life (dying with its server).

May import: settings, store, schemas (never services; the server's side lives in services/workers.py).
"""
