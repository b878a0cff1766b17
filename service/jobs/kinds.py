"""The job functions the worker runs (each in its own runner process): `fn(request, ctx) -> model`.

They only call the library, as `memplan run` and `memplan profile` do:
- `run_job`: `memplan.executor.pipeline.run_builtin` (build a built-in model, profile, plan, run, compare);
- `profile_job`: `memplan.profiler.models.build_model` + `memplan.profiler.measure.profile_chain`, or the analytic
  profile (`memplan.profiler.analytic`) when `analytic` is true.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["run_job", "profile_job", "resolve_device"]


def resolve_device(requested: str | None, ctx_device: str | None) -> str:
    """The request's device, else the server's (MEMPLAN_DEVICE), else cuda when there is one."""
    device = requested or ctx_device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device: choose cpu or cuda[:i], not {device!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device: CUDA is not available on this server; use cpu")
    return device


def run_job(request: dict[str, Any], ctx: Any) -> Any:
    """A validation run: returns the executor's `RunReport` (with the profile and plan in extras)."""
    from memplan.executor.pipeline import RunSpec, run_builtin

    known = {f.name for f in dataclasses.fields(RunSpec)}
    fields: dict[str, Any] = {"model": request.get("model", "gpt")}
    for key, value in (request.get("config") or {}).items():
        if key not in known or key in ("model", "budget_bytes", "strategy", "features", "steps"):
            raise ValueError(f"config.{key}: not a model setting of a run; known: "
                             f"{', '.join(sorted(known - {'model', 'budget_bytes', 'strategy', 'features', 'steps'}))}")
        fields[key] = value
    fields.update(budget_bytes=request.get("budget_bytes"), features=tuple(request.get("features") or ()),
                  steps=request.get("steps", 3), autocast_dtype=request.get("autocast_dtype"))
    if request.get("strategy"):
        fields["strategy"] = request["strategy"]
    device = resolve_device(request.get("device"), ctx.device)
    if "device" in known:
        fields["device"] = device
    elif device != "cpu":
        raise ValueError("device: this build's executor pipeline runs on the CPU only; ask for cpu")
    phases = {"profile": (0.0, 0.4), "run": (0.4, 1.0)}

    def progress(phase: str, done: int, total: int) -> None:
        lo, hi = phases.get(phase, (0.0, 1.0))
        ctx.progress(lo + (hi - lo) * (done / total if total else 0.0), f"{phase} {done}/{total}")

    report, profile, plan = run_builtin(RunSpec(**fields), progress=progress)
    extras = dict(getattr(report, "extras", {}) or {})
    extras.update(profile=profile.model_dump(mode="json"), plan=plan.model_dump(mode="json"))
    return report.model_copy(update={"extras": extras})


def profile_job(request: dict[str, Any], ctx: Any) -> Any:
    """A profile of a built-in model configuration: returns the `Profile`."""
    from memplan.profiler.models import FAMILIES, model_config

    model = request.get("model", "gpt")
    cfg = model_config(model, **(request.get("config") or {}))
    if request.get("analytic"):
        from memplan.profiler import analytic

        fn = analytic.gpt_analytic_profile if model == "gpt" else analytic.conv_analytic_profile
        ctx.progress(0.5, "deriving from shapes")
        return fn(cfg, device=request.get("device") or ctx.device or "cpu")
    import importlib

    from memplan.profiler.measure import profile_chain

    device = resolve_device(request.get("device"), ctx.device)
    module, _, builder = FAMILIES[model]
    stages, x = getattr(importlib.import_module(module), builder)(cfg, device=device)
    return profile_chain(
        stages, x, device=device, repeats=request.get("repeats", 5), warmup=request.get("warmup", 2),
        timing=request.get("timing", "chain"), name=model, autocast_dtype=request.get("dtype") if request.get("dtype") not in (None, "float32") else None,
        progress=lambda done, total, what: ctx.progress(done / total if total else 0.0, f"profiling {what}"),
    )
