"""The worker: `python -m service.jobs.worker` claims jobs from the store and runs each in its own
runner process, one at a time (one device, one job).

It holds an exclusive lock beside the store (`<store>.worker.lock`), so one worker serves a store
however many API processes start one; the others wait on the lock as hot standbys. On taking the
lock it re-queues the jobs a dead worker left running. While a job runs it watches for a cancel
request, the job's timeout and the death of its own parent (the API that started it), and it
heartbeats so that `/v1/readyz` can tell it is alive.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from memplan.service.jobs._proc import (
    cmdline,
    die_with_parent,
    spawn_with_parent_death,
    start_ticks,
)
from memplan.service.jobs.store import Job, JobState, JobStore
from memplan.service.settings import Settings

__all__ = ["Worker", "probe_device", "main"]

log = logging.getLogger("memplan.worker")

_PROBE = r"""
import json, platform
out = {"kind": "cpu", "name": platform.processor() or platform.machine(), "torch": None}
try:
    import torch
    out["torch"] = torch.__version__
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        out.update(kind="cuda", name=p.name, index=i, total_bytes=int(total), free_bytes=int(free),
                   capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda,
                   count=torch.cuda.device_count())
except Exception as err:  # torch missing or broken: report it, never fail the worker
    out["error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def probe_device(timeout_s: float = 120.0) -> dict[str, Any]:
    """The device jobs will run on, probed in a throwaway process (so that no CUDA context, and no
    device memory, is ever held by the worker itself)."""
    try:
        out = subprocess.run(  # noqa: S603 - our own interpreter
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, check=False,
            preexec_fn=spawn_with_parent_death(os.getpid()),  # noqa: PLW1509 - it goes with its worker
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, json.JSONDecodeError, IndexError, OSError) as err:
        return {"kind": "unknown", "error": f"{type(err).__name__}: {err}"}


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class Worker:
    """Claims and runs jobs until stopped. `run()` blocks."""

    def __init__(self, settings: Settings, *, parent_pid: int | None = None) -> None:
        self.settings = settings
        self.store = JobStore(settings.db_path)
        self.id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.parent_pid = parent_pid
        self._stopping = False  # set by stop(); NOTE [ Stopping from a signal handler ]
        self._device: dict[str, Any] | None = None
        self._last_beat = 0.0
        self._lock_file: Any = None

    # -- lifecycle -------------------------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        """Ask the worker to stop; its loops notice within 0.2 s.

        NOTE [ Stopping from a signal handler ]
        This is the SIGTERM and SIGINT handler, so it takes no lock. It used to set a
        threading.Event, and a second SIGTERM that arrived while the first handler was inside
        Event.set (holding the Event's lock) ran the handler again, which waited for that lock
        forever: CI's kill-the-API test found a worker, orphaned, in exactly that stack (py-spy:
        Worker.stop > Event.set > notify_all > Worker.stop > Event.set > Condition.__enter__).
        A plain attribute, read by the loops, cannot deadlock."""
        self._stopping = True

    def _parent_gone(self) -> bool:
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    def _acquire_lock(self) -> bool:
        path = Path(str(self.settings.db_path) + ".worker.lock")
        self._lock_file = open(path, "a+")  # noqa: SIM115 - held for the worker's life
        while not self._stopping and not self._parent_gone():
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                time.sleep(0.5)
        return False

    def _beat(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_beat >= self.settings.heartbeat_s:
            self._last_beat = now
            self.store.heartbeat(self.id, device=self._device)

    def _probe(self) -> None:
        self._device = probe_device()
        log.info("device: %s", self._device)

    def run(self) -> int:
        if not self._acquire_lock():
            return 0
        log.info("worker %s holds %s", self.id, self.settings.db_path)
        self._stop_orphans()
        self.store.recover(self.id, max_attempts=self.settings.max_attempts)
        threading.Thread(target=self._probe, name="device-probe", daemon=True).start()
        self._beat(force=True)
        while not self._stopping:
            if self._parent_gone():
                log.warning("the API that started this worker is gone; stopping")
                break
            self._beat()
            job = self.store.claim(self.id)
            if job is None:
                time.sleep(min(0.2, self.settings.heartbeat_s))
                continue
            self._run(job)
        return 0

    def _stop_orphans(self) -> list[int]:
        """Before re-queueing what a dead worker left running: SIGKILL the process group of each
        of its runners still alive on this machine (one that outlived its worker: no prctl, or
        started by an older worker), so that no start of a job overlaps the next. A process counts
        as that runner only if its pid, its start time and its command line (the job's id) all
        match what the store recorded, so a reused pid is never killed. Returns the pids killed."""
        killed = []
        for r in self.store.runners(exclude_worker=self.id):
            pid = int(r["pid"])
            args = cmdline(pid)
            if r["job_id"] not in args or not any(a.endswith("memplan.service.jobs.runner") for a in args):
                continue
            if r["start_ticks"] is not None and start_ticks(pid) != r["start_ticks"]:
                continue
            log.warning("job %s: its runner (pid %d) outlived its worker; killing it", r["job_id"], pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        deadline = time.monotonic() + 10
        for pid in killed:  # not our children: poll until each is gone
            while start_ticks(pid) is not None and _zombie_or_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        return killed

    # -- one job -----------------------------------------------------------------------------------

    def _time_limit_s(self, job: Job) -> float:
        """The job's time limit: its own `timeout_s` when it set one (below the global), else
        `job_timeout_s`."""
        asked = job.request.get("timeout_s")
        limit = self.settings.job_timeout_s
        return min(limit, float(asked)) if isinstance(asked, (int, float)) and asked > 0 else limit

    def _run(self, job: Job) -> None:
        from memplan.service.jobs.admission import job_memory_limit

        log.info("job %s (%s): start, attempt %d", job.id, job.kind, job.attempts)
        cmd = [sys.executable, "-m", "memplan.service.jobs.runner", str(self.settings.db_path), job.id,
               "--parent", str(os.getpid())]
        if job.lease is not None:
            cmd += ["--lease", job.lease]
        proc = subprocess.Popen(  # noqa: S603 - our own module, our own interpreter
            cmd,
            start_new_session=True,  # its own process group: a cancel reaches its children too
            # NOTE [ A runner dies with its worker from its first instruction ] (_proc.py)
            preexec_fn=spawn_with_parent_death(os.getpid()),  # noqa: PLW1509 - only prctl and getppid
        )
        self.store.set_runner(job.id, proc.pid, lease=job.lease, start_ticks=start_ticks(proc.pid))
        limit_s = self._time_limit_s(job)
        deadline = time.monotonic() + limit_s
        max_rss = job_memory_limit(self.settings)
        outcome: tuple[JobState, dict[str, str] | None, str] | None = None
        while proc.poll() is None:
            self._beat()
            current = self.store.get(job.id)
            if current is None or current.state is not JobState.running or current.lease != job.lease:
                # finished by the runner a moment ago; let it exit
                try:
                    proc.wait(timeout=self.settings.cancel_grace_s + 5)
                except subprocess.TimeoutExpired:
                    self._kill(proc, grace_s=0)
                break
            if current.cancel_requested:
                self._kill(proc, grace_s=self.settings.cancel_grace_s)
                outcome = (JobState.cancelled, None, "cancelled")
                break
            if time.monotonic() > deadline:
                self._kill(proc, grace_s=self.settings.cancel_grace_s)
                which = "its timeout_s" if limit_s < self.settings.job_timeout_s else "job_timeout_s"
                outcome = (
                    JobState.failed,
                    {"type": "timeout", "detail": f"ran past {which}={limit_s:g} s"},
                    "timed out",
                )
                break
            rss = _rss_bytes(proc.pid)
            if max_rss is not None and rss is not None and rss > max_rss:
                self._kill(proc, grace_s=0)
                outcome = (
                    JobState.failed,
                    {"type": "out-of-memory",
                     "detail": f"its process held {rss:,} bytes, over the job memory limit of {max_rss:,} "
                               "(MEMPLAN_JOB_MAX_BYTES); ask for a smaller model or batch"},
                    "out of memory",
                )
                break
            if self._stopping or self._parent_gone():
                # shutting down: stop the job and give it back to the queue for the next worker
                self._kill(proc, grace_s=min(2.0, self.settings.cancel_grace_s))
                self.store.requeue(job.id, message="re-queued: the worker stopped", lease=job.lease)
                return
            time.sleep(0.1)
        rc = proc.wait()
        if outcome is None:
            if rc < 0:
                why = f"its process was killed by {_signal_name(rc)}"
                if rc == -signal.SIGKILL:
                    why += " (the kernel's out-of-memory killer does this)"
            else:
                why = f"its process exited with code {rc} before recording a result"
            outcome = (JobState.failed, {"type": "crashed", "detail": why}, "crashed")
        # no-op when the runner recorded its own outcome first
        if self.store.finish(job.id, outcome[0], error=outcome[1], message=outcome[2], lease=job.lease):
            log.warning("job %s: %s", job.id, outcome[2])
        log.info("job %s: end", job.id)

    @staticmethod
    def _kill(proc: subprocess.Popen, *, grace_s: float) -> None:
        """SIGTERM the runner's process group, then SIGKILL after `grace_s`; waits for the exit,
        after which its device memory is back with the driver."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _rss_bytes(pid: int) -> int | None:
    """Resident bytes of process `pid` (/proc/PID/statm), None when unreadable."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _zombie_or_alive(pid: int) -> bool:
    """True while /proc still lists `pid` in a state other than zombie (an orphan killed by us is
    reaped by init; until then it is a zombie, which holds no memory)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.jobs.worker")
    parser.add_argument("--store", type=Path, help="SQLite job store (default: the settings')")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the process that started us dies"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"worker[{os.getpid()}] %(levelname)s %(message)s")
    settings = Settings()
    if args.store is not None:
        settings = settings.model_copy(update={"store_path": args.store})
    parent = os.getppid() if args.exit_with_parent else None
    if args.exit_with_parent:
        die_with_parent(signal.SIGTERM)
    from memplan.service.backends import (
        make_worker,  # the local worker, or Ray when settings name one
    )

    worker = make_worker(settings, parent_pid=parent)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
