"""One FastAPI router per resource (health, models, presets, runs, groups, tracking, views, windows).
Handlers stay thin: they validate through schemas and call services or the store.

May import every floor below: api, services, jobs, seed, settings, store, schemas.
"""
