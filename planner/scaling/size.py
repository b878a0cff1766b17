"""One entry for every sizing query: the options name the question (the CLI's `memplan size` and
the service's `GET /v1/sizing` both call this, so they cannot disagree).

    memory_bytes       -> memory_aware_size (the largest model that fits)
                          or memory_fit (with params, compute_flops or target_loss: does the
                          model they give fit, with which recompute, the largest batch and sequence)
    unique_tokens      -> data_constrained_optimal (with compute_flops)
                          or data_constrained_loss (with params and tokens)
    inference_tokens   -> inference_aware (with compute_flops or target_loss)
    otherwise exactly one of compute_flops, params, target_loss
                       -> compute_optimal, optimal_for_params, cheapest_for_loss

NOTE [ every option answered or refused ]
An option the chosen query does not read is refused (ScalingError naming it and the query), never
ignored: a sizing that silently dropped `params` answered another question than the one asked.
The memory-only options (devices, seq_len, micro_batch, strategy, max_overhead, peak_flops,
device, utilization) count as given when they differ from their defaults (the service always
passes them); the CLI refuses them when typed at all.

NOTE [ sizing errors name the inputs ]
The queries' own errors name the quantities they compute: `flops` (from target_loss, or params x
tokens), `inference_flops` and `total_flops` (from inference_tokens), `epochs` and the effective
sizes (from unique_tokens), or a result model's field when the answer overflows a float. The
caller gave other options, so `size` names the option each comes from (`_SOURCES`; `flops` by the
question's input, `_question`), an answer that overflows names the inputs it was asked with, and
an answer of less than one parameter or one token (compute_flops=1e-300: 7.9e-156 parameters) is
refused as params=1e-300 is: sizing below one parameter means nothing. The CLI and the service
then name their own spelling of those options.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from memplan.planner.scaling.data_constrained import data_constrained_loss, data_constrained_optimal
from memplan.planner.scaling.errors import InfeasibleSizing, ScalingError
from memplan.planner.scaling.inference import inference_aware
from memplan.planner.scaling.laws import Law
from memplan.planner.scaling.memory_aware import MAX_OVERHEAD
from memplan.planner.scaling.queries import cheapest_for_loss, compute_optimal, optimal_for_params
from pydantic import BaseModel, ValidationError

__all__ = ["size", "MEMORY_DEFAULTS"]

# the options only memory-aware sizing reads, and their defaults
MEMORY_DEFAULTS: dict[str, object] = {
    "devices": 1, "seq_len": 2048, "micro_batch": 1, "strategy": "optimal",
    "max_overhead": MAX_OVERHEAD, "peak_flops": None, "device": None, "utilization": 0.4,
}


def _refuse(given: dict[str, object], allowed: set[str], query: str) -> None:
    """ScalingError naming the first given option outside `allowed` for `query`."""
    extra = [k for k in given if k not in allowed]
    if extra:
        raise ScalingError(f"{extra[0]}: not an option of {query}; leave it out, or ask another "
                           "question (see `memplan size --help`)")


def _answer(o: dict) -> BaseModel:
    """`size` of the options `o` (its keywords), before its errors are named by the inputs."""
    compute_flops, params, target_loss = o["compute_flops"], o["params"], o["target_loss"]
    tokens, inference_tokens, unique_tokens = o["tokens"], o["inference_tokens"], o["unique_tokens"]
    memory_bytes, devices, seq_len, micro_batch = (o["memory_bytes"], o["devices"], o["seq_len"],
                                                   o["micro_batch"])
    peak_flops, device, utilization = o["peak_flops"], o["device"], o["utilization"]
    strategy, max_overhead, law, progress = o["strategy"], o["max_overhead"], o["law"], o["progress"]
    values = dict(compute_flops=compute_flops, params=params, target_loss=target_loss,
                  tokens=tokens, inference_tokens=inference_tokens, unique_tokens=unique_tokens)
    given = {k: v for k, v in values.items() if v is not None}
    memory_opts = dict(devices=devices, seq_len=seq_len, micro_batch=micro_batch,
                       strategy=strategy, max_overhead=max_overhead, peak_flops=peak_flops,
                       device=device, utilization=utilization)
    if memory_bytes is not None:
        model = [k for k in ("params", "compute_flops", "target_loss") if k in given]
        _refuse(given, {"params", "compute_flops", "target_loss"}, "memory-aware sizing (it "
                "takes the model from params, compute_flops or target_loss)")
        if len(model) > 1:
            raise ScalingError(f"{model[1]}: memory-aware sizing takes one model size; give one "
                               f"of params, compute_flops or target_loss (got {', '.join(model)})")
        opts = dict(n_devices=devices, law=law, seq_len=seq_len, micro_batch=micro_batch,
                    device=device, peak_flops=peak_flops, utilization=utilization,
                    strategy=strategy, max_overhead=max_overhead, progress=progress)
        if not model:
            from memplan.planner.scaling.memory_aware import memory_aware_size

            return memory_aware_size(memory_bytes, **opts)
        from memplan.planner.scaling.memory_fit import memory_fit

        if params is not None:
            n = params
        elif compute_flops is not None:
            n = compute_optimal(compute_flops, law=law).params
        else:
            n = cheapest_for_loss(target_loss, law=law).params  # type: ignore[arg-type]
        return memory_fit(n, memory_bytes, **opts)
    changed = [k for k, v in memory_opts.items() if v != MEMORY_DEFAULTS[k]]
    if changed:
        raise ScalingError(f"{changed[0]}: only memory-aware sizing reads it; give memory_bytes "
                           "too, or leave it out")
    if unique_tokens is not None:
        if compute_flops is not None:
            _refuse(given, {"compute_flops", "unique_tokens"},
                    "data-constrained sizing with compute_flops")
            return data_constrained_optimal(compute_flops, unique_tokens, law=law)
        if params is not None and tokens is not None:
            _refuse(given, {"params", "tokens", "unique_tokens"},
                    "the data-constrained loss of params and tokens")
            return data_constrained_loss(params, tokens, unique_tokens, law=law)
        raise ScalingError("unique_tokens: give compute_flops (the best N, D), or params and "
                           "tokens (their loss)")
    if inference_tokens is not None:
        if (compute_flops is None) == (target_loss is None):
            raise ScalingError("inference_tokens: give one of compute_flops or target_loss")
        _refuse(given, {"inference_tokens", "compute_flops", "target_loss"},
                "inference-aware sizing")
        return inference_aware(inference_tokens, target_loss=target_loss, flops=compute_flops,
                               law=law)
    if tokens is not None:
        raise ScalingError("tokens: only with params and unique_tokens (the data-constrained "
                           "loss); leave it out")
    main = [k for k in ("compute_flops", "params", "target_loss") if k in given]
    if len(main) != 1:
        raise ScalingError(
            f"{main[1] if len(main) > 1 else 'compute_flops'}: give exactly one of compute_flops, "
            "params or target_loss" + (f" (got {', '.join(main)})" if main else "")
        )
    if compute_flops is not None:
        return compute_optimal(compute_flops, law=law)
    if params is not None:
        return optimal_for_params(params, law=law)
    return cheapest_for_loss(target_loss, law=law)  # type: ignore[arg-type]


# the quantities queries compute -> the option they come from (NOTE [ sizing errors name the inputs ])
_SOURCES = {"inference_flops": "inference_tokens", "total_flops": "inference_tokens",
            "epochs": "unique_tokens", "effective_tokens": "unique_tokens",
            "effective_params": "unique_tokens"}
_QUESTION = ("compute_flops", "target_loss", "params", "tokens")  # what `flops` comes from, in order


def _question(given: dict) -> str:
    """The option the question was asked with (what the queries call `flops`)."""
    return next((k for k in _QUESTION if given.get(k) is not None), "compute_flops")


def size(
    *,
    compute_flops: float | None = None,
    params: float | None = None,
    target_loss: float | None = None,
    tokens: float | None = None,
    inference_tokens: float | None = None,
    unique_tokens: float | None = None,
    memory_bytes: int | None = None,
    devices: int = 1,
    seq_len: int = 2048,
    micro_batch: int = 1,
    peak_flops: float | None = None,
    device: str | None = None,
    utilization: float = 0.4,
    strategy: str = "optimal",
    max_overhead: float | None = MAX_OVERHEAD,
    law: str | Law | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BaseModel:
    """The sizing the options ask for (see the module's table). Returns that query's result model
    (`Sizing`, `InferenceSizing`, `DataConstrainedSizing`, `MemorySizing` or `MemoryFit`); an
    option the query does not read, or a missing one, an answer out of a float's range or below
    one parameter or token raise `ScalingError` naming the options (NOTE [ sizing errors name the
    inputs ]); no model that fits the memory raises `InfeasibleSizing`."""
    options = dict(locals())
    given = {k: options[k] for k in (*_QUESTION, "inference_tokens", "unique_tokens")
             if options[k] is not None}
    try:
        # an overflow is judged by the result (a float out of range is refused below), not
        # reported by numpy as a warning beside the one line
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            result = _answer(options)
    except ValidationError as err:  # the answer is out of a float's range
        first = err.errors(include_url=False)[0] if err.errors() else {}
        name = str((first.get("loc") or ("",))[0])
        names = [_SOURCES[name]] if name in _SOURCES else list(given) or [_question(given)]
        raise ScalingError(f"{', '.join(names)}: too small or too large to size (the answer's "
                           f"{name or 'value'} over- or underflows a float); use realistic values") from None
    except InfeasibleSizing:
        raise
    except ScalingError as err:
        head, sep, rest = str(err).partition(": ")
        names = [n.strip() for n in head.split(",")] if sep else []
        if not names or not all(n == "flops" or n in _SOURCES for n in names):
            raise  # it names the caller's own options already
        implied = ", ".join(names)
        named = list(dict.fromkeys(_SOURCES.get(n) or _question(given) for n in names))
        raise ScalingError(f"{', '.join(named)}: {rest} (the {implied} this query implies); use "
                           "realistic values") from None
    asked = _question(given)
    fix = "ask for a lower target_loss" if asked == "target_loss" else f"ask for a larger {asked}"
    for what, words in (("params", "parameters"), ("tokens", "training tokens")):
        value = getattr(result, what, None)
        if isinstance(value, float) and value < 1 and given.get(asked) is not None:
            raise ScalingError(f"{asked}: {given[asked]:g} sizes a model of {value:.3g} {words}, "
                               f"less than one; {fix}")
    return result
