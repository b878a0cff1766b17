"""`memplan size` (compute-optimal sizing by a scaling law) and `memplan fit` (fit a law to runs)."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, check_output_path, console, echo_json, user_errors
from memplan.cli._remote import ServerOption, remote

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_NUMBER = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*$")


def parse_count(text: str | None, *, field: str) -> float | None:
    """A positive count from '5.76e23', '70B', '1.4T' (K, M, B/G, T, P suffixes); None passes."""
    if text is None:
        return None
    m = _NUMBER.match(str(text))
    if not m:
        raise ValueError(f"{field}: cannot read {text!r} as a number; write e.g. 5.76e23, 70B or 1.4T")
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value == float("inf"):
        raise ValueError(f"{field}: {text!r} is past a float's range; give a finite number")
    if value <= 0:
        raise ValueError(f"{field}: must be greater than 0, got {text}")
    return value


def _progress(label: str):
    """A rich progress bar on stderr (shown only on a terminal) and its callback."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    bar = Progress(
        f"[bold]{label}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty(),
    )
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total or None)

    return bar, update


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.4g}{unit}"


def _print_sizing(s) -> None:
    from memplan.cli._tables import Col, fitted_table

    out = console()
    rows = [["parameters", _fmt(s.params)], ["tokens", _fmt(s.tokens)],
            ["tokens per parameter", f"{s.tokens_per_param:.3g}"],
            ["training FLOPs", f"{s.flops:.4g}"],
            ["loss (nats/token)", "-" if s.loss is None else f"{s.loss:.5g}"]]
    extra = s.model_dump()
    base = {"query", "law", "params", "tokens", "loss", "tokens_per_param", "flops", "warnings",
            "message"}
    for key, val in extra.items():
        if key in base or val is None or isinstance(val, (list, dict)):
            continue
        rows.append([key.replace("_", " "), f"{val:.4g}" if isinstance(val, float) else str(val)])
    out.print(fitted_table(f"{s.query} sizing ({s.law} law)", [Col("", number=False), Col("")],
                           rows, show_header=False))
    tradeoff = getattr(s, "tradeoff", None)
    if tradeoff:
        rows = [["any" if p.max_overhead is None else f"{p.max_overhead:.0%}", str(p.n_layer),
                 _fmt(p.params), "-" if p.recompute_overhead is None
                 else f"{p.recompute_overhead:.1%}"] for p in tradeoff]
        out.print(fitted_table("size against recompute overhead",
                               [Col("max overhead"), Col("layers"), Col("parameters"),
                                Col("overhead")], rows))
    if getattr(s, "query", None) == "fits":
        out.print(("[green]" if s.fits else "[red]") + s.message + ("[/green]" if s.fits else "[/red]"))
    for w in s.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    for note in getattr(s, "notes", []):
        out.print(f"note: {note}")


def _named(text: str) -> str:
    """`text` with the library's field names as this command's options, except in the prose
    "per device", "add devices" and "training tokens" (the words, not the options)."""
    return re.sub(r"(?<!per )(?<!add )(?<!training )\b(" + "|".join(_OPTION) + r")\b", lambda m: _OPTION[m.group(1)],
                  text)


# library (and API) names -> `memplan size` options, for error messages
_OPTION = {
    "compute_flops": "--compute", "target_loss": "--loss", "inference_tokens": "--inference-tokens",
    "unique_tokens": "--unique-tokens", "params": "--params", "tokens": "--tokens",
    "memory_bytes": "--memory", "device_memory_bytes": "--memory", "devices": "--devices",
    "n_devices": "--devices", "seq_len": "--seq-len", "micro_batch": "--micro-batch",
    "peak_flops": "--peak-tflops", "device": "--device", "utilization": "--utilization",
    "strategy": "--strategy", "max_overhead": "--max-overhead",
}
# options only memory-aware sizing reads (refused without --memory, NOTE [ every option answered
# or refused ] in planner/scaling/size.py)
_MEMORY_ONLY = ("--devices", "--seq-len", "--micro-batch", "--peak-tflops", "--device",
                "--utilization", "--strategy", "--max-overhead")


def parse_fraction(text: str | None, *, field: str) -> float | None:
    """A non-negative fraction from '0.3' or '30%'; 'none' for no limit (None passes)."""
    if text is None:
        return None
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"{field}: cannot read {text!r}; write e.g. 0.3 or 30% (or none)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{field}: must be a finite fraction of at least 0, got {text!r}")
    return value


def _print_remote(data: dict) -> None:
    """A server's sizing answer (plain JSON) as a two-column table."""
    from rich.table import Table

    table = Table(title=f"{data.get('query', '')} sizing ({data.get('law', '')} law)", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    for key, val in data.items():
        if key in ("query", "law") or val is None or isinstance(val, (list, dict)):
            continue
        table.add_row(key.replace("_", " "), f"{val:.4g}" if isinstance(val, float) else str(val))
    console().print(table)
    for w in data.get("warnings", []):
        console().print(f"[yellow]warning:[/yellow] {w}")


@app.command("size")
@user_errors
def size_cmd(
    compute: Annotated[str | None, typer.Option(help="training FLOPs, e.g. 5.76e23")] = None,
    params: Annotated[str | None, typer.Option(help="model size N (e.g. 70B): its D_opt and C")] = None,
    loss: Annotated[float | None, typer.Option(help="target loss: the cheapest (N, D) reaching it")] = None,
    inference_tokens: Annotated[
        str | None, typer.Option(help="tokens served after training (Sardana and Frankle 2023); "
                                 "with --compute or --loss")
    ] = None,
    unique_tokens: Annotated[
        str | None, typer.Option(help="unique tokens available (Muennighoff et al. 2023); with "
                                 "--compute, or with --params and --tokens for the loss")
    ] = None,
    tokens: Annotated[str | None, typer.Option(help="training tokens (with --params --unique-tokens)")] = None,
    memory: Annotated[
        str | None, typer.Option(help="device memory (e.g. 141GB): the largest compute-optimal "
                                 "model whose training step fits, planned")
    ] = None,
    devices: Annotated[int | None, typer.Option(help="devices (with --memory; default 1)")] = None,
    seq_len: Annotated[int | None, typer.Option(help="sequence length (with --memory; default 2048)")] = None,
    micro_batch: Annotated[
        int | None, typer.Option(help="sequences per device per step (with --memory; default 1)")
    ] = None,
    max_overhead: Annotated[
        str | None, typer.Option(help="largest recompute overhead a plan may cost (with --memory; "
                                 "0.3 or 30%, default 30%; 'none': any)")
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option(help="device peak TFLOP/s for the time estimate (default: by --device)")
    ] = None,
    device: Annotated[str | None, typer.Option(help="device name, e.g. H100, H200, A100-80GB")] = None,
    utilization: Annotated[
        float | None, typer.Option(help="fraction of peak FLOP/s achieved (with --memory; default 0.4)")
    ] = None,
    strategy: Annotated[
        str | None, typer.Option(help="checkpoint strategy (with --memory; default optimal)")
    ] = None,
    law: Annotated[
        str | None, typer.Option(help="epoch (default), hoffmann, hoffmann-tex, muennighoff "
                                 "(default with --unique-tokens), approach1")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    server: ServerOption = None,
) -> None:
    """Size a model by a scaling law: compute -> (N, D, loss), N -> (D, C), loss -> cheapest (N, D);
    inference-aware, data-constrained or memory-aware with the options (--memory alone: the
    largest model that fits; with --params, --compute or --loss: does that model fit)."""
    from memplan.planner import scaling
    from memplan.planner.scaling.errors import InfeasibleSizing
    from memplan.planner.scaling.size import MEMORY_DEFAULTS

    typed = {"--devices": devices, "--seq-len": seq_len, "--micro-batch": micro_batch,
             "--peak-tflops": peak_tflops, "--device": device, "--utilization": utilization,
             "--strategy": strategy, "--max-overhead": max_overhead}
    if memory is None:
        stray = [k for k in _MEMORY_ONLY if typed[k] is not None]
        if stray:
            raise ValueError(f"{stray[0]}: only with --memory (memory-aware sizing); give "
                             "--memory too, or leave it out")
    if peak_tflops is not None and not 0 < peak_tflops < float("inf"):  # in TFLOP/s, as typed
        raise ValueError(f"--peak-tflops: must be above 0 TFLOP/s and finite, got {peak_tflops:g}")
    if peak_tflops is not None and device is not None:
        raise ValueError("--peak-tflops: give --peak-tflops or --device, not both")
    cap = MEMORY_DEFAULTS["max_overhead"]
    if max_overhead is not None:
        cap = None if max_overhead.strip().lower() == "none" else parse_fraction(
            max_overhead, field="--max-overhead")

    C = parse_count(compute, field="--compute")
    N = parse_count(params, field="--params")
    D = parse_count(tokens, field="--tokens")
    U = parse_count(unique_tokens, field="--unique-tokens")
    D_inf = parse_count(inference_tokens, field="--inference-tokens")
    query = dict(
        compute_flops=C, params=N, target_loss=loss, tokens=D, inference_tokens=D_inf,
        unique_tokens=U, devices=1 if devices is None else devices,
        seq_len=2048 if seq_len is None else seq_len,
        micro_batch=1 if micro_batch is None else micro_batch,
        peak_flops=None if peak_tflops is None else peak_tflops * 1e12, device=device,
        utilization=0.4 if utilization is None else utilization,
        strategy=strategy or "optimal", max_overhead=cap, law=law,
    )
    if memory is not None:
        from memplan.planner.units import parse_bytes

        query["memory_bytes"] = parse_bytes(memory, field="--memory")
    if server:
        if max_overhead is not None:
            raise ValueError("--max-overhead: the server's sizing route takes no overhead cap "
                             "yet; size locally (leave out --server)")
        del query["max_overhead"]
        data = remote(server).sizing(**query)
        if json_out:
            echo_json(data)
        else:
            _print_remote(data)
        return
    bar, update = _progress("planning candidate sizes")
    with bar if memory is not None else contextlib.nullcontext():
        try:
            result = scaling.size(**query, progress=update if memory is not None else None)
        except scaling.ScalingError as err:  # name the CLI's options, not the library's
            text = _named(str(err))
            if isinstance(err, InfeasibleSizing):  # no model fits: infeasible, exit code 1
                typer.echo(f"infeasible: {text}", err=True)
                raise typer.Exit(1) from None
            raise ValueError(text) from None
    if json_out:
        echo_json(result)
    else:
        _print_sizing(result)
    if getattr(result, "fits", True) is False:  # the model asked about does not fit: exit 1
        raise typer.Exit(1)


@app.command("fit")
@user_errors
def fit_cmd(
    runs: Annotated[Path | None, typer.Argument(
        help="runs: CSV or JSON with params, tokens (or flops), loss")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="fit a data set shipped with memplan instead of RUNS: 'epoch' (Epoch AI's extraction "
             "of the Chinchilla runs, less its 5 outliers)")] = None,
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples for the intervals (0: none)")] = 0,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap")] = 0,
    confidence: Annotated[float, typer.Option(help="interval coverage")] = 0.95,
    compute: Annotated[
        list[str] | None, typer.Option(help="FLOPs to predict N_opt, D_opt, loss at (repeatable)")
    ] = None,
    method: Annotated[str, typer.Option(help="varpro (fast global search) or grid (Epoch's 4500 "
                                        "starts)")] = "varpro",
    alpha_equals_beta: Annotated[bool, typer.Option(help="fit one exponent for N and D")] = False,
    fixed_e: Annotated[float | None, typer.Option("--fixed-E", help="hold E at this value")] = None,
    drop_highest_loss: Annotated[int, typer.Option(help="leave out the k runs of highest loss")] = 0,
    params_column: Annotated[str, typer.Option(help="column holding N")] = "params",
    tokens_column: Annotated[str, typer.Option(help="column holding D")] = "tokens",
    flops_column: Annotated[str, typer.Option(help="column holding 6 N D (if no tokens)")] = "flops",
    loss_column: Annotated[str, typer.Option(help="column holding the final loss")] = "loss",
    plot: Annotated[Path | None, typer.Option(help="write a plot of the runs and the fit here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the fit as JSON")] = False,
    server: ServerOption = None,
) -> None:
    """Fit L = E + A/N^alpha + B/D^beta to RUNS (Huber on log loss, global search, bootstrap)."""
    from memplan.planner.scaling import fit_law, load_runs

    if (runs is None) == (dataset is None):
        raise ValueError("RUNS: give a file of runs or --dataset NAME (one of the two)")
    check_output_path(plot, "--plot")  # before the fit's bootstrap
    if dataset is not None:
        from memplan.data import load_dataset

        data = load_dataset(dataset)
    else:
        data = load_runs(runs, columns={"params": params_column, "tokens": tokens_column,
                                        "flops": flops_column, "loss": loss_column})
    if drop_highest_loss < 0:
        raise ValueError("--drop-highest-loss: must be at least 0")
    data = data.drop_highest_loss(drop_highest_loss)
    flops = [parse_count(c, field="--compute") for c in (compute or [])]
    if server:
        if plot is not None:
            raise ValueError("--plot: draw the plot locally (leave out --server)")
        rows = [{"params": float(n), "tokens": float(d), "loss": float(v)}
                for n, d, v in zip(data.params, data.tokens, data.loss, strict=True)]
        fitted = remote(server).fit({
            "runs": rows, "bootstrap": bootstrap, "seed": seed, "confidence": confidence,
            "flops": flops, "method": method, "alpha_equals_beta": alpha_equals_beta,
            "fixed_E": fixed_e,
        })
        from memplan.planner.scaling import FitResult

        result = FitResult.model_validate(fitted)
        if json_out:
            echo_json(result)
        else:
            _print_fit(result, None)
        return
    bar, update = _progress("bootstrap" if bootstrap else "fit")
    with bar:
        result = fit_law(data, method=method, alpha_equals_beta=alpha_equals_beta, fixed_E=fixed_e,
                         bootstrap=bootstrap, seed=seed, confidence=confidence, flops=flops,
                         progress=update)
    if plot is not None:
        from memplan.planner.scaling.plot import plot_fit

        plot_fit(data, result, plot)
    if json_out:
        echo_json(result)
        return
    _print_fit(result, plot)


def _print_fit(f, plot: Path | None) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"fit to {f.n_runs} runs ({f.method}, Huber delta {f.huber_delta:g})")
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    if f.intervals:
        table.add_column(f"{f.confidence:.0%} interval ({f.n_bootstrap} resamples)", justify="right")
    for k in ("E", "A", "B", "alpha", "beta", "params_exponent"):
        row = [k, f"{getattr(f, k):.5g}"]
        if f.intervals:
            lo, hi = f.intervals[k]
            row.append(f"{lo:.4g} .. {hi:.4g}")
        table.add_row(*row)
    out.print(table)
    for p in f.predictions:
        iv = ""
        if p.params_interval:
            iv = f" ({_fmt(p.params_interval[0])} .. {_fmt(p.params_interval[1])})"
        out.print(f"at {p.flops:.3g} FLOPs: N_opt {_fmt(p.params)}{iv}, D_opt {_fmt(p.tokens)}, "
                  f"{p.tokens_per_param:.3g} tokens/param, loss {p.loss:.4g}")
    for w in f.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    if plot is not None:
        out.print(f"plot written to {plot}")
