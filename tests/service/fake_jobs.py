"""Job functions for the service's tests: they exercise the queue's plumbing (progress, crashes,
cancel, restarts) without the profiler or executor, in milliseconds.

Selected with MEMPLAN_RUN_JOB=tests.service.fake_jobs:run and MEMPLAN_PROFILE_JOB=...:profile.
Each reads `config` from the request (RunRequest/ProfileRequest carry a free `config` dict).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def run(request: dict, ctx) -> dict:
    cfg = request.get("config", {})
    steps = int(request.get("steps", 3))
    delay = float(cfg.get("sleep_s", 0.02))
    hold = None
    if cfg.get("hold_mib"):
        hold = bytearray(int(cfg["hold_mib"]) << 20)  # memory the process holds until it ends
    if cfg.get("pid_file"):
        Path(str(cfg["pid_file"])).write_text(str(os.getpid()))
    if cfg.get("cuda_mib"):
        import torch

        hold = torch.empty(int(cfg["cuda_mib"]) << 20, dtype=torch.uint8, device="cuda")
    crash = cfg.get("crash")
    if crash == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if crash == "kill":  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if crash == "exit":
        os._exit(3)
    if cfg.get("fail"):
        raise ValueError("config.fail: this run was asked to fail")
    if cfg.get("bug"):
        raise RuntimeError("a bug in the job")
    for i in range(steps):
        time.sleep(delay)
        ctx.progress((i + 1) / steps, f"step {i + 1}/{steps}")
    return {"steps": steps, "pid": os.getpid(), "held": hold is not None, "echo": cfg.get("echo")}


def profile(request: dict, ctx) -> dict:
    n = int(request.get("config", {}).get("n_layer", 2))
    ctx.progress(0.5, "measuring")
    return {
        "input_bytes": 16,
        "layers": [
            {"name": f"block.{i}", "forward_s": 1e-3, "backward_s": 2e-3, "output_bytes": 64, "saved_bytes": 128}
            for i in range(n)
        ],
    }
