"""`memplan capacity`: will a Hugging Face decoder train on these GPUs (memplan.planner.capacity)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import (
    LeanLossOption,
    ReuseLogitsOption,
    app,
    console,
    echo_json,
    read_json,
    user_errors,
)

# capacity's fields -> this command's options, for error messages
_OPTION = {"memory_bytes": "--memory", "seq_len": "--seq", "micro_batch": "--batch", "batch_size": "--batch", "n_gpus": "--gpus",
           "zero_stage": "--zero-stage", "max_overhead": "--max-overhead", "precision": "--precision",
           "device": "--device", "attention": "--attention", "utilization": "--utilization",
           "optimizer": "--optimizer", "tp": "--tp", "sp": "--sp", "cp": "--cp", "pp": "--pp",
           "micro_batches": "--micro-batches", "virtual_stages": "--virtual-stages",
           "intra_node_bandwidth": "--intra-node-bandwidth",
           "inter_node_bandwidth": "--inter-node-bandwidth", "gpus_per_node": "--gpus-per-node",
           "lean_loss": "--lean-loss", "reuse_logits": "--reuse-logits"}


@app.command("capacity")
@user_errors
def capacity_cmd(
    config: Annotated[Path, typer.Argument(help="the model's Hugging Face config.json")],
    memory: Annotated[str | None, typer.Option(help="memory of one GPU: 80GB, 80GiB, ...")] = None,
    device: Annotated[
        str | None, typer.Option(help="GPU preset: a100-40gb, a100-80gb, h100, h200, l40s, rtx4090, "
                                 "mi300x (memory unless --memory, and peak FLOP/s)")
    ] = None,
    precision: Annotated[str, typer.Option(help="fp32, bf16-mixed, fp16-mixed, bf16")] = "bf16-mixed",
    seq: Annotated[int, typer.Option(help="tokens per sequence")] = 4096,
    batch: Annotated[int, typer.Option(help="micro-batch: sequences per GPU per step")] = 1,
    gpus: Annotated[int, typer.Option(help="all GPUs: data parallel x tp x cp x pp")] = 1,
    zero_stage: Annotated[int, typer.Option(help="ZeRO stage 0-3 (3: FSDP full shard)")] = 0,
    tp: Annotated[int, typer.Option(help="tensor-parallel GPUs (divides the heads and MLP width)")] = 1,
    sp: Annotated[bool, typer.Option("--sp", help="sequence parallelism over the tp GPUs")] = False,
    cp: Annotated[int, typer.Option(help="context-parallel GPUs (divides --seq)")] = 1,
    pp: Annotated[int, typer.Option(help="pipeline stages (1F1B)")] = 1,
    micro_batches: Annotated[
        int | None, typer.Option(help="micro-batches a step (pipeline M; default --pp)")
    ] = None,
    virtual_stages: Annotated[
        int, typer.Option(help="model chunks per pipeline rank (more than 1: interleaved 1F1B)")
    ] = 1,
    intra_node_bandwidth: Annotated[
        str | None, typer.Option(help="bytes/s each way between a node's GPUs: 450GB (step time)")
    ] = None,
    inter_node_bandwidth: Annotated[
        str | None, typer.Option(help="bytes/s each way per GPU across nodes: 50GB (step time)")
    ] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs a node holds (default 8)")] = None,
    max_overhead: Annotated[
        str | None, typer.Option(help="most recompute allowed: 0.3 or 30% of the step")
    ] = None,
    attention: Annotated[str, typer.Option(help="sdpa (flash kernel) or eager")] = "sdpa",
    optimizer: Annotated[str, typer.Option(help="adamw, adam, sgd-momentum, sgd, none")] = "adamw",
    utilization: Annotated[float, typer.Option(help="fraction of peak FLOP/s (step time only)")] = 0.4,
    lean: LeanLossOption = False,
    reuse: ReuseLogitsOption = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Does CONFIG train within --memory per GPU? Exit 0 when it fits, 1 when not, 2 bad input."""
    from memplan.cli.plan import parse_fraction
    from memplan.cli.profile import option_error
    from memplan.planner.capacity import capacity
    from memplan.planner.schema import PlanError
    from memplan.planner.units import parse_bytes
    from memplan.profiler.schema import ProfileError

    cfg = read_json(config, what="config")
    if not isinstance(cfg, dict):
        raise ValueError(f"config: {config} holds no JSON object; give a Hugging Face config.json")
    request = {"config": cfg, "precision": precision, "seq_len": seq, "micro_batch": batch,
               "n_gpus": gpus, "zero_stage": zero_stage, "attention": attention,
               "optimizer": optimizer, "utilization": utilization, "device": device, "tp": tp,
               "sp": sp, "cp": cp, "pp": pp, "micro_batches": micro_batches,
               "virtual_stages": virtual_stages, "gpus_per_node": gpus_per_node, "lean_loss": lean,
               "reuse_logits": reuse}
    for key, value, flag in (("intra_node_bandwidth", intra_node_bandwidth, "--intra-node-bandwidth"),
                             ("inter_node_bandwidth", inter_node_bandwidth, "--inter-node-bandwidth")):
        if value is not None:
            request[key] = parse_bytes(value, field=flag)
    if memory is not None:
        request["memory_bytes"] = parse_bytes(memory, field="--memory")
    if max_overhead is not None:
        request["max_overhead"] = parse_fraction(max_overhead, "--max-overhead")
        if request["max_overhead"] > 10:  # CapacityRequest's bound, said in the units typed
            raise ValueError(f"--max-overhead: at most 10 (1000%) of the store-all step time, got "
                             f"{request['max_overhead']:g} ({max_overhead})")
    try:
        answer = capacity(request)
    except (PlanError, ProfileError) as err:  # the library's field names -> this command's options
        raise ValueError(option_error(str(err), _OPTION)) from None
    if json_out:
        echo_json(answer)
    else:
        _print(answer)
    if not answer.fits:
        raise typer.Exit(1)


def _print(a) -> None:
    from memplan.cli._tables import Col, fitted_table
    from memplan.planner.units import format_bytes

    c = console()
    where = f"{a.n_gpus} x {format_bytes(a.memory_bytes)}" + (f", ZeRO-{a.zero_stage}" if a.zero_stage else "")
    par = a.parallel
    split = [f"{k}={par[k]}" for k in ("tp", "cp", "pp") if par.get(k, 1) > 1]
    split += ["sp"] if par.get("sp") else []
    split += [f"interleaved x{par['virtual_stages']}"] if par.get("virtual_stages", 1) > 1 else []
    if split:
        where += f" ({', '.join(split)}, dp={par['dp']}, {par['micro_batches']} micro-batches a step)"
    c.print(f"{a.model}: {a.n_params:,} parameters ({a.n_active_params:,} active), {a.precision}, "
            f"micro-batch {a.micro_batch} x {a.seq_len} tokens on {where}")
    c.print(("[green]" if a.fits else "[red]") + a.message + ("[/green]" if a.fits else "[/red]"))
    c.print(f"model states {format_bytes(a.model_state_bytes)} a GPU; activations "
            f"{format_bytes(a.activation_peak_bytes)} planned, {format_bytes(a.store_all_activation_bytes)} "
            f"if nothing is recomputed"
            + (f"; communication buffers {format_bytes(a.comm_buffer_bytes)}" if a.comm_buffer_bytes else ""))
    if a.step_time_s is not None:
        st = a.step
        comm = ", ".join(f"{k} {st[f'{k}_comm_s']:.3g} s" for k in ("tp", "cp", "pp", "dp")
                         if st.get(f"{k}_comm_s"))
        c.print(f"step {a.step_time_s:.3g} s: compute {st['compute_s']:.3g} s at "
                f"{a.assumptions['utilization']:.0%} of peak" + (f", {comm}" if comm else "")
                + (f", bubble {st['bubble_fraction']:.0%}" if st.get("bubble_fraction") else "")
                + " (no overlap)")
    c.print(f"max micro-batch {a.max_micro_batch}{'+' if a.max_micro_batch_capped else ''}, "
            f"max sequence {a.max_seq_len}{'+' if a.max_seq_len_capped else ''} tokens, fewest GPUs "
            f"{a.min_gpus if a.min_gpus is not None else 'none' + (' (ZeRO 0 does not shard)' if a.zero_stage == 0 else '')}")
    if a.policies:
        cols = [Col("policy", number=False), Col("B/param"), Col("states/GPU"), Col("act. store-all"),
                Col("fits", number=False), Col("recompute", drop=1), Col("max micro-batch")]
        rows = [[r.precision, str(r.bytes_per_param), format_bytes(r.model_state_bytes),
                 format_bytes(r.store_all_activation_bytes), "yes" if r.fits else "no",
                 "-" if r.overhead is None else f"+{100 * r.overhead:.1f}%", str(r.max_micro_batch)]
                for r in a.policies]
        c.print(fitted_table("per precision policy", cols, rows))
