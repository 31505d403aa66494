"""Service settings: one pydantic-settings object, read from AAH_* environment variables.

Nothing else in the backend reads ``os.environ``; the object built in ``create_app``
reaches the code through ``app.state.settings`` and the dependencies in ``deps.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aah_core.shipped import shipped_data_dir
from backend.store.db import parse_database_url, sqlite_url

# The demo checkpoint shipped with the package (the checkout's data/demo, or the installed copy).
SHIPPED_DEMO_DIR = shipped_data_dir() / "demo"
# The project's reproductions of the paper (aah suite ... --pack): Table 1's rows at the mini scale
# (docs/reproduction-mini.md), and the baselines with passkey retrieval at the long scale (docs/reproduction-long.md).
SHIPPED_SUITES = tuple(shipped_data_dir() / "suite" / f"paper-{scale}.jsonl.gz" for scale in ("mini", "long"))


def _quarter_of_the_cores() -> int:
    return max(1, (os.cpu_count() or 1) // 4)


def _read_threads() -> int:
    # a store read spends part of its time outside Python's lock (in SQLite's C code, or waiting for
    # PostgreSQL), so a second thread overlaps it with the other's Python (README.md, "Computed ranges")
    return max(2, _quarter_of_the_cores())


class Settings(BaseSettings):
    """Everything the service can be told from outside. Env names are AAH_<FIELD>."""

    # hide_input_in_errors: a bad AAH_DATABASE_URL or token must not be echoed into logs
    model_config = SettingsConfigDict(env_prefix="AAH_", extra="ignore", hide_input_in_errors=True)

    data_dir: Path = Field(Path("./data"), description="SQLite store, checkpoints and job outputs live here.")
    database_url: SecretStr | None = Field(
        None,
        description="SQLAlchemy URL of the run store, e.g. postgresql+psycopg://user:pass@host/db. "
        "Default: the SQLite file aah.db in the data dir.",
    )
    db_connect_timeout_s: int = Field(
        10, ge=2, le=3600, description="PostgreSQL: seconds to make a connection before the request gets 503 "
        "(a stalled or unreachable server).")
    db_statement_timeout_s: float = Field(
        60.0, ge=0, le=86_400, description="PostgreSQL: seconds the server lets one of the API's statements run "
        "before cancelling it (the request gets 503 with Retry-After); 0: no limit. Migrations have none.")
    api_token: SecretStr | None = Field(
        None, description="When set, POST/PUT/PATCH/DELETE need 'Authorization: Bearer <token>'. "
        "Set it whenever the port is reachable by anyone else."
    )
    allowed_hosts: str = Field(
        "localhost,127.0.0.1,[::1]",
        description="Comma-separated host names the API answers to (the request's Host header, any port); "
        "'*.example.com' matches subdomains, '*' any host. Others get 400: this stops DNS rebinding.",
    )
    ui_origin: str = Field(
        "http://127.0.0.1:8501,http://localhost:8501",
        description="Comma-separated browser origins allowed by CORS (the dashboard).",
    )
    max_jobs: int = Field(2, ge=0, le=64, description="Training jobs allowed to run at once on the local target.")
    # ---- targets other than local (services/targets.py); each is enabled by its first setting ----
    ray_address: str | None = Field(None, description="The Ray job server's URL (e.g. http://head:8265): "
                                    "enables the `ray` target (Ray Jobs).")
    slurm_partition: str | None = Field(None, description="The Slurm partition jobs go to: enables the `slurm` "
                                        "target (sbatch/squeue/scontrol/scancel on this machine).")
    slurm_account: str | None = Field(None, description="Slurm account charged for the jobs (sbatch --account).")
    slurm_extra: str = Field("", description="Further sbatch options, as a shell would split them "
                             "(e.g. '--qos=normal --constraint=a100').")
    slurmrestd_url: str | None = Field(None, description="slurmrestd's URL (http(s)://host:6820, or "
                                       "unix:/path/of/its.sock): the slurm target talks to it instead of running "
                                       "the Slurm commands here.")
    slurmrestd_token: SecretStr | None = Field(None, description="JWT for slurmrestd over HTTP (X-SLURM-USER-TOKEN).")
    slurmrestd_user: str | None = Field(None, description="The Slurm user the JWT is for (X-SLURM-USER-NAME).")
    max_jobs_ray: int = Field(8, ge=0, le=10_000, description="Jobs of the ray target active at once (queued "
                              "or running); more are refused with 503.")
    max_jobs_slurm: int = Field(8, ge=0, le=10_000, description="Jobs of the slurm target active at once.")
    job_command: str = Field("aah", description="How a cluster node runs the aah command (split as a shell "
                             "would), e.g. '/opt/aah/.venv/bin/aah'.")
    public_url: str | None = Field(None, description="The URL at which cluster jobs reach this server to report "
                                   "(their --tracking-uri). Default: http://127.0.0.1:$AAH_API_PORT.")
    api_port: int = Field(8000, ge=1, le=65535, description="The port the API listens on (aah serve).")
    cluster_poll_s: float = Field(2.0, gt=0, le=3600, description="Seconds between two reads of the cluster "
                                  "engines' job states.")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Largest accepted request body.")
    max_upload_bytes: int = Field(1 << 30, ge=1024, description="Largest checkpoint file a tracked run may "
                                  "upload (PUT /tracking/runs/{id}/checkpoint/{file}).")
    request_timeout_s: float = Field(
        15.0, gt=0, le=3600, description="Seconds a client has to send a request's line and headers from its "
        "first byte (or from connecting), and the longest a body may stall between two reads; then 408 and "
        "the connection is closed. Needs the server run with --http backend.api.protocol:TimedH11Protocol.")
    demo_dir: Path | None = Field(SHIPPED_DEMO_DIR, description="Checkpoint registered on a fresh data dir.")
    seed_demo: bool = Field(True, description="Register the demo checkpoint and its history on a fresh store.")
    seed_paper: bool = Field(True, description="Import the paper's reported tables as a read-only experiment.")
    suite_files: list[Path] = Field(list(SHIPPED_SUITES), description="Packed suites imported on a fresh data dir, "
                                    "in this order (source 'suite'; each re-imported when its file changes); "
                                    'from the environment a JSON list, e.g. AAH_SUITE_FILES=\'["my.jsonl.gz"]\'.')
    seed_suite: bool = Field(True, description="Import the shipped reproductions (suite_files) at start.")
    preload_models: bool = Field(True, description="Load registered checkpoints at startup, not on first use.")
    warm_up: bool = Field(False, description="After preloading, compute what the editor's first visit asks "
                          "of each loaded model (its own plan's losses, the opening sweep), so that visit is "
                          "served from the cache; `aah serve` (make demo) turns it on.")
    result_cache_size: int = Field(512, ge=0, description="Evaluation results kept per process (LRU).")
    cache_bytes: int = Field(64 << 20, ge=0, description="Bytes of serialised metric responses kept for "
                             "pollers (LRU; a response larger than this is not kept).")
    max_metric_keys: int = Field(1000, ge=1, le=1_000_000, description="Metric keys one run may hold; a "
                                 "tracking batch that would add more is refused (422).")
    max_loaded_models: int = Field(4, ge=1, description="Checkpoints kept in memory at once (LRU).")
    job_grace_s: float = Field(10.0, ge=0, description="Seconds a cancelled worker gets before it is killed.")
    reconcile_s: float = Field(
        30.0, ge=0, description="Every so many seconds, runs marked SCHEDULED/RUNNING without a live worker "
        "are ended (and orphaned workers stopped); also done at start. 0: only at start.")
    heavy_workers: int = Field(
        default_factory=_quarter_of_the_cores, ge=1, le=64,
        description="Threads for heavy work (evaluation, heatmaps, retained mass, sensitivity, allocation, "
        "measured cost, generation): at most this many such jobs run at once. Default: a quarter of the CPU "
        "cores, at least 1 (each job's torch ops use several cores already; more threads only fight for them).")
    heavy_queue: int = Field(
        16, ge=0, le=10_000, description="Heavy jobs that may wait for a thread; beyond that a request is "
        "refused with 429 and Retry-After (identical concurrent requests share one job).")
    read_workers: int = Field(
        default_factory=_read_threads, ge=1, le=64,
        description="Threads for long store reads (metric series that miss the cache, compare). Default: a "
        "quarter of the CPU cores, at least 2 (a read waits for the database part of its time).")
    read_queue: int = Field(64, ge=0, le=10_000, description="Long store reads that may wait; beyond that 429.")
    torch_threads: int | None = Field(None, ge=1, description="torch.set_num_threads for evaluation.")
    corpus_dirs: str = Field(
        "", description="Folders (separated by ':' or ',') that training jobs may read corpora and tokenizer "
        "folders from, besides the data dir. Nothing outside these roots is ever read for a job."
    )
    model_dirs: str | None = Field(
        None, description="Folders (separated by ':' or ',') under which model folders may be "
        "registered. Default: models/ in the data dir and, when it exists, the local Hugging Face cache."
    )
    hf_hub_cache: Path | None = Field(None, validation_alias="HF_HUB_CACHE", description="The Hugging Face cache.")
    hf_home: Path | None = Field(None, validation_alias="HF_HOME", description="Hugging Face's home (cache in hub/).")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value():
            parse_database_url(value.get_secret_value())
        return value

    @property
    def model_roots(self) -> list[Path]:
        """The resolved folders under which model folders may be registered (AAH_MODEL_DIRS)."""
        if self.model_dirs:
            return [Path(p).expanduser().resolve() for p in self.model_dirs.replace(",", ":").split(":") if p.strip()]
        cache = self.hf_hub_cache or (self.hf_home / "hub" if self.hf_home else Path.home() / ".cache/huggingface/hub")
        cache = cache.expanduser().resolve()
        return [self.data_dir / "models"] + ([cache] if cache.is_dir() else [])

    @property
    def db_path(self) -> Path:
        """The default store: a SQLite file in the data dir (used when no database_url is set)."""
        return self.data_dir / "aah.db"

    @property
    def db_url(self) -> str:
        """The run store's SQLAlchemy URL: ``database_url``, else the SQLite file ``db_path``."""
        if self.database_url is not None and self.database_url.get_secret_value():
            return self.database_url.get_secret_value()
        return sqlite_url(self.db_path)

    @property
    def allowed_host_list(self) -> list[str]:
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    @property
    def ui_origins(self) -> list[str]:
        return [o.strip() for o in self.ui_origin.split(",") if o.strip()]

    @property
    def path_roots(self) -> list[Path]:
        """Where user-given corpus and tokenizer paths may point: the data dir, then AAH_CORPUS_DIRS."""
        extra = [p.strip() for p in self.corpus_dirs.replace(",", ":").split(":") if p.strip()]
        return [self.data_dir, *(Path(p).expanduser().resolve() for p in extra)]

    @property
    def private_paths(self) -> list[Path]:
        """The service's own files in the data dir, never data (a corpus): the SQLite store with its
        journals, and the logs folder `aah serve` writes."""
        db = self.db_path
        return [db.with_name(db.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")] + [self.data_dir / "logs"]

    def max_jobs_of(self, target: str) -> int:
        """The cap of active jobs of a target (AAH_MAX_JOBS for local, AAH_MAX_JOBS_<TARGET> otherwise)."""
        return self.max_jobs if target == "local" else getattr(self, f"max_jobs_{target}")

    @property
    def tracking_url(self) -> str:
        """Where a cluster job reports back to: AAH_PUBLIC_URL, else this machine's API port."""
        return (self.public_url or f"http://127.0.0.1:{self.api_port}").rstrip("/")

    def token(self) -> str | None:
        """The API token, or None when mutating endpoints are open."""
        if self.api_token is None or not self.api_token.get_secret_value():
            return None
        return self.api_token.get_secret_value()
