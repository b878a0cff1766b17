"""Admission of a job at submission: its config checked against the job function's typed config
(`configs.py`), and its memory and time estimated up front and refused when they exceed the
worker's limits (settings), each as a 422 naming the field, before anything is queued.

NOTE [ Which job functions are checked ]
A job function interprets its request's `config`; only the built-in ones are known here
(`DECLARED`, by their 'module:function' path). A server configured with other job functions
(the tests' fakes, a site's own) passes their `config` through unchecked beyond the request's own
schema: the function is the judge of its config, and the limits on the worker still apply (the
RSS limit and the time limit, worker.py).

NOTE [ The estimate of a job ]
From the analytic profile of the configuration (`memplan.profiler.analytic`: exact parameter,
gradient, optimizer and activation bytes from shapes; FLOPs) replayed by the simulator
(`memplan.planner.simulate`, store-all: the unplanned step, which every run and profile executes):
- memory, bytes: fixed_bytes + the store-all activation peak; a run adds a second fixed_bytes
  (the executor keeps a reference model and optimizer to compare gradients against). It leaves
  out the transient buffers of the framework, so it is below what the job will use: a job refused
  by it cannot fit. It is of the dense GPT with flash attention; a sweep model's features are not
  priced (MoE and the math path only add bytes; pruning, which removes some, is rare enough that
  a configuration refused near the limit can be sent without it).
- time, seconds: the store-all step's time at `job_cpu_flops_per_s` (or `job_gpu_flops_per_s`
  on cuda), times the steps a job executes (a profile: (repeats + warmup) passes; a run: the
  profile's `repeats + 1` passes, then `steps` x 2 steps, the planned one and the reference).
  The default rates are optimistic (above what one device sustains), so a job refused by time
  would not finish within its limit even at that rate.
The limit on memory is `job_max_bytes` (default 80% of this machine's physical memory), and on
cuda also the worker's probed device memory; the limit on time is the job's `timeout_s` when
given (at most `job_timeout_s`), else `job_timeout_s`.
A run also measures its plan's timeline op by op (`memplan.executor.timeline`, a warm-up step and
the measured one: two more passes). A Hugging Face run (`model: "hf"`) is priced from its
config's shapes: Llama-style decoders by `memplan.profiler.hf_config.hf_analytic_profile` (the
lean head where `config.lean_loss` asks for it, its backward without the logits' gradient where
`config.reuse_logits` does), GPT-2 by the built-in GPT's analytic profile of the same shapes (the
same layers: learned positions, LayerNorm, GELU MLP; its head keeps the full log-softmax, an
upper bound for a lean run); one model (no reference copy), and the passes `run_hf_config` makes
(3 profiling repeats and a warm-up, `steps` loop steps, a measured step and 2 timed ones).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from memplan.service.jobs.configs import PROFILE_CONFIGS, RUN_CONFIGS, SWEEP_CONFIGS
from memplan.service.settings import Settings
from pydantic import BaseModel, ValidationError

__all__ = ["JobEstimate", "AdmissionError", "DECLARED", "MEASURED_MAX_LAYERS", "admit", "estimate",
           "job_memory_limit", "physical_memory_bytes", "check_device", "check_features"]

log = logging.getLogger(__name__)

# blocks of a profile that is measured (executed); analytic ones may go to the config's bound
MEASURED_MAX_LAYERS = 1024

# 'module:function' of a built-in job function -> (its kind, the config models by model name)
DECLARED: dict[str, tuple[str, dict[str, type[BaseModel]]]] = {
    "memplan.service.jobs.kinds:run_job": ("run", RUN_CONFIGS),
    "memplan.service.jobs.kinds:profile_job": ("profile", PROFILE_CONFIGS),
    "memplan.executor.sweep:sweep_cell": ("sweep-cell", SWEEP_CONFIGS),
}


class AdmissionError(ValueError):
    """A job refused at submission: `field` (dotted, from the body) and what to do about it."""

    def __init__(self, field: str, message: str, *, kind: str = "validation") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class JobEstimate:
    """What a job will need at least: `memory_bytes` (bytes) and `time_s` (seconds), the parts of
    the time (`time_parts`: seconds per request field that drives it), and the limits it was held
    to (`memory_limit_bytes`, `time_limit_s`)."""

    memory_bytes: int
    time_s: float
    time_parts: dict[str, float]
    memory_limit_bytes: int | None
    time_limit_s: float
    device: str
    activation_bytes: int = 0  # of `memory_bytes`, the store-all activation peak


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where sysconf cannot tell)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def job_memory_limit(settings: Settings) -> int | None:
    """Bytes one job may use on this machine: `job_max_bytes`, else 80% of the physical memory
    (None when neither is known: no limit)."""
    if settings.job_max_bytes is not None:
        return settings.job_max_bytes
    phys = physical_memory_bytes()
    return int(phys * 0.8) if phys else None


def _config_error(err: ValidationError, prefix: str) -> AdmissionError:
    first = err.errors(include_url=False)[0]
    loc = [str(p) for p in first.get("loc", ())]
    msg = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden":
        msg = "not a setting of this model; remove it (see the config's schema in docs/service.md)"
    if not loc and first.get("type") == "value_error":
        # a model_validator's ValueError: 'Value error, field: what' names its own field
        text = msg.removeprefix("Value error, ")
        name, sep, rest = text.partition(": ")
        if sep and name.replace(".", "").replace("_", "").isalnum():
            return AdmissionError(f"{prefix}.{name}", rest)
        return AdmissionError(prefix, text)
    return AdmissionError(".".join([prefix, *loc]), msg)


def _typed_config(models: dict[str, type[BaseModel]], model: str, config: dict[str, Any], *,
                  model_field: str, config_field: str) -> BaseModel:
    if model not in models:
        raise AdmissionError(model_field, f"unknown model {model!r}; choose one of {', '.join(models)}")
    try:
        return models[model].model_validate(config, strict=True)
    except ValidationError as err:
        raise _config_error(err, config_field) from None


def _device(request: dict[str, Any], settings: Settings, worker_device: dict[str, Any] | None) -> str:
    if request.get("model") == "hf":
        return "cpu"  # NOTE [ Hugging Face runs run on the CPU ]
    device = request.get("device") or settings.device
    if device is None:
        device = "cuda" if (worker_device or {}).get("kind") == "cuda" else "cpu"
    return str(device)


def _hf_profile(cfg: BaseModel, dev: str):
    """The analytic profile of a Hugging Face run's model at its batch (NOTE [ The estimate of a job ])."""
    from memplan.profiler import analytic
    from memplan.profiler.hf_config import decoder_shape, hf_analytic_profile
    from memplan.profiler.schema import ProfileError
    from pydantic import ValidationError

    try:
        shape = decoder_shape(cfg.hf_config)
        if shape.family != "gpt2":
            return hf_analytic_profile(shape, seq_len=cfg.seq, batch_size=cfg.batch_size, device=dev,
                                       lean_loss=bool(getattr(cfg, "lean_loss", False)),
                                       reuse_logits=bool(getattr(cfg, "reuse_logits", False)))
        return analytic.gpt_analytic_profile(
            {"n_layer": shape.n_layer, "n_embd": shape.hidden_size, "n_head": shape.n_head,
             "block_size": cfg.seq, "vocab_size": shape.vocab_size, "batch_size": cfg.batch_size,
             "ffn_hidden": shape.intermediate_size, "tie_weights": shape.tie_embeddings}, device=dev)
    except ValidationError as err:  # a size past the profile's ceilings (2^58 bytes): far past any limit
        msg = str(err.errors(include_url=False)[0].get("msg", err)).removeprefix("Value error, ")
        raise AdmissionError("body.config.batch_size", f"the run's activations at batch_size x seq are past "
                             f"what memplan counts ({msg}); make batch_size or seq smaller",
                             kind="too-large") from None
    except ProfileError as err:
        name, sep, rest = str(err).partition(": ")
        if sep and name.startswith("config."):  # decoder_shape's names are the config's fields
            raise AdmissionError(f"body.config.hf_{name}", rest) from None
        if sep and name.replace(", ", "").replace("_", "").isalnum():
            raise AdmissionError("body.config.batch_size", f"{name}: {rest}", kind="too-large") from None
        raise AdmissionError("body.config.hf_config", str(err)) from None


def _analytic_profile(kind: str, model: str, cfg: BaseModel, request: dict[str, Any], device: str):
    from memplan.profiler import analytic

    dev = "cuda" if device.startswith("cuda") else "cpu"
    if model == "hf":
        return _hf_profile(cfg, dev)
    c = cfg.model_dump()
    if kind == "profile":
        if model == "gpt":
            return analytic.gpt_analytic_profile({**c, "exit_layers": tuple(c["exit_layers"])}, device=dev)
        return analytic.conv_analytic_profile({**c, "channels": tuple(c["channels"]),
                                               "blocks": tuple(c["blocks"])}, device=dev)
    if model == "gpt":  # runs and sweep cells: executor.pipeline's GPT (dropout does not change bytes here)
        fields = {k: c[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size", "batch_size")}
        return analytic.gpt_analytic_profile(fields, device=dev)
    return analytic.conv_analytic_profile({"blocks": (c["n_layer"],) * 3, "batch_size": c["batch_size"]},
                                          device=dev)


def estimate(kind: str, model: str, cfg: BaseModel, request: dict[str, Any], settings: Settings,
             *, worker_device: dict[str, Any] | None = None) -> JobEstimate:
    """The least memory (bytes) and time (seconds) the job needs, and its limits (see the NOTE)."""
    from memplan.planner.simulate import simulate
    from memplan.planner.store_all import plan_store_all

    device = _device(request, settings, worker_device)
    prof = _analytic_profile(kind, model, cfg, request, device)
    plan = plan_store_all(prof)
    sim = simulate(prof, plan.schedule)
    rate = settings.job_gpu_flops_per_s if device.startswith("cuda") else settings.job_cpu_flops_per_s
    # the analytic profile's times are at its own rate (its default); rescale to the worker's
    step_s = sim.time_s * (prof.meta.get("flops_per_s", 1e12) / rate)
    fixed = prof.fixed_bytes
    memory = fixed + sim.peak_bytes
    if kind == "profile":
        parts = {"body.repeats": step_s * (int(request.get("repeats", 5)) + int(request.get("warmup", 2)))}
    elif model == "hf":  # run_hf_config: profile (3 + 1), the loop, measure_step (1 + 2)
        parts = {"body.config": step_s * (4 + 3), "body.steps": step_s * int(request.get("steps", 3))}
    else:
        repeats = int(getattr(cfg, "repeats", 3))
        memory += fixed  # the reference model and optimizer (a built-in run; not a Hugging Face one)
        parts = {"body.config.repeats": step_s * (repeats + 1 + (2 if kind == "run" else 0)),
                 "body.steps": step_s * 2 * int(request.get("steps", 2 if kind == "sweep-cell" else 3))}
    limit_mem = job_memory_limit(settings)
    total = (worker_device or {}).get("total_bytes")
    if device.startswith("cuda") and isinstance(total, int) and total > 0:
        limit_mem = min(limit_mem, total) if limit_mem is not None else total
    asked = request.get("timeout_s")
    limit_t = min(settings.job_timeout_s, float(asked)) if asked else settings.job_timeout_s
    return JobEstimate(memory_bytes=int(memory), time_s=float(sum(parts.values())), time_parts=parts,
                       memory_limit_bytes=limit_mem, time_limit_s=limit_t, device=device,
                       activation_bytes=int(sim.peak_bytes))


def _gib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**30:.3g} GiB)"


def _secs(s: float) -> str:
    """Seconds for a message: whole above 100, else three significant figures (never '0')."""
    return f"{s:,.0f}" if s >= 100 else f"{s:.3g}"


def _check_hf_run(request: dict[str, Any], cfg: BaseModel, settings: Settings) -> None:
    """The run settings a Hugging Face run (executor.install.run_hf_config) does not take, and a
    model whose fp32 weights, gradients and AdamW state alone (16 bytes a parameter, counted from
    the config's shapes) are over the job memory limit."""
    if request.get("features"):
        raise AdmissionError("body.features", "a Hugging Face run takes the model its config describes; "
                             "features apply to the built-in GPT (model gpt): remove them")
    if request.get("autocast_dtype"):
        raise AdmissionError("body.autocast_dtype", "a Hugging Face run trains in fp32 (as memplan run "
                             "--hf-config); remove autocast_dtype")
    device = request.get("device")
    if device not in (None, "cpu"):
        raise AdmissionError("body.device", "a Hugging Face run runs on the CPU in this build "
                             "(NOTE [ Hugging Face runs run on the CPU ] in service/jobs/kinds.py); "
                             "ask for cpu or leave it null")
    from memplan.profiler.hf_config import CONFIG_DTYPES, decoder_shape, n_params
    from memplan.profiler.schema import ProfileError

    # what the job would fail on only once it builds the model (torch-free checks: this process
    # does not import torch; an unknown activation or model_type fails the job with one line,
    # executor.install.hf_config_of)
    for key in ("torch_dtype", "dtype"):
        v = cfg.hf_config.get(key)
        if v is not None and v not in CONFIG_DTYPES:
            raise AdmissionError(f"body.config.hf_config.{key}", f"{v!r} is not a torch dtype; use "
                                 "one of " + ", ".join(sorted(CONFIG_DTYPES)) + " or leave it out")
    try:
        shape = decoder_shape(cfg.hf_config)
    except ProfileError:
        return  # the estimate names the field (_hf_profile)
    if shape.n_layer < 2:
        raise AdmissionError("body.config.hf_config", f"{shape.n_layer} decoder layer(s); memplan plans a "
                             "chain of two or more blocks, so give 2 or more")
    states = 16 * n_params(shape)
    limit = job_memory_limit(settings)
    if limit is not None and states > limit:
        raise AdmissionError("body.config.hf_config", f"the model's fp32 parameters, gradients and AdamW "
                             f"state alone are {_gib(states)}, over the job memory limit of {_gib(limit)} "
                             "(MEMPLAN_JOB_MAX_BYTES); give a smaller model (layers, width, vocabulary)",
                             kind="too-large")


def _check_host_memory(request: dict[str, Any], settings: Settings) -> None:
    """A run's `host_memory_bytes` (the host memory its plan may fill with offloaded activations)
    within the job memory limit: the worker stops a job whose memory passes that limit, so a plan
    allowed more host memory than that could be stopped mid-step. Raises AdmissionError."""
    host = request.get("host_memory_bytes")
    if host is None or not request.get("offload_bandwidth"):
        return  # most requests: no need to read the machine's memory for the limit
    limit = job_memory_limit(settings)
    if limit is None or host <= limit:
        return
    raise AdmissionError("body.host_memory_bytes", f"the plan may keep up to {_gib(host)} of activations "
                         f"in host memory, over the job memory limit of {_gib(limit)} (MEMPLAN_JOB_MAX_BYTES), "
                         f"where the worker stops the job; give at most {limit:,} bytes", kind="too-large")


# NOTE [ Device and features at submission ]
# A run's or sweep's `device` and `features` are refused here, naming the field, rather than failing
# every job later (executor.pipeline refuses them only after the model is built):
# - device: null, "cpu", "cuda" or "cuda:<index>" (what executor.pipeline.run_builtin takes; "cpu:0",
#   "meta", "tpu" are not). A cuda device is refused when the server is known to have none: its
#   MEMPLAN_DEVICE is cpu, or its worker probed a CPU (NOTE [ Which job functions are checked ]
#   does not apply: the device is the server's, whichever function runs the job). With neither
#   known (no worker has reported yet, or a Ray cluster), it is accepted and the job reports.
# - features (built-in job functions only): known names (executor.features.check_features), and
#   none on the conv model (executor.pipeline builds them into the GPT alone; qat quantizes Linear
#   layers, which the conv model has none of between its first and last stage).
_CUDA_DEVICE = re.compile(r"cuda(:[0-9]{1,3})?")


def check_device(device: str | None, settings: Settings, worker_device: dict[str, Any] | None, *,
                 field: str = "body.device") -> None:
    """Refuse a device a job could not run on (NOTE [ Device and features at submission ]).
    Raises AdmissionError naming `field`."""
    if device is None or device == "cpu":
        return
    if not _CUDA_DEVICE.fullmatch(device):
        raise AdmissionError(field, f"unknown device {device!r}; use cpu, cuda or cuda:<index>, or leave "
                             "it null for the server's device")
    server = str(settings.device or "")
    probed = (worker_device or {}).get("kind")
    if server.startswith("cpu") or (not server and probed == "cpu"):
        raise AdmissionError(field, f"this server has no CUDA device ({'MEMPLAN_DEVICE=' + server if server else 'its worker probed a CPU'}); "
                             "use cpu, or leave it null for the server's device", kind="unavailable")


def check_features(model: str, features: list[str], *, field: str = "body.features") -> None:
    """Refuse unknown features, ones that do not go together, and any on the conv model
    (NOTE [ Device and features at submission ]). Raises AdmissionError naming `field`."""
    from memplan.executor.features import check_features as known_features

    try:
        known_features(features, model)
    except ValueError as err:
        raise AdmissionError(field, str(err).removeprefix("--features: ")) from None


def _request_features(kind: str, request: dict[str, Any], model_prefix: str) -> tuple[list[str], str]:
    """A run's `features` (a list) or a sweep cell's `config.features` (comma-separated), and the
    field that names them."""
    if kind == "sweep-cell":
        raw = (request.get("config") or {}).get("features")
        return (raw.split(",") if isinstance(raw, str) else []), f"{model_prefix}.config.features"
    return list(request.get("features") or []), "body.features"


def admit(kind: str, request: dict[str, Any], settings: Settings, *, job_path: str,
          worker_device: dict[str, Any] | None = None, model_prefix: str = "body") -> JobEstimate | None:
    """Check a job's request before it is queued: `timeout_s` within `job_timeout_s`; for a
    built-in job function, `model` known, `config` valid for it, and the estimate within the
    limits. Returns the estimate (None for an unchecked job function, or an analytic profile,
    which executes nothing). Raises AdmissionError
    naming the field: `body.<field>`, except `model` and `config` which are named under
    `model_prefix` (a sweep's `body.models.<k>`)."""
    prefix = "body"
    asked = request.get("timeout_s")
    if asked is not None and asked > settings.job_timeout_s:
        raise AdmissionError(f"{prefix}.timeout_s", f"at most the server's job_timeout_s "
                             f"({settings.job_timeout_s:g} s), got {asked:g}")
    if kind in ("run", "sweep-cell") and request.get("model") != "hf":  # hf: _check_hf_run
        check_device(request.get("device"), settings, worker_device)
    declared = DECLARED.get(job_path)
    if declared is None or declared[0] != kind:
        return None
    model = request.get("model", "gpt")
    cfg = _typed_config(declared[1], model, dict(request.get("config") or {}),
                        model_field=f"{model_prefix}.model", config_field=f"{model_prefix}.config")
    if kind in ("run", "sweep-cell") and model != "hf":
        features, field = _request_features(kind, request, model_prefix)
        check_features(model, features, field=field)
    if kind == "run" and model == "hf":
        _check_hf_run(request, cfg, settings)
    if kind == "profile" and request.get("analytic"):
        return None  # derived from shapes: nothing is executed, nothing to estimate
    depth = getattr(cfg, "n_layer", 0)
    if kind == "profile" and depth > MEASURED_MAX_LAYERS:
        raise AdmissionError(f"{model_prefix}.config.n_layer", f"a measured profile has at most "
                             f"{MEASURED_MAX_LAYERS:,} blocks, got {depth:,}; ask for analytic: true")
    _check_host_memory(request, settings)
    est = estimate(kind, model, cfg, request, settings, worker_device=worker_device)
    if est.memory_limit_bytes is not None and est.memory_bytes > est.memory_limit_bytes and model == "hf":
        model_alone = est.memory_bytes - est.activation_bytes
        field = "hf_config" if model_alone > est.memory_limit_bytes else "batch_size"
        raise AdmissionError(
            f"{model_prefix}.config.{field}",
            f"the run needs at least {_gib(est.memory_bytes)} on cpu ({_gib(model_alone)} of parameters, "
            f"gradients and AdamW state, the rest activations at batch_size x seq), over the limit of "
            f"{_gib(est.memory_limit_bytes)} (MEMPLAN_JOB_MAX_BYTES); "
            + ("give a smaller model (layers, width, vocabulary)" if field == "hf_config"
               else "make batch_size or seq smaller"), kind="too-large")
    if est.memory_limit_bytes is not None and est.memory_bytes > est.memory_limit_bytes:
        raise AdmissionError(
            f"{model_prefix}.config",
            f"the job needs at least {_gib(est.memory_bytes)} on {est.device} (parameters, gradients, "
            f"optimizer state and activations of the configuration), over the limit of "
            f"{_gib(est.memory_limit_bytes)} (MEMPLAN_JOB_MAX_BYTES or the device's memory); make "
            "n_layer, n_embd, block_size or batch_size smaller", kind="too-large")
    if est.time_s > est.time_limit_s:
        field = max(est.time_parts, key=est.time_parts.__getitem__)
        if field.startswith("body.config"):
            field = model_prefix + field.removeprefix("body")
        raise AdmissionError(
            field, f"the job needs at least {_secs(est.time_s)} s at "
            f"{settings.job_gpu_flops_per_s if est.device.startswith('cuda') else settings.job_cpu_flops_per_s:.3g}"
            f" FLOP/s, over its time limit of {est.time_limit_s:g} s (timeout_s or MEMPLAN_JOB_TIMEOUT_S); "
            "ask for fewer repeats or steps, or a smaller model", kind="too-long")
    return est
