"""The API's side of the worker: start `python -m service.jobs.worker` and restart it if it dies."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from memplan.service.settings import Settings

__all__ = ["WorkerSupervisor"]

log = logging.getLogger(__name__)


class WorkerSupervisor:
    """Keeps one worker process alive beside the API (restarts with a growing back-off, at most
    10 s, back to 0.5 s after a worker that lived 10 s or more). The worker is started from this object's own thread, which lives as long as the API:
    the worker's parent-death signal is tied to that thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["MEMPLAN_STORE_PATH"] = str(self.settings.db_path)
        return subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "memplan.service.jobs.worker", "--exit-with-parent"], env=env
        )

    def _loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            self.proc = self._spawn()
            born = time.monotonic()
            log.info("worker started (pid %d)", self.proc.pid)
            while self.proc.poll() is None and not self._stop.is_set():
                self._stop.wait(0.5)
            if self._stop.is_set():
                break
            rc = self.proc.returncode
            self.restarts += 1
            if time.monotonic() - born >= 10.0:
                backoff = 0.5  # it had served a while: a new failure, not a crash loop
            log.warning("worker (pid %d) exited with %s; restarting in %.1f s", self.proc.pid, rc, backoff)
            self._stop.wait(backoff)
            backoff = min(10.0, backoff * 2)
        self._terminate()

    def _terminate(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.settings.cancel_grace_s + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop the worker (its running job goes back to the queue) and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.settings.cancel_grace_s + 20)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None
