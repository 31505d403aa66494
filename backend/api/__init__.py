"""HTTP plumbing under the routers: request middleware (Host, auth, sizes), the timed h11 protocol, FastAPI
dependencies, error responses, the OpenAPI document and start-up preflight checks.

May import: services, jobs, seed, settings, store, schemas (never routers or app).
"""
