"""The Ray backend: each job the store holds runs as a Ray task on a cluster (`MEMPLAN_RAY_ADDRESS`).

    API ──> jobs.sqlite <──(claim, record)── RayBackend (the worker process, a Ray driver)
                                                   │ task per job: 1 GPU on cuda, else 1 CPU
                                                   ▼
                                        Ray cluster: job function (run, profile, sweep cell)

The store stays the system of record: the backend claims a queued job, submits it, and records
its progress, retries and outcome; the task only computes and returns (nodes need no access to
the store). Progress and starts reach the backend through a small actor (`_Sink`).

NOTE [ Failure handling ]
- A task whose worker process dies (killed, out of memory, node lost) is retried by Ray, up to
  `ray_max_retries` times (`max_retries`; application errors are not retried: they are the job's
  answer). Each start is counted in the job's `attempts`, with a log event; the task reports its
  start and waits for the backend's sink to hold it before the job function runs, so a worker
  killed at once still counts.
- Cancel: the API flags the job; the backend calls `ray.cancel(ref, force=True)`, which ends the
  task's worker process (and so frees its device memory), and records the job as cancelled.
- A task asking for more than the whole cluster has (a cuda run on a cluster with no GPU) would
  pend forever: after `ray_pending_timeout_s` without starting, while the cluster's total is
  still short, it is cancelled and the job fails ('unavailable') saying what it asked for and
  what the cluster has. A task merely waiting for busy resources keeps waiting.
- The backend dies: its tasks die with their driver, and the next worker re-queues the jobs it
  left running (`JobStore.recover`), as for the local worker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memplan.service.backends import RunBackend, job_function, job_resources
from memplan.service.jobs.store import Job, JobState
from memplan.service.jobs.worker import Worker

__all__ = ["RayBackend", "execute", "map_cells", "require_ray"]

log = logging.getLogger("memplan.ray")


def require_ray():
    """The `ray` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError("the Ray backend needs Ray: pip install 'memplan[ray]'") from None
    return ray


class _TaskContext:
    """The `ctx` a job function gets inside a Ray task: progress goes to the backend's sink."""

    def __init__(self, sink: Any, job_id: str, device: str | None) -> None:
        self._sink = sink
        self.job_id = job_id
        self.device = device
        self._last = 0.0

    def progress(self, fraction: float, message: str = "", *, force: bool = False) -> None:
        now = time.monotonic()
        if self._sink is not None and (force or now - self._last >= 0.2 or fraction >= 1.0):
            self._last = now
            self._sink.put.remote(self.job_id, "progress", {"progress": float(fraction), "message": message})

    def log(self, message: str) -> None:
        if self._sink is not None:
            self._sink.put.remote(self.job_id, "log", {"message": message})


def execute(path: str, request: dict[str, Any], *, job_id: str = "", device: str | None = None,
            sink: Any = None) -> dict[str, Any]:
    """Run the job function at `path` on `request` here; returns {'state', 'result' | 'error'},
    mapping errors as the local runner does (input errors, missing packages, bugs)."""
    from memplan.service.jobs._proc import import_object

    if sink is not None:
        # Waited for: an actor call is sent asynchronously, and one still buffered when this worker
        # process is killed is lost, so the start would go uncounted (NOTE [ Failure handling ]).
        started = sink.put.remote(job_id, "started", {"pid": os.getpid(), "node": socket.gethostname()})
        try:
            require_ray().get(started, timeout=30)
        except Exception as err:  # noqa: BLE001 - a slow sink must not stop the job
            log.warning("job %s: the start was not acknowledged by the backend: %s", job_id, err)
    ctx = _TaskContext(sink, job_id, device)
    try:
        fn = import_object(path)
        result = fn(request, ctx)
        if hasattr(result, "model_dump"):
            result = result.model_dump(mode="json")
        if not isinstance(result, dict):
            raise TypeError(f"job function returned {type(result).__name__}; return a model or a dict")
        return {"state": "succeeded", "result": result}
    except (ValueError, KeyError) as err:
        return {"state": "failed", "error": {"type": "invalid-input", "detail": str(err)}}
    except ImportError as err:
        return {"state": "failed", "error": {"type": "unavailable", "detail": f"not available in this build: {err}"}}
    except (Exception, MemoryError) as err:  # noqa: BLE001 - a job's bug must end as a failed job
        from memplan.service.jobs.runner import is_out_of_memory

        kind = "out-of-memory" if is_out_of_memory(err) else "internal"
        return {"state": "failed", "error": {"type": kind, "detail": f"{type(err).__name__}: {err}"}}


_REMOTE: dict[str, Any] = {}


def _remote_execute():
    if "execute" not in _REMOTE:
        _REMOTE["execute"] = require_ray().remote(execute)
    return _REMOTE["execute"]


def _sink_class():
    if "sink" not in _REMOTE:
        ray = require_ray()

        @ray.remote(num_cpus=0)
        class _Sink:
            """Collects starts and progress from tasks until the backend drains them."""

            def __init__(self) -> None:
                self.items: list[tuple[str, str, dict]] = []

            def put(self, job_id: str, kind: str, data: dict) -> None:
                self.items.append((job_id, kind, data))

            def drain(self) -> list[tuple[str, str, dict]]:
                out, self.items = self.items, []
                return out

        _REMOTE["sink"] = _Sink
    return _REMOTE["sink"]


def _connect(address: str) -> None:
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, logging_level="warning", log_to_driver=False)


def _resources_text(res: dict[str, float]) -> str:
    gpus = res.get("num_gpus", 0.0)
    return f"{res.get('num_cpus', 0):g} CPU" + (f" and {gpus:g} GPU" if gpus else "")


@dataclass
class _Flight:
    job: Job
    ref: Any
    resources: dict[str, float]
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    starts: int = 0
    warned: bool = False


class RayBackend(Worker, RunBackend):
    """Serves the store's queue by submitting each job as a Ray task (see the module's NOTE)."""

    name = "ray"

    def __init__(self, settings, *, parent_pid: int | None = None) -> None:
        super().__init__(settings, parent_pid=parent_pid)
        self._flights: dict[str, _Flight] = {}
        self._sink: Any = None
        self._last_describe = 0.0

    # -- lifecycle -------------------------------------------------------------------------------

    def run(self) -> int:
        if not self._acquire_lock():
            return 0
        ray = require_ray()
        _connect(self.settings.ray_address)
        log.info("worker %s serves %s on the Ray cluster at %s", self.id, self.settings.db_path,
                 self.settings.ray_address)
        self.store.recover(self.id, max_attempts=self.settings.max_attempts)
        self._sink = _sink_class().remote()
        self._device = self._describe()
        self._beat(force=True)
        try:
            while not self._stopping and not self._parent_gone():
                self._beat()
                self._submit_more()
                self._drain_sink()
                self._collect()
                self._watch()
                time.sleep(0.1)  # not an Event: NOTE [ Stopping from a signal handler ]
        finally:
            for job_id, fl in list(self._flights.items()):
                ray.cancel(fl.ref, force=True)
                self.store.requeue(job_id, message="re-queued: the worker stopped", lease=fl.job.lease)
            self._flights.clear()
        return 0

    def _describe(self) -> dict[str, Any]:
        ray = require_ray()
        total = ray.cluster_resources()
        return {"kind": "ray", "backend": "ray", "address": self.settings.ray_address,
                "nodes": sum(1 for n in ray.nodes() if n.get("Alive")),
                "cpus": total.get("CPU", 0.0), "gpus": total.get("GPU", 0.0)}

    def _beat(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._sink is not None and (force or now - self._last_describe >= 10 * self.settings.heartbeat_s):
            self._last_describe = now
            try:
                self._device = self._describe()  # the cluster may grow or shrink
            except Exception as err:  # noqa: BLE001 - keep serving; report it
                log.warning("cannot read the cluster's resources: %s", err)
        super()._beat(force=force)

    # -- submit ------------------------------------------------------------------------------------

    def _submit_more(self) -> None:
        while len(self._flights) < self.settings.ray_max_in_flight:
            job = self.store.claim(self.id)
            if job is None:
                return
            try:
                path = job_function(job.kind, self.settings)
                res = job_resources(job.request, self.settings,
                                    cluster_gpus=float((self._device or {}).get("gpus", 0.0)))
            except ValueError as err:
                self.store.finish(job.id, JobState.failed,
                                  error={"type": "invalid-input", "detail": str(err)}, message="failed")
                continue
            device = job.request.get("device") or self.settings.device or (
                "cuda" if res["num_gpus"] else "cpu")
            ref = _remote_execute().options(
                num_cpus=res["num_cpus"], num_gpus=res["num_gpus"],
                max_retries=self.settings.ray_max_retries, retry_exceptions=False,
                name=f"memplan-{job.kind}-{job.id[:8]}",
            ).remote(path, job.request, job_id=job.id, device=device, sink=self._sink)
            self._flights[job.id] = _Flight(job=job, ref=ref, resources=res)
            self.store.log_event(job.id, "log", {"message": f"submitted to Ray ({_resources_text(res)})"})
            log.info("job %s (%s): submitted, %s", job.id, job.kind, _resources_text(res))

    # -- progress, starts and retries ----------------------------------------------------------------

    def _drain_sink(self) -> None:
        ray = require_ray()
        try:
            items = ray.get(self._sink.drain.remote(), timeout=10)
        except Exception as err:  # noqa: BLE001 - a slow actor must not stop the loop
            log.warning("progress sink: %s", err)
            return
        for job_id, kind, data in items:
            fl = self._flights.get(job_id)
            if fl is None:
                continue
            if kind == "started":
                fl.starts += 1
                fl.started = time.monotonic()
                where = f"pid {data.get('pid')} on {data.get('node')}"
                if fl.starts == 1:
                    self.store.log_event(job_id, "log", {"message": f"started on Ray: {where}"})
                else:
                    self.store.note_retry(
                        job_id, message=f"retried by Ray (start {fl.starts}) after its worker "
                        f"process died: {where}")
            elif kind == "progress":
                self.store.progress(job_id, data.get("progress", 0.0), data.get("message", ""),
                                    lease=fl.job.lease)
            else:
                self.store.log_event(job_id, kind, data)

    # -- outcomes --------------------------------------------------------------------------------------

    def _collect(self) -> None:
        ray = require_ray()
        if not self._flights:
            return
        refs = [fl.ref for fl in self._flights.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not ready:
            return
        self._drain_sink()  # the last progress and starts first
        ready_ids = {id(r) for r in ready}
        for job_id, fl in list(self._flights.items()):
            if id(fl.ref) not in ready_ids:
                continue
            del self._flights[job_id]
            try:
                out = ray.get(fl.ref)
            except Exception as err:  # noqa: BLE001 - Ray's errors: crashed worker, lost node, cancel
                detail = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
                self.store.finish(job_id, JobState.failed, message="crashed", lease=fl.job.lease, error={
                    "type": "crashed",
                    "detail": f"its Ray task failed after {max(fl.starts, 1)} start(s): {detail}"})
                continue
            if out["state"] == "succeeded":
                self.store.finish(job_id, JobState.succeeded, result=out["result"], message="done",
                                  lease=fl.job.lease)
            else:
                self.store.finish(job_id, JobState.failed, error=out["error"], message="failed",
                                  lease=fl.job.lease)

    def _watch(self) -> None:
        """Cancel requests, job timeouts, and tasks that ask for more than the cluster has."""
        ray = require_ray()
        now = time.monotonic()
        for job_id, fl in list(self._flights.items()):
            current = self.store.get(job_id)
            if current is None or current.state is not JobState.running:
                ray.cancel(fl.ref, force=True)
                del self._flights[job_id]
                continue
            if current.cancel_requested:
                ray.cancel(fl.ref, force=True)
                del self._flights[job_id]
                self.store.finish(job_id, JobState.cancelled, message="cancelled", lease=fl.job.lease)
                continue
            limit_s = self._time_limit_s(fl.job)
            if fl.started is not None and now - fl.started > limit_s:
                ray.cancel(fl.ref, force=True)
                del self._flights[job_id]
                self.store.finish(job_id, JobState.failed, message="timed out", lease=fl.job.lease, error={
                    "type": "timeout", "detail": f"ran past its time limit of {limit_s:g} s"})
                continue
            if fl.started is None and now - fl.submitted > self.settings.ray_pending_timeout_s:
                total = ray.cluster_resources()
                short = [(k, v, total.get(name, 0.0)) for k, v, name in (
                    ("num_gpus", fl.resources["num_gpus"], "GPU"),
                    ("num_cpus", fl.resources["num_cpus"], "CPU")) if v > total.get(name, 0.0)]
                if short:
                    ray.cancel(fl.ref, force=True)
                    del self._flights[job_id]
                    have = ", ".join(f"{h:g} {k.removeprefix('num_').upper().rstrip('S')}" for k, _, h in short)
                    self.store.finish(job_id, JobState.failed, message="unavailable", lease=fl.job.lease, error={
                        "type": "unavailable",
                        "detail": f"it asks for {_resources_text(fl.resources)} per task, but the Ray "
                        f"cluster at {self.settings.ray_address} has {have} in total; it waited "
                        f"{self.settings.ray_pending_timeout_s:g} s (MEMPLAN_RAY_PENDING_TIMEOUT_S) "
                        "for the cluster to grow. Add GPU nodes, or ask for device 'cpu'"})
                elif not fl.warned:
                    fl.warned = True
                    self.store.log_event(job_id, "log", {
                        "message": f"waiting for {_resources_text(fl.resources)}: the cluster is busy"})


def map_cells(
    requests: list[dict[str, Any]],
    *,
    address: str,
    path: str = "memplan.executor.sweep:sweep_cell",
    max_retries: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[str, dict | None, str | None]]:
    """Run each request through the job function `path` as a Ray task on the cluster at `address`
    (one CPU each; one GPU where a request's device is cuda), in parallel; returns, in order,
    (state, result, error detail) per request. For sweeps run without a server."""
    ray = require_ray()
    _connect(address)
    fn = _remote_execute()
    refs = []
    for req in requests:
        gpu = str(req.get("device") or "cpu").startswith("cuda")
        refs.append(fn.options(num_cpus=1, num_gpus=1 if gpu else 0, max_retries=max_retries,
                               retry_exceptions=False).remote(path, req, device=req.get("device")))
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=1)
        if progress:
            progress(len(refs) - len(pending), len(refs))
    out = []
    for ref in refs:
        try:
            res = ray.get(ref)
        except Exception as err:  # noqa: BLE001
            out.append(("failed", None, f"{type(err).__name__}: {err}"))
            continue
        out.append((res["state"], res.get("result"), (res.get("error") or {}).get("detail")))
    return out
