"""The job functions the worker runs (each in its own runner process): `fn(request, ctx) -> model`.

They only call the library, as `memplan run` and `memplan profile` do:
- `run_job`: `memplan.executor.pipeline.run_builtin` (build a built-in model, profile, plan, run, compare),
  then `memplan.executor.timeline.builtin_timeline` (the plan's memory op by op, kept as the job's
  artifact `timeline.json`; on CUDA with the allocator's snapshot, `snapshot.pickle`); or, for
  `model: "hf"`, `memplan.executor.install.run_hf_config` (a Hugging Face model from its config);
- `profile_job`: `memplan.profiler.models.build_model` + `memplan.profiler.measure.profile_chain`, or the analytic
  profile (`memplan.profiler.analytic`) when `analytic` is true.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

from memplan.service.jobs.artifacts import SNAPSHOT, TIMELINE

__all__ = ["run_job", "profile_job", "resolve_device", "keep_run_artifacts"]

log = logging.getLogger(__name__)


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


_OFFLOAD = ("offload_bandwidth", "host_memory_bytes")  # RunRequest's, RunSpec's and run_hf_config's


def _offload(request: dict[str, Any]) -> dict[str, Any]:
    """The request's offload options (bytes/s, bytes), those given."""
    return {key: request[key] for key in _OFFLOAD if request.get(key) is not None}


def run_job(request: dict[str, Any], ctx: Any) -> Any:
    """A validation run: returns the executor's `RunReport` (with the profile and plan in extras),
    or for `model: "hf"` the `HFRun` of `run_hf_config` as a dict. Keeps the run's measured
    timeline (and on CUDA its allocator snapshot) as the job's artifacts (`keep_run_artifacts`)."""
    from memplan.executor.pipeline import RunSpec, run_builtin

    if request.get("model") == "hf":
        return _run_hf(request, ctx)
    known = {f.name for f in dataclasses.fields(RunSpec)}
    top = {"model", "budget_bytes", "strategy", "features", "steps", *_OFFLOAD}  # the body's own fields
    fields: dict[str, Any] = {"model": request.get("model", "gpt")}
    for key, value in (request.get("config") or {}).items():
        if key not in known or key in top:
            raise ValueError(f"config.{key}: not a model setting of a run; known: "
                             f"{', '.join(sorted(known - top))}")
        fields[key] = value
    fields.update(budget_bytes=request.get("budget_bytes"), features=tuple(request.get("features") or ()),
                  steps=request.get("steps", 3), autocast_dtype=request.get("autocast_dtype"),
                  **_offload(request))
    if request.get("strategy"):
        fields["strategy"] = request["strategy"]
    device = resolve_device(request.get("device"), ctx.device)
    if "device" in known:
        fields["device"] = device
    elif device != "cpu":
        raise ValueError("device: this build's executor pipeline runs on the CPU only; ask for cpu")
    phases = {"profile": (0.0, 0.4), "run": (0.4, 0.95)}  # then the timeline

    def progress(phase: str, done: int, total: int) -> None:
        lo, hi = phases.get(phase, (0.0, 1.0))
        ctx.progress(lo + (hi - lo) * (done / total if total else 0.0), f"{phase} {done}/{total}")

    spec = RunSpec(**fields)
    report, profile, plan = run_builtin(spec, progress=progress)
    keep_run_artifacts(ctx, spec, profile, plan)
    extras = dict(getattr(report, "extras", {}) or {})
    extras.update(profile=profile.model_dump(mode="json"), plan=plan.model_dump(mode="json"))
    return report.model_copy(update={"extras": extras})


def keep_run_artifacts(ctx: Any, spec: Any, profile: Any, plan: Any) -> list[Any]:
    """Measure `plan` op by op on the run's model (`builtin_timeline`: the same seeded model, one
    warm-up step and the measured one) and keep the timeline as the artifact `timeline.json`
    (memplan-timeline/1) and, on CUDA, the measured step's allocator history as `snapshot.pickle`
    (for https://pytorch.org/memory_viz); on the CPU the snapshot is listed as absent with the
    reason. Returns the `ArtifactInfo`s recorded ([] where `ctx` keeps no artifacts: a backend
    whose context has no `keep_artifact`)."""
    if not hasattr(ctx, "keep_artifact"):
        log.info("this backend's job context keeps no artifacts; the run's timeline is not kept")
        return []
    from memplan.executor.timeline import builtin_timeline

    if not plan.schedule:
        return [ctx.artifact_absent(TIMELINE, "the plan has no schedule (infeasible): nothing was run"),
                ctx.artifact_absent(SNAPSHOT, "the plan has no schedule (infeasible): nothing was run")]
    ctx.progress(0.96, "measuring the timeline op by op", force=True)
    on_cuda = str(spec.device).startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="memplan-job-") as tmp:
        snap = Path(tmp) / SNAPSHOT if on_cuda else None
        try:
            timeline = builtin_timeline(spec, profile, plan, snapshot=snap)
        except Exception as err:  # noqa: BLE001 - the run's answer stands without its timeline
            log.warning("the run's timeline could not be measured: %s: %s", type(err).__name__, err)
            why = f"measuring the plan op by op failed: {type(err).__name__}: {err}"
            return [ctx.artifact_absent(TIMELINE, why), ctx.artifact_absent(SNAPSHOT, why)]
        out = [ctx.keep_artifact(TIMELINE, (timeline.model_dump_json(indent=1) + "\n").encode(),
                                 "application/json")]
        if snap is not None and snap.is_file():
            out.append(ctx.keep_artifact(SNAPSHOT, snap.read_bytes(), "application/octet-stream"))
        elif on_cuda:
            out.append(ctx.artifact_absent(SNAPSHOT, "the allocator wrote no snapshot for the measured step"))
        else:
            out.append(ctx.artifact_absent(
                SNAPSHOT, f"the run was on {spec.device}: an allocator snapshot records CUDA's caching "
                "allocator (torch.cuda.memory._record_memory_history); timeline.json is this run's record"))
    return out


def _run_hf(request: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """NOTE [ Hugging Face runs run on the CPU ]
    A run job with `model: "hf"` is `memplan run --hf-config`: `run_hf_config` builds the model
    from `config.hf_config` (random weights, nothing downloaded), installs the plan for
    `budget_bytes` with `strategy`, runs `steps` AdamW steps and measures one more. It builds the
    model and its batches on the CPU (executor/install.py takes no device), so these runs run on
    the CPU whatever the server's device; admission refuses another `device` (422 on body.device).
    The plan is installed into the model, not run by the executor's schedule runner, so there is
    no op-by-op timeline to keep: the artifacts list says so, and the result holds the measured
    and predicted peaks. Returns the `HFRun` as a dict."""
    from memplan.executor.install import run_hf_config

    cfg = dict(request.get("config") or {})
    ctx.progress(0.05, "building the model from its config")
    run = run_hf_config(dict(cfg["hf_config"]), batch_size=int(cfg.get("batch_size", 4)),
                        seq=int(cfg.get("seq", 64)), budget=request.get("budget_bytes"),
                        strategy=request.get("strategy") or "optimal", steps=int(request.get("steps", 3)),
                        lean_loss=bool(cfg.get("lean_loss", False)),
                        reuse_logits=bool(cfg.get("reuse_logits", False)), **_offload(request))
    if hasattr(ctx, "artifact_absent"):
        why = ("a Hugging Face run installs its plan into the model (auto_checkpoint); the executor's "
               "op-by-op measurement needs the built-in models' stages; the result has the measured peak")
        ctx.artifact_absent(TIMELINE, why)
        ctx.artifact_absent(SNAPSHOT, "a Hugging Face run runs on the CPU (NOTE [ Hugging Face runs run "
                                      "on the CPU ] in service/jobs/kinds.py)")
    ctx.progress(1.0, "done", force=True)
    return {"kind": "hf", **run.as_dict()}


def profile_job(request: dict[str, Any], ctx: Any) -> Any:
    """A profile of a built-in model configuration: returns the `Profile`."""
    from memplan.profiler.models import FAMILIES, model_config

    model = request.get("model", "gpt")
    # the configs' list fields (channels, blocks, exit_layers) are tuples in their dataclasses
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in (request.get("config") or {}).items()}
    cfg = model_config(model, **fields)
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
