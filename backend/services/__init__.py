"""What the service does with models and jobs: the model registry and its cache, live analysis and
inference, the job manager and its worker processes, tracking writes, the bounded executors.

May import: jobs, seed, migrations, settings, store, schemas (never api, routers or app).
"""
