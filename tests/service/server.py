"""A uvicorn server on 127.0.0.1 and a free port, in its own process, for the service's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`uvicorn service.app:app` with its own store under `data_dir` and `env` on top of ours."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {
            **os.environ,
            "MEMPLAN_DATA_DIR": str(data_dir),
            "MEMPLAN_RUN_JOB": "tests.service.fake_jobs:run",
            "MEMPLAN_PROFILE_JOB": "tests.service.fake_jobs:profile",
            "MEMPLAN_HEARTBEAT_S": "0.2",
            "MEMPLAN_WORKER_STALE_S": "2",
            "MEMPLAN_CANCEL_GRACE_S": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log = data_dir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, ready: bool = True, timeout_s: float = 60.0) -> Server:
        self.port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")  # noqa: SIM115 - the child writes to it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "memplan.service.app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        path = "/v1/readyz" if ready else "/v1/healthz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not {'ready' if ready else 'up'} in {timeout_s} s:\n{self.log.read_text()}")

    def worker_pid(self) -> int | None:
        r = httpx.get(self.url + "/v1/readyz", timeout=5)
        return r.json().get("worker_pid")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


TERMINAL = ("succeeded", "failed", "cancelled")


def wait_finished(client, path: str, *, timeout_s: float = 30.0, every_s: float = 0.05) -> dict:
    """GET `path` (a job) until its state is terminal; returns the job."""
    return wait_for(lambda: (j := client.get(path).json())["state"] in TERMINAL and j,
                    timeout_s=timeout_s, every_s=every_s, what=f"{path} to finish")


def process_gone(pid: int) -> bool:
    """True once no process has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for(predicate, *, timeout_s: float = 30.0, every_s: float = 0.05, what: str = "condition"):
    """Poll `predicate()` until it returns a truthy value (returned), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)
