"""One entry for every sizing query: the options name the question (the CLI's `memplan size` and
the service's `GET /v1/sizing` both call this, so they cannot disagree).

    memory_bytes       -> memory_aware_size
    unique_tokens      -> data_constrained_optimal (with compute_flops)
                          or data_constrained_loss (with params and tokens)
    inference_tokens   -> inference_aware (with compute_flops or target_loss)
    otherwise exactly one of compute_flops, params, target_loss
                       -> compute_optimal, optimal_for_params, cheapest_for_loss
"""

from __future__ import annotations

from collections.abc import Callable

from memplan.planner.scaling.data_constrained import data_constrained_loss, data_constrained_optimal
from memplan.planner.scaling.errors import ScalingError
from memplan.planner.scaling.inference import inference_aware
from memplan.planner.scaling.laws import Law
from memplan.planner.scaling.queries import cheapest_for_loss, compute_optimal, optimal_for_params
from pydantic import BaseModel

__all__ = ["size"]


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
    law: str | Law | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BaseModel:
    """The sizing the options ask for (see the module's table). Returns that query's result model
    (`Sizing`, `InferenceSizing`, `DataConstrainedSizing` or `MemorySizing`); an inconsistent set
    of options raises `ScalingError` naming the option."""
    if memory_bytes is not None:
        from memplan.planner.scaling.memory_aware import memory_aware_size

        return memory_aware_size(
            memory_bytes, n_devices=devices, law=law, seq_len=seq_len, micro_batch=micro_batch,
            device=device, peak_flops=peak_flops, utilization=utilization, strategy=strategy,
            progress=progress,
        )
    if unique_tokens is not None:
        if compute_flops is not None:
            return data_constrained_optimal(compute_flops, unique_tokens, law=law)
        if params is not None and tokens is not None:
            return data_constrained_loss(params, tokens, unique_tokens, law=law)
        raise ScalingError("unique_tokens: give compute_flops (the best N, D), or params and "
                           "tokens (their loss)")
    if inference_tokens is not None:
        if (compute_flops is None) == (target_loss is None):
            raise ScalingError("inference_tokens: give one of compute_flops or target_loss")
        return inference_aware(inference_tokens, target_loss=target_loss, flops=compute_flops,
                               law=law)
    given = [k for k, v in (("compute_flops", compute_flops), ("params", params),
                            ("target_loss", target_loss)) if v is not None]
    if len(given) != 1:
        raise ScalingError(
            f"{given[1] if len(given) > 1 else 'compute_flops'}: give exactly one of compute_flops, "
            "params or target_loss" + (f" (got {', '.join(given)})" if given else "")
        )
    if compute_flops is not None:
        return compute_optimal(compute_flops, law=law)
    if params is not None:
        return optimal_for_params(params, law=law)
    return cheapest_for_loss(target_loss, law=law)  # type: ignore[arg-type]
