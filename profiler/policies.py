"""Save policies: which of a stage's operators autograd keeps, and which its backward recomputes.

A policy is data (`memplan.profiler.schema.SavePolicy.recompute`): a list of aten overload packets
recomputed in the backward, `[]` (keep everything: the stage's own record, 'all') or `["*"]`
(keep nothing but the input: the whole stage is recomputed, as `torch.utils.checkpoint` does).
`recorded` runs a stage's forward under one; the profiler measures each policy through it and the
executor runs plans through it, so what is measured is what runs (docs/chain-model.md section 10.8).

NOTE [ selective recompute through checkpoint contexts ]
1. A policy other than 'all' runs the stage under non-reentrant `torch.utils.checkpoint` with
   `create_selective_checkpoint_contexts`: an op whose packet is listed is PREFER_RECOMPUTE, every
   other op MUST_SAVE, so the backward replays the forward and takes the saved outputs from the
   cache instead of recomputing them.
2. `["*"]` is plain non-reentrant checkpoint: only the inputs are kept.
3. Recomputation replays the same ops on the same inputs, so gradients are bitwise those of the
   unplanned step on the CPU (fp32); the random state is restored for the replay (checkpoint's
   `preserve_rng_state`), so dropout draws the same mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

__all__ = ["recorded", "op_name", "RECOMPUTE_ALL"]

RECOMPUTE_ALL = "*"


def op_name(func: Any) -> str:
    """'aten.gelu' for an aten overload such as `torch.ops.aten.gelu.default`."""
    packet = getattr(func, "overloadpacket", func)
    return f"{getattr(packet, '_qualified_op_name', str(packet)).replace('::', '.')}"


def _policy_fn(recompute: frozenset[str], ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return (CheckpointPolicy.PREFER_RECOMPUTE if op_name(func) in recompute
            else CheckpointPolicy.MUST_SAVE)


def _context_fn(recompute: frozenset[str]):
    return create_selective_checkpoint_contexts(partial(_policy_fn, recompute))


def recorded(fn: Callable[..., Any], *args: Any, recompute: Sequence[str] = ()) -> Any:
    """`fn(*args)` recorded for autograd under the save policy `recompute` (NOTE [ selective
    recompute through checkpoint contexts ]): `()` keeps everything (a plain call), `["*"]`
    keeps only the inputs, otherwise the listed aten packets are recomputed in the backward.
    Returns fn's output."""
    if not recompute:
        return fn(*args)
    if list(recompute) == [RECOMPUTE_ALL]:
        return checkpoint(fn, *args, use_reentrant=False)
    if RECOMPUTE_ALL in recompute:
        raise ValueError("recompute: '*' recomputes every operator; list it alone")
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=partial(_context_fn, frozenset(recompute)))
