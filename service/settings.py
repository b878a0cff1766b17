"""Service settings, read from the environment (prefix `MEMPLAN_`, e.g. `MEMPLAN_API_KEY`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Every knob of the service; each field is also the environment variable MEMPLAN_<NAME>."""

    # an empty variable (MEMPLAN_JOB_MAX_BYTES=) counts as unset, as shells and compose files mean it
    model_config = SettingsConfigDict(env_prefix="MEMPLAN_", extra="ignore", env_ignore_empty=True)

    host: str = Field(default="127.0.0.1", description="address `memplan serve` binds")
    port: int = Field(default=8000, ge=0, le=65535, description="port `memplan serve` binds")
    data_dir: Path = Field(default=Path(".memplan"), description="folder of the job store")
    store_path: Path | None = Field(
        default=None, description="SQLite job store; default: <data_dir>/jobs.sqlite"
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="when set, every /v1 call except healthz and readyz needs "
        "`Authorization: Bearer <key>` or `X-API-Key: <key>`",
    )
    max_body_bytes: int = Field(default=16 << 20, ge=1024, description="larger bodies: 413")
    max_stages: int = Field(default=20_000, ge=1, description="longest profile a plan accepts")
    max_queue_depth: int = Field(
        default=64, ge=1, description="queued plus running jobs before new ones get 429"
    )
    start_worker: bool = Field(
        default=True, description="the API starts (and restarts) the job worker process itself"
    )
    heartbeat_s: float = Field(default=1.0, gt=0, description="worker heartbeat period")
    worker_stale_s: float = Field(
        default=5.0, gt=0, description="a worker silent this long counts as dead (readyz: 503)"
    )
    job_timeout_s: float = Field(default=6 * 3600, gt=0, description="a job running longer fails")
    shutdown_grace_s: float = Field(
        default=5.0, ge=0, description="on SIGTERM, seconds `memplan serve` waits for open "
        "connections (event streams, a page following a job) before it closes them and stops"
    )
    # the limits a job is admitted against (service/jobs/admission.py) and held to (the worker)
    job_max_bytes: int | None = Field(
        default=None, ge=1 << 20,
        description="bytes one job may use: its estimate above this is refused (422) and its "
        "process above this is stopped (out-of-memory); default: 80% of the physical memory",
    )
    job_cpu_flops_per_s: float = Field(
        default=1e12, gt=0, description="throughput a job's time is estimated at on a CPU (optimistic)"
    )
    job_gpu_flops_per_s: float = Field(
        default=2e15, gt=0, description="throughput a job's time is estimated at on a GPU (optimistic)"
    )
    cancel_grace_s: float = Field(
        default=5.0, ge=0, description="after SIGTERM, seconds before a cancelled job is killed"
    )
    max_attempts: int = Field(
        default=3, ge=1, description="starts of one job (re-queued when its worker died) before it fails"
    )
    device: str | None = Field(
        default=None, description="device for profiles and runs ('cuda', 'cpu'); default: cuda if any"
    )
    run_job: str = Field(
        default="memplan.service.jobs.kinds:run_job", description="'module:function' that executes a run"
    )
    profile_job: str = Field(
        default="memplan.service.jobs.kinds:profile_job",
        description="'module:function' that profiles a built-in model",
    )
    sweep_cell_job: str = Field(
        default="memplan.executor.sweep:sweep_cell", description="'module:function' that runs a sweep cell"
    )
    ray_address: str | None = Field(
        default=None,
        description="a Ray cluster ('host:port', or 'auto'): jobs run there as Ray tasks instead "
        "of in the local worker (service.backends)",
    )
    ray_pending_timeout_s: float = Field(
        default=120.0, gt=0,
        description="a Ray task that asks for more than the whole cluster has fails after this",
    )
    ray_max_retries: int = Field(
        default=2, ge=0, description="Ray retries of a task whose worker process died"
    )
    ray_max_in_flight: int = Field(
        default=32, ge=1, description="jobs submitted to the Ray cluster at once"
    )
    sse_poll_s: float = Field(default=0.2, gt=0, description="event stream polling period")
    sse_keepalive_s: float = Field(default=15.0, gt=0, description="comment line when idle")
    # plans computed in the API (NOTE [ Plans in the API process ] in service/routers/plans.py)
    plan_max_steps: float = Field(
        default=5e7, gt=0, description="a plan whose work estimate (planner/request.py, NOTE "
        "[ work estimate ]) is over this many DP steps is refused (422)",
    )
    plan_max_table_bytes: int = Field(
        default=1 << 30, ge=1 << 20, description="a plan whose tables would be larger is refused (422)",
    )
    plan_timeout_s: float = Field(
        default=30.0, gt=0, description="a plan not done in this many seconds answers 503",
    )
    plan_concurrency: int = Field(
        default=2, ge=1, le=64, description="plans computed at once; more wait for a slot",
    )
    plan_process_min_steps: float = Field(
        default=1e6, ge=0, description="a plan whose work estimate is over this many DP steps is "
        "computed in a planning process, which its time limit or its client leaving kills; "
        "smaller plans run in a thread of the API (NOTE [ Planning processes ] in "
        "service/compute.py)",
    )
    plan_processes: int = Field(
        default=2, ge=1, le=64, description="planning processes at most (started when needed, "
        "then reused)",
    )
    plan_process_max_bytes: int = Field(
        default=8 << 30, ge=0, description="address space of one planning process, bytes (0: no "
        "limit); past it an allocation fails (422). Its imports take about 0.7 GB of it, numba "
        "compiling the kernel (the first plan after an upgrade) about 3 GB",
    )
    plan_kill_grace_s: float = Field(
        default=0.5, ge=0, description="seconds between SIGTERM and SIGKILL of a stopped planning "
        "process",
    )
    plan_cache_size: int = Field(
        default=256, ge=0, description="identical plan requests answered from memory (0: off)"
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, value: object) -> object:
        # MEMPLAN_API_KEY= (empty, as compose passes an unset variable) means no key
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("plan_process_max_bytes")
    @classmethod
    def _room_to_start(cls, value: int) -> int:
        if 0 < value < 1 << 30:
            raise ValueError(f"0 (no limit) or at least 1 GiB ({1 << 30}): a planning process "
                             f"needs about 0.7 GB to start; got {value}")
        return value

    @property
    def db_path(self) -> Path:
        """The SQLite file of the job store."""
        return self.store_path if self.store_path is not None else self.data_dir / "jobs.sqlite"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (read once from the environment)."""
    return Settings()
