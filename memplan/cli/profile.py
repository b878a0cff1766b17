"""`memplan profile`: measure a built-in model (or derive its profile from shapes) and write it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, console, echo_json, user_errors
from memplan.cli._remote import ServerOption, finished_result, remote


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
    dtype: Annotated[str, typer.Option(help="parameter dtype: float32, bfloat16")] = "float32",
    autocast: Annotated[str | None, typer.Option(help="measure under autocast: bfloat16 or float16")] = None,
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
    server: ServerOption = None,
) -> None:
    """Profile a built-in model: per-stage times, bytes and FLOPs (see docs/profiler.md)."""
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
    if analytic and autocast:
        raise ValueError("--autocast: the analytic profile covers parameters in --dtype only")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"--device: choose cpu or cuda, not {device!r}")

    from memplan.profiler.models import model_config

    cfg = model_config(model, **fields)
    if server:
        from memplan.profiler.schema import Profile

        job = remote(server).profile({"model": model, "config": fields, "analytic": analytic,
                                      "repeats": repeats, "warmup": warmup, "timing": timing,
                                      "device": device})
        prof = Profile.model_validate(finished_result(job))
    elif analytic:
        from memplan.profiler.analytic import conv_analytic_profile, gpt_analytic_profile

        fn = gpt_analytic_profile if model == "gpt" else conv_analytic_profile
        prof = fn(cfg, device=device, flops_per_s=flops_per_s, optimizer=optimizer, name=name)
    else:
        prof = _measure(model, cfg, device=device, repeats=repeats, warmup=warmup, timing=timing,
                        optimizer=optimizer, autocast=autocast, name=name)
    if out is not None:
        out.write_text(prof.model_dump_json(indent=1) + "\n")
    if json_out:
        echo_json(prof)
    else:
        _print_profile(prof, out)


def _measure(model, cfg, *, device, repeats, warmup, timing, optimizer, autocast, name):
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from memplan.profiler.measure import profile_chain
    from memplan.profiler.models import FAMILIES

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device: CUDA is not available on this machine; use --device cpu")
    import importlib

    module, _, builder = FAMILIES[model]
    stages, x = getattr(importlib.import_module(module), builder)(cfg, device=device)
    label = name or (f"{model}-{cfg.n_layer}x{cfg.n_embd}" if model == "gpt" else "resnet-like")
    with Progress(
        TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console(), transient=True,
    ) as bar:
        task = bar.add_task(label, total=len(stages))

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, description=f"{label}: {what}")

        return profile_chain(
            stages, x, device=device, repeats=repeats, warmup=warmup, timing=timing,
            optimizer=optimizer, autocast_dtype=autocast, name=label, progress=progress,
        )


def _print_profile(prof, out: Path | None) -> None:
    from rich.table import Table

    from memplan.units import format_bytes

    table = Table(title=f"{prof.name} on {prof.device} ({prof.dtype})")
    for col in ("stage", "name", "forward", "backward", "output", "saved", "fwd temp", "bwd temp", "GFLOP"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for i, layer in enumerate(prof.layers, start=1):
        table.add_row(
            str(i), layer.name, f"{layer.forward_s * 1e3:.3f} ms", f"{layer.backward_s * 1e3:.3f} ms",
            format_bytes(layer.output_bytes), format_bytes(layer.saved_bytes),
            format_bytes(layer.forward_temp_bytes), format_bytes(layer.backward_temp_bytes),
            f"{layer.flops / 1e9:.3g}",
        )
    c = console()
    c.print(table)
    c.print(
        f"input {format_bytes(prof.input_bytes)}, fixed {format_bytes(prof.fixed_bytes)} "
        f"(parameters, gradients, optimizer state, buffers)"
        + (f"; written to {out}" if out is not None else "")
    )
    fb = prof.meta.get("attention_fallback")
    if fb:
        c.print(f"[yellow]flash attention fell back to the math path: {'; '.join(fb)}[/yellow]")
