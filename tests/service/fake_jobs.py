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
    if cfg.get("timeline"):
        _keep_timeline(ctx, int(cfg["timeline"]))
    return {"steps": steps, "pid": os.getpid(), "held": hold is not None, "echo": cfg.get("echo")}


def _keep_timeline(ctx, n_stages: int) -> None:
    """Keep a timeline artifact as the real run job does (timeline.json, memplan-timeline/1), for
    the sqrt plan of a small chain, with stand-in "measured" bytes (the prediction less 8 bytes
    on every third op, so a page drawing both can be told apart), and list the snapshot as absent."""
    from memplan.planner import plan as make_plan
    from memplan.planner.timeline import plan_timeline
    from memplan.profiler.schema import load_profile

    from tests.service.conftest import make_profile

    prof = load_profile(make_profile(n_stages))
    tl = plan_timeline(prof, make_plan(prof, strategy="sqrt"))
    measured = [b - 8 * (k % 3 == 2) for k, b in enumerate(tl.predicted_bytes)]
    tl = tl.model_copy(update={"measured_bytes": measured, "measured_device": "cpu"})
    ctx.keep_artifact("timeline.json", tl.model_dump_json(indent=1).encode(), "application/json")
    ctx.artifact_absent("snapshot.pickle", "a fake run: no CUDA allocator to record")


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
