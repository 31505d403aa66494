"""The run store: engine and sessions (db.py), ORM tables (tables.py), runs, plans and checkpoints
(run_store.py), metric points and their rollups (metric_store.py, rollups.py), downsampled reads
(downsample.py), groups, saved views and registered models (catalog.py), run identity, and migrating
to the newest revision (migrate.py). Functions take a Session; the caller owns the commit.

May import: schemas only (and the engine's plan codec).
"""
