"""The FastAPI app: ``create_app(settings)`` plus a lifespan that opens the store, migrates it,
reconciles runs with their workers, seeds first-start content and starts the model registry and the
job manager. ``python -m uvicorn backend.app:app`` serves the module-level ``app``."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.telemetry import TelemetryConfig
from sqlalchemy.exc import DBAPIError

from aah_core.paths import library_caches
from aah_core.process import keep_freed_memory
from backend import __version__
from backend.api import preflight
from backend.api.deps import require_plain_params, require_token
from backend.api.errors import install_error_handlers
from backend.api.middleware import BodySizeLimit, HostCheck, OriginCheck
from backend.api.openapi import install_openapi
from backend.routers import groups, health, models, presets, runs, targets, tracking, views, windows
from backend.seed.demo import seed_demo
from backend.seed.first_start import first_start_lock
from backend.seed.paper import seed_paper_reference
from backend.seed.suite import seed_suite
from backend.services import analysis
from backend.services.cache import LruCache
from backend.services.executor import BoundedExecutor
from backend.services.jobs import JobManager
from backend.services.registry import Registry
from backend.services.target_jobs import TargetJobs
from backend.services.targets import build_targets
from backend.settings import Settings
from backend.store import migrate
from backend.store.db import make_engine, make_session_factory, transaction

logger = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
# FastAPI records OpenTelemetry spans and metrics of every request once any library in the process sets a
# global provider, and exports them where FASTAPI_OTEL_AUTO_CONFIGURE and OTEL_* say: the studio sends none
TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                                  "auto_configure": False}
METRICS_CACHE_ITEMS = 256  # serialised metric responses kept, within AAH_CACHE_BYTES
# The garbage collector while serving: a first-generation pass every 50,000 new container objects
# instead of 700 (a 9,000-point metric batch makes ~40,000, which ran ~60 passes and promoted them all).
GC_THRESHOLDS = (50_000, 20, 10)


@contextmanager
def serving_gc() -> Iterator[None]:
    """Garbage collection tuned for serving, put back as it was on exit.

    What startup made (torch, the models, the ORM: ~400 k objects) lives as long as the service: frozen,
    a full collection no longer walks it (gen-2 pauses of 300-880 ms while 50 clients polled, 5-13 ms
    frozen). Unfrozen on exit (before the models are closed), so whatever of it has become garbage is
    collected then. With GC_THRESHOLDS too, the collector's time over 30 metric batches on PostgreSQL
    went from 0.82 s (one full pass) to 0.01 s.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    preflight.check(settings)
    os.environ.update(library_caches(settings.data_dir))  # this process and its workers write nothing outside it
    keep_freed_memory()  # evaluations reuse memory instead of faulting it in again (aah_core/process.py)
    with first_start_lock(settings.data_dir):  # a second server started at once waits, then finds it all done
        try:
            engine = make_engine(settings.db_url, connect_timeout_s=settings.db_connect_timeout_s,
                                 statement_timeout_s=settings.db_statement_timeout_s)
            migrate.upgrade(engine)
        except (DBAPIError, OSError) as exc:
            raise preflight.store_error(settings, exc) from None
        sessions = make_session_factory(engine)
        app.state.jobs = JobManager(settings, sessions)
        app.state.jobs.start_reconciling()  # runs a previous server left active, and their stray workers
        app.state.target_jobs = TargetJobs(settings, sessions, app.state.jobs, build_targets(settings))
        app.state.target_jobs.start_polling()  # re-attach to the jobs on cluster targets (they kept running)
        if settings.seed_paper:
            with transaction(sessions) as s:
                seed_paper_reference(s)
        if settings.seed_demo:
            with transaction(sessions) as s:
                seed_demo(s, settings)
        if settings.seed_suite:
            with transaction(sessions) as s:
                seed_suite(s, settings)
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    app.state.sessions = sessions
    app.state.registry = Registry(settings, sessions)
    # (version, body) per query: bounded by the bodies' bytes too (AAH_CACHE_BYTES)
    app.state.metrics_cache = LruCache(METRICS_CACHE_ITEMS, settings.cache_bytes, lambda hit: len(hit[1]))
    app.state.heavy = BoundedExecutor("heavy", settings.heavy_workers, settings.heavy_queue)
    app.state.reads = BoundedExecutor("read", settings.read_workers, settings.read_queue)
    # cheap checks (has this run's data changed?), shared by concurrent pollers of one run and never
    # queued behind the reads above
    app.state.checks = BoundedExecutor("check", 2, 10_000)
    app.state.store_counts = health.StoreCounts(sessions)
    await app.state.store_counts.get()  # read now, while the store is known to answer: /health never waits for it
    if settings.preload_models:
        loaded = app.state.registry.preload()
        if settings.warm_up:  # before the server answers /health: `aah serve` prints the address after it
            analysis.warm_up(app.state.registry, loaded)
    logger.info("AAH Studio API %s ready (data dir %s)", __version__, settings.data_dir)
    try:
        with serving_gc():
            yield
    finally:
        app.state.target_jobs.shutdown()
        app.state.jobs.shutdown()
        app.state.heavy.shutdown()
        app.state.reads.shutdown()
        app.state.checks.shutdown()
        app.state.registry.close()
        engine.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="AAH Studio API",
        version=__version__,
        description="Per-head context allocation: models, window plans, live evaluation, attention "
        "heatmaps, runs and training jobs. Contract: docs/api.md.",
        lifespan=lifespan,
        telemetry=TELEMETRY_OFF,
        # Checks for every route: POST/PUT/PATCH/DELETE need the bearer token when one is set; no path or
        # query parameter holds a control character.
        dependencies=[Depends(require_token), Depends(require_plain_params)],
    )
    app.state.settings = settings
    install_error_handlers(app)
    install_openapi(app)
    # groups before runs: /runs/groups would otherwise reach /runs/{run_id}
    for router in (health.router, models.router, presets.router, targets.router, groups.router, runs.router,
                   tracking.router, views.router, windows.router):
        app.include_router(router, prefix=API_PREFIX)
    app.add_middleware(CORSMiddleware, allow_origins=settings.ui_origins, allow_credentials=False,
                       allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(preflight.OneLineStartupErrors)  # lifespan only: a storage fault in one line
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, streamed=tracking.UPLOAD_PATH)
    app.add_middleware(OriginCheck)  # writes sent by another site's page: 403, token or not
    app.add_middleware(HostCheck)  # outermost: a foreign Host gets nothing, not even CORS headers
    return app


app = create_app()
