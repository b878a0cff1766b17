"""`memplan serve` stops on SIGTERM while a client follows a job's event stream (the web page
does), within MEMPLAN_SHUTDOWN_GRACE_S, and takes its worker with it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil

from tests.service.server import ROOT, Server, free_port


def test_sigterm_stops_the_server_while_an_event_stream_is_open(tmp_path):
    env = Server(tmp_path).env | {"MEMPLAN_SHUTDOWN_GRACE_S": "1"}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from memplan.cli import main; main()", "serve", "--port", str(port),
         "--data-dir", str(tmp_path), "--log-level", "warning"], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, "memplan serve exited at start"
            try:
                if httpx.get(url + "/v1/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        worker = httpx.get(url + "/v1/readyz", timeout=5).json()["worker_pid"]
        job = httpx.post(url + "/v1/runs", json={"steps": 600, "config": {"sleep_s": 0.1}},
                         timeout=10).json()
        got: list[bytes] = []

        def follow() -> None:  # a client that never leaves on its own
            try:
                with httpx.stream("GET", f"{url}/v1/runs/{job['id']}/events", timeout=None) as r:
                    for chunk in r.iter_bytes():
                        got.append(chunk)
            except httpx.HTTPError:
                pass

        threading.Thread(target=follow, daemon=True).start()
        while not got:  # the stream is open and has sent events
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # before: still serving 60 s later, until the client left
        assert time.monotonic() - t0 < 15
        psutil.wait_procs([psutil.Process(worker)], timeout=15) if psutil.pid_exists(worker) else None
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
