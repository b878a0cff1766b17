"""`memplan profile`: measure a built-in model (or derive its profile from shapes) and write it."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import (
    LeanLossOption,
    ReuseLogitsOption,
    app,
    check_output_path,
    console,
    echo_json,
    user_errors,
)
from memplan.cli._remote import ServerOption, finished_result, remote

# the library's field names -> this command's options, for error messages (NOTE: a message
# "field: ..." or "field, other: ..." names the option the user typed, never an internal field)
_GPT_OPTIONS = {
    "block_size": "--seq", "batch_size": "--batch", "flops_per_s": "--flops-per-s",
    "optimizer": "--optimizer", "moe_capacity_factor": "--capacity-factor", "n_layer": "--n-layer",
    "n_embd": "--d-model", "n_head": "--n-head", "vocab_size": "--vocab", "dropout": "--dropout",
    "attention": "--attention", "moe_experts": "--moe-experts", "moe_top_k": "--moe-top-k",
    "exit_layers": "--exit-layers", "tie_weights": "--tie-weights", "channels": "--channels",
    "blocks": "--blocks", "image_size": "--image-size", "dtype": "--dtype", "precision": "--precision",
    "device": "--device", "name": "--name", "timing": "--timing", "repeats": "--repeats",
    "warmup": "--warmup",
}
_HF_OPTIONS = {
    "seq_len": "--seq", "batch_size": "--batch", "attention": "--attention", "precision": "--precision",
    "config": "--hf-config", "tp": "--tp", "sp": "--sp", "cp": "--cp", "flops_per_s": "--flops-per-s",
    "optimizer": "--optimizer", "device": "--device", "name": "--name", "repeats": "--repeats",
    "warmup": "--warmup", "lean_loss": "--lean-loss", "reuse_logits": "--reuse-logits",
}


def option_error(text: str, options: dict[str, str]) -> str:
    """`text` ("field: ...", "field, other: ..." or "config.key: ...") with each leading field that
    `options` maps named as its command-line option instead (config.key -> --hf-config.key)."""
    head, sep, rest = text.partition(":")
    if not sep or head.startswith("-") or " " in head.replace(", ", ","):
        return text
    names = []
    for part in head.split(", "):
        base, dot, sub = part.partition(".")
        if base not in options:
            return text
        names.append(options[base] + dot + sub)
    return ", ".join(names) + sep + rest


def _ints(text: str | None, *, field: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{field}: expected comma-separated integers such as 1,3, got {text!r}") from None


@app.command("profile")
@user_errors
def profile_cmd(
    model: Annotated[str, typer.Option(help="built-in family: gpt or conv")] = "gpt",
    hf_config: Annotated[
        Path | None, typer.Option(help="a Hugging Face decoder's config.json instead of --model "
                                  "(Llama, Mistral, Qwen2/3, Gemma/Gemma2, Mixtral; measured only: "
                                  "GPT-2; --seq, --batch, --attention sdpa or eager); without "
                                  "--analytic: built with random weights and measured")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="gpt sizes: gpt2, gpt2-medium, gpt2-large, gpt2-xl")
    ] = None,
    n_layer: Annotated[int | None, typer.Option(help="gpt: blocks")] = None,
    d_model: Annotated[int | None, typer.Option(help="gpt: width")] = None,
    n_head: Annotated[int | None, typer.Option(help="gpt: attention heads")] = None,
    seq: Annotated[int | None, typer.Option(help="gpt: sequence length")] = None,
    vocab: Annotated[int | None, typer.Option(help="gpt: vocabulary size")] = None,
    batch: Annotated[int | None, typer.Option(help="batch size")] = None,
    dropout: Annotated[float | None, typer.Option(help="gpt: dropout")] = None,
    attention: Annotated[str | None, typer.Option(help="gpt: flash or math")] = None,
    moe_experts: Annotated[int | None, typer.Option(help="gpt: experts (0: dense MLP)")] = None,
    moe_top_k: Annotated[int | None, typer.Option(help="gpt: experts per token")] = None,
    capacity_factor: Annotated[float | None, typer.Option(help="gpt: expert capacity factor")] = None,
    exit_layers: Annotated[str | None, typer.Option(help="gpt: blocks followed by an exit head, e.g. 1,3")] = None,
    tie_weights: Annotated[bool | None, typer.Option("--tie-weights/--no-tie-weights", help="gpt: tie embedding and head")] = None,
    channels: Annotated[str | None, typer.Option(help="conv: channels per group, e.g. 16,32,64")] = None,
    blocks: Annotated[str | None, typer.Option(help="conv: blocks per group, e.g. 2,2,2")] = None,
    image_size: Annotated[int | None, typer.Option(help="conv: image height and width")] = None,
    dtype: Annotated[str | None, typer.Option(help="parameter dtype: float32 (default), bfloat16")] = None,
    autocast: Annotated[str | None, typer.Option(help="measure under autocast: bfloat16 or float16")] = None,
    precision: Annotated[
        str | None, typer.Option(help="precision policy: fp32, bf16-mixed, fp16-mixed, bf16 (sets "
                                 "the parameter dtype and autocast; AdamW state as the policy keeps it)")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    analytic: Annotated[bool, typer.Option("--analytic", help="derive from shapes, do not run")] = False,
    flops_per_s: Annotated[float, typer.Option(help="--analytic: throughput for times")] = 1e12,
    repeats: Annotated[int, typer.Option(help="timed runs per stage (median)")] = 5,
    warmup: Annotated[int, typer.Option(help="untimed runs per stage first")] = 2,
    timing: Annotated[str, typer.Option(help="chain: time stages inside passes over the whole chain, as a step runs them; stage: each stage alone")] = "chain",
    optimizer: Annotated[str, typer.Option(help="adamw, adam, sgd-momentum, sgd, none")] = "adamw",
    name: Annotated[str | None, typer.Option(help="profile name")] = None,
    out: Annotated[Path | None, typer.Option(help="write the profile JSON here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    tp: Annotated[int, typer.Option(help="--hf-config --analytic: tensor-parallel degree (one "
                                    "GPU's share of each stage)")] = 1,
    sp: Annotated[bool, typer.Option("--sp", help="--hf-config --analytic: sequence parallelism "
                                     "with --tp")] = False,
    cp: Annotated[int, typer.Option(help="--hf-config --analytic: context-parallel degree")] = 1,
    policies: Annotated[bool, typer.Option(
        "--policies", help="measured profiles: also measure each stage's save policies "
        "(selective recompute: docs/chain-model.md section 10.8)")] = False,
    lean: LeanLossOption = False,  # --hf-config only
    reuse: ReuseLogitsOption = False,
    server: ServerOption = None,
) -> None:
    """Profile a built-in model: per-stage times, bytes and FLOPs (see docs/profiler.md)."""
    check_output_path(out, "--out")  # before profiling, which may take minutes
    from memplan.profiler.schema import ProfileError, check_flops_per_s

    try:  # before either path: the measured ones do not read it
        check_flops_per_s(flops_per_s)
    except ProfileError as err:
        raise ValueError(option_error(str(err), _GPT_OPTIONS)) from None
    if hf_config is not None:
        prof = _hf_profile(hf_config, analytic=analytic, seq=seq, batch=batch, precision=precision,
                           attention=attention, device=device, optimizer=optimizer,
                           flops_per_s=flops_per_s, repeats=repeats, warmup=warmup, name=name,
                           parallel={"tp": tp, "sp": sp, "cp": cp}, policies=policies, lean=lean,
                           reuse=reuse, others={"--model": model if model != "gpt" else None, "--preset": preset,
                                   "--n-layer": n_layer, "--d-model": d_model, "--n-head": n_head,
                                   "--vocab": vocab, "--dtype": dtype, "--autocast": autocast,
                                   "--server": server})
        _emit(prof, out, json_out)
        return
    if (tp, sp, cp) != (1, False, 1):
        raise ValueError("--tp, --sp, --cp: only with --hf-config CONFIG.json --analytic")
    if lean or reuse:
        flag = "--lean-loss" if lean else "--reuse-logits"
        raise ValueError(f"{flag}: only with --hf-config CONFIG.json (a Hugging Face model's "
                         "loss); the built-in GPT's head keeps its own")
    dtype, autocast = _policy_dtypes(precision, dtype, autocast)
    if capacity_factor is not None and not (math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ValueError(f"--capacity-factor: must be a finite number > 0, got {capacity_factor:g}")
    from memplan.profiler.hf_config import MAX_LAYERS

    if n_layer is not None and n_layer > MAX_LAYERS:
        raise ValueError(f"--n-layer: at most {MAX_LAYERS:,} blocks (memplan's ceiling, docs/profiler.md), "
                         f"got {n_layer:,}")
    try:
        prof = _builtin_profile(
            model, dtype=dtype, autocast=autocast, preset=preset, n_layer=n_layer, d_model=d_model,
            n_head=n_head, seq=seq, vocab=vocab, batch=batch, dropout=dropout, attention=attention,
            moe_experts=moe_experts, moe_top_k=moe_top_k, capacity_factor=capacity_factor,
            exit_layers=exit_layers, tie_weights=tie_weights, channels=channels, blocks=blocks,
            image_size=image_size, precision=precision, device=device, analytic=analytic,
            flops_per_s=flops_per_s, repeats=repeats, warmup=warmup, timing=timing,
            optimizer=optimizer, name=name, policies=policies, server=server)
    except ValueError as err:
        raise ValueError(option_error(str(err), _GPT_OPTIONS)) from None
    _emit(prof, out, json_out)


def _builtin_profile(model, *, dtype, autocast, preset, n_layer, d_model, n_head, seq, vocab, batch,
                     dropout, attention, moe_experts, moe_top_k, capacity_factor, exit_layers,
                     tie_weights, channels, blocks, image_size, precision, device, analytic,
                     flops_per_s, repeats, warmup, timing, optimizer, name, policies, server):
    """The profile of built-in `model` (gpt or conv) as `memplan profile` asks for it."""
    fields: dict = {"dtype": dtype}
    if model == "gpt":
        from memplan.profiler.models.gpt import GPT2_SIZES

        if preset is not None:
            if preset not in GPT2_SIZES:
                raise ValueError(f"--preset: choose one of {', '.join(GPT2_SIZES)}, not {preset!r}")
            fields.update(GPT2_SIZES[preset])
        given = {
            "n_layer": n_layer, "n_embd": d_model, "n_head": n_head, "block_size": seq,
            "vocab_size": vocab, "batch_size": batch, "dropout": dropout, "attention": attention,
            "moe_experts": moe_experts, "moe_top_k": moe_top_k,
            "moe_capacity_factor": capacity_factor, "exit_layers": _ints(exit_layers, field="--exit-layers"),
            "tie_weights": tie_weights,
        }
        conv_only = {"--channels": channels, "--blocks": blocks, "--image-size": image_size}
    elif model == "conv":
        given = {
            "channels": _ints(channels, field="--channels"), "blocks": _ints(blocks, field="--blocks"),
            "image_size": image_size, "batch_size": batch,
        }
        conv_only = {"--preset": preset, "--n-layer": n_layer, "--d-model": d_model, "--n-head": n_head,
                     "--seq": seq, "--vocab": vocab, "--moe-experts": moe_experts, "--exit-layers": exit_layers}
    else:
        raise ValueError(f"--model: choose gpt or conv, not {model!r}")
    wrong = [k for k, v in conv_only.items() if v is not None]
    if wrong:
        raise ValueError(f"{wrong[0]}: not an option of --model {model}")
    fields.update({k: v for k, v in given.items() if v is not None})
    if analytic and autocast and precision is None:
        raise ValueError("--autocast: the analytic profile takes --precision bf16-mixed or "
                         "fp16-mixed for autocast, not --autocast")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"--device: choose cpu or cuda, not {device!r}")

    from memplan.profiler.models import model_config

    cfg = model_config(model, **fields)
    if server:
        from memplan.profiler.schema import Profile

        if precision is not None:
            raise ValueError("--precision: the server's profile route takes no policy yet; "
                             "profile locally (leave out --server)")
        if policies:
            raise ValueError("--policies: the server's profile route measures no save policies "
                             "yet; profile locally (leave out --server)")
        job = remote(server).profile({"model": model, "config": fields, "analytic": analytic,
                                      "repeats": repeats, "warmup": warmup, "timing": timing,
                                      "device": device})
        prof = Profile.model_validate(finished_result(job))
    elif analytic:
        if policies:
            raise ValueError("--policies: save policies are measured, not derived; leave out "
                             "--analytic")
        from memplan.profiler.analytic import conv_analytic_profile, gpt_analytic_profile

        fn = gpt_analytic_profile if model == "gpt" else conv_analytic_profile
        prof = fn(cfg, device=device, flops_per_s=flops_per_s, optimizer=optimizer, name=name,
                  precision=precision)
    else:
        prof = _measure(model, cfg, device=device, repeats=repeats, warmup=warmup, timing=timing,
                        optimizer=optimizer, autocast=autocast, name=name, policies=policies)
    return prof


def _emit(prof, out: Path | None, json_out: bool) -> None:
    """Write the profile to `out` (when given), then print it as JSON or as a table."""
    if out is not None:
        out.write_text(prof.model_dump_json(indent=1) + "\n")
    if json_out:
        echo_json(prof)
    else:
        _print_profile(prof, out)


def _hf_profile(path: Path, *, analytic, seq, batch, precision, attention, device, optimizer,
                flops_per_s, repeats, warmup, name, others, parallel=None, policies=False,
                lean=False, reuse=False):
    """The profile of the Hugging Face decoder `path` describes: analytic
    (memplan.profiler.hf_config.hf_analytic_profile) or measured on a model built from it."""
    from memplan.cli._app import read_json
    from memplan.profiler import hf_config as hf

    given = [k for k, v in others.items() if v is not None]
    if given:
        raise ValueError(f"{given[0]}: not an option with --hf-config (the config sets the model; "
                         "--precision sets the dtypes)")
    if seq is None:
        raise ValueError("--seq: give the sequence length for --hf-config (e.g. --seq 4096)")
    cfg = read_json(path, what="--hf-config")
    if not isinstance(cfg, dict):
        raise ValueError(f"--hf-config: {path} holds no JSON object; give a config.json")
    kw = dict(seq_len=seq, batch_size=1 if batch is None else batch, precision=precision or "fp32",
              attention=attention or "sdpa", optimizer=optimizer, name=name, lean_loss=lean,
              reuse_logits=reuse)
    try:
        defaults = {"tp": 1, "sp": False, "cp": 1}
        split = {k: v for k, v in (parallel or {}).items() if v != defaults[k]}
        if analytic:
            if policies:
                raise ValueError("--policies: save policies are measured, not derived; leave out "
                                 "--analytic")
            return hf.hf_analytic_profile(cfg, flops_per_s=flops_per_s, device=device, **kw, **split)
        if split:
            raise ValueError(f"--{next(iter(split))}: one GPU's share is derived, not measured; "
                             "add --analytic")
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ValueError("--device: CUDA is not available on this machine; use --device cpu")
        with _progress_bar(f"{cfg.get('model_type', 'hf')} from {path.name}") as progress:
            return hf.measure_hf_config(cfg, device=device, repeats=repeats, warmup=warmup,
                                        policies=policies, progress=progress, **kw)
    except ValueError as err:
        raise ValueError(option_error(str(err), _HF_OPTIONS)) from None


def _policy_dtypes(precision: str | None, dtype: str | None,
                   autocast: str | None) -> tuple[str, str | None]:
    """(parameter dtype, autocast dtype or None) from --precision, --dtype and --autocast; a
    policy and a dtype that disagree is bad input naming both."""
    if precision is None:
        return dtype or "float32", autocast
    from memplan.profiler.precision import policy_dtypes

    try:
        param, compute = policy_dtypes(precision)
    except ValueError as err:
        raise ValueError(f"--{err}") from None
    want = compute if compute != param else None
    if dtype is not None and dtype != param:
        raise ValueError(f"--dtype: {precision} keeps parameters in {param}, not {dtype}; "
                         "leave out --dtype (the policy sets it)")
    if autocast is not None and autocast != want:
        raise ValueError(f"--autocast: {precision} computes in {compute}"
                         + (" under autocast" if want else " without autocast")
                         + "; leave out --autocast (the policy sets it)")
    return param, want


def _measure(model, cfg, *, device, repeats, warmup, timing, optimizer, autocast, name,
             policies=False):
    import torch

    from memplan.profiler.measure import profile_chain
    from memplan.profiler.models import FAMILIES

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device: CUDA is not available on this machine; use --device cpu")
    import importlib

    module, _, builder = FAMILIES[model]
    stages, x = getattr(importlib.import_module(module), builder)(cfg, device=device)
    label = name or (f"{model}-{cfg.n_layer}x{cfg.n_embd}" if model == "gpt" else "resnet-like")
    with _progress_bar(label) as progress:
        return profile_chain(
            stages, x, device=device, repeats=repeats, warmup=warmup, timing=timing,
            optimizer=optimizer, autocast_dtype=autocast, name=label, progress=progress,
            policies=policies,
        )


@contextlib.contextmanager
def _progress_bar(label: str):
    """A transient bar of stages measured: yields `progress(done, total, what)` for
    `profile_chain`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console(), transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{label}: {what}")

        yield progress


def _print_profile(prof, out: Path | None) -> None:
    from memplan.cli._tables import Col, fitted_table
    from memplan.planner.units import format_bytes

    cols = [Col("stage"), Col("name", number=False), Col("fwd ms"), Col("bwd ms", drop=1),
            Col("output"), Col("saved"), Col("fwd temp", drop=3), Col("bwd temp", drop=4),
            Col("GFLOP", drop=2)]
    rows = [
        [str(i), layer.name, f"{layer.forward_s * 1e3:.4g}", f"{layer.backward_s * 1e3:.4g}",
         format_bytes(layer.output_bytes), format_bytes(layer.saved_bytes),
         format_bytes(layer.forward_temp_bytes), format_bytes(layer.backward_temp_bytes),
         f"{layer.flops / 1e9:.4g}"]
        for i, layer in enumerate(prof.layers, start=1)
    ]
    table = fitted_table(f"{prof.name} on {prof.device} ({prof.dtype})", cols, rows)
    c = console()
    c.print(table)
    c.print(
        f"input {format_bytes(prof.input_bytes)}, fixed {format_bytes(prof.fixed_bytes)} "
        f"(parameters, gradients, optimizer state, buffers)"
        + (f"; written to {out}" if out is not None else "")
    )
    c.print(_assumed(prof))
    fb = prof.meta.get("attention_fallback")
    if fb:
        c.print(f"[yellow]flash attention fell back to the math path: {'; '.join(fb)}[/yellow]")


def _assumed(prof) -> str:
    """One line: the precision policy and optimizer the profile's fixed bytes assume, with the
    bytes a parameter (weights, gradients, optimizer state)."""
    from memplan.planner.precision import profile_policy

    meta = prof.meta if isinstance(prof.meta, dict) else {}
    fixed = meta.get("fixed") or {}
    text = f"precision {profile_policy(prof) or 'unknown'} (compute {prof.dtype})"
    text += f", optimizer {meta.get('optimizer', 'unknown')}"
    n = fixed.get("n_params")
    if n:
        state = sum(int(fixed.get(k, 0)) for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
        text += f": {state / n:.4g} bytes a parameter for {n:,} parameters"
    return text
