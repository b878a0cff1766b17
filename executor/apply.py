"""Your model, your training loop: profile a model through its own forward and loss, plan, and
install the plan into the model in place.

    >>> plan = memplan.auto_checkpoint(model, batch, budget="2GiB")   # profile, plan, install
    >>> loss = model(**batch).loss; loss.backward(); opt.step()       # the user's loop, unchanged
    >>> memplan.measure_step(model, batch)                            # measured against predicted
    >>> memplan.remove_checkpoint(model)                              # the model as it was

NOTE [ The model as a chain ]
The chain is the model's forward cut at its repeated blocks (the largest run of same-type
modules in an nn.ModuleList or nn.Sequential, or `blocks=`): stage 1 is everything the forward
does before the first block (embeddings, masks, position embeddings: "prefix"), then one stage
per block, and the last stage is everything after the last block through the loss ("head"). A
model whose first block takes the batch itself has no prefix stage. The forward must call each
block once, in order, each block taking the previous one's output (checked while profiling).

NOTE [ Measured in context ]
`profile_model` measures every stage inside the model's own store-all step (forward, loss,
backward), split at the blocks by module hooks and, in the backward, by gradient hooks on the
blocks' outputs (a stage's backward starts when the gradient of its output is complete):
- x_i: the unique storages of the stage's output (the first floating tensor a block returns).
- s_i: storages saved for the backward (saved-tensor hooks) while the stage ran, less parameters,
  buffers, the batch, the stage's input and output and the other arguments the block was called
  with (masks, rotary embeddings, positions: the prefix made them). Those side values are held
  for the blocks' recomputes from the prefix's first forward to the step's end, whatever the
  schedule (an `F 1` keeps them as an `R 1` does), so they count in x_0 (`input_bytes`, always
  live) beside the batch, not in the prefix's s_1: charged to s_1, a schedule that forwards the
  prefix without a record was predicted a Llama's rotary tables (64 KiB) below its measured
  peak. The prefix's s_1 is what else its forward saves.
- The head (the last stage, through the loss): its s_L is what it saved less what the stages
  before it saved and the side values, not bounded by its phase's growth, which frees the
  prefix's locals (GPT-2's token and position embeddings) when the inner model returns. The
  model's output is dropped after the loss and before the backward, as the user's step
  `model(**batch).loss.backward()` drops it: a loss that saves the logits themselves (memplan's
  `lean_loss`) frees them within the head's backward, and an output held to the step's end would
  be charged to every stage's backward. A loop that holds the output through its backward
  (`out = model(**batch); out.loss.backward()`) peaks higher by the output's bytes the graph does
  not save (docs/apply.md).
- tf_i: the stage's forward peak above what it leaves; tb_i: its backward peak above its start,
  less the new input gradient, with its output's gradient d_i held until the stage's backward
  ends (the chain model's `B i` frees d_i at its end; the installation's `B i` of a no-grad stage
  holds it, and autograd alone may free it earlier: a ResNet block's ReLU does); tf'_i and f'_i from a forward of the model under torch.no_grad()
  split the same way; f_i, b_i, f'_i: medians of `repeats` passes timed at the same hooks.
- fixed bytes: parameters, gradients, `optimizer` state, buffers, and the gradient of a weight
  tied between two stages (pending through the backward, NOTE [ Parameters shared between
  stages ] in profiler/measure.py).
Memory by `memplan.profiler.memory.measure_memory` (exact on the CPU; the CUDA allocator's
counters on a GPU). Parameter gradients are allocated for the measurement (as in every step after
the first) and put back as they were, with buffers and the random streams.

NOTE [ Installing a schedule ]
The forward phase of the schedule (the ops before `loss`) runs each stage once, in order, as the
model's forward calls them: a stage the schedule records (`R i`) runs as usual; a stage it only
forwards (`F i`) runs under torch.no_grad() (entered by the installation's pre-hook, left by its
post-hook), so it keeps nothing but its output, and a `_Rejoin` node joins that output to the
graph. Outputs the schedule keeps past the forward (checkpoints) are held by the installation
until their `drop`. The backward phase (the ops after `loss`) runs inside autograd's backward:
when the gradient of stage i's output is complete (the `_Rejoin` node's backward, or a gradient
hook on a recorded stage's output) the installation runs the schedule's ops up to `B i`: `F j`
reruns stage j under no_grad from its kept input, `R j` reruns it recording from a detached alias
of its input and keeps that alias and the output's autograd edge (as executor/runner.py's records
do, so `drop j` frees a_j while the record lives), `drop j` releases a kept output; then `B i` of a
no-grad stage is the backward through its record, whose input alias's gradient `_Rejoin` hands on.
So every valid schedule, one-level or multi-level, runs as written, with the recomputations the
plan chose and the replay's memory. The prefix is rerun by calling the model again and stopping at
the first block. The executor's guards keep recomputes equal to the first forward (RNG, buffers,
MoE decisions; NOTE [ The traps of recomputation ] in executor/guards.py); forward hooks are not
filtered here (the installation's own are on the blocks). Autocast's state at a stage's first
forward is restored for its recomputes. Installable: the last stage (the head and the loss) runs
once, as a record (every strategy's plans do; `installable` says why a schedule is not).
The installation is inactive where autograd records nothing (torch.no_grad(), evaluation) and
while it recomputes.

NOTE [ Offload in installed plans ]
A plan's transfer ops (executor/offload.py, NOTE [ Offload in the executor ]) run where their
window op runs: in the forward phase, the transfers before `F/R i` start when stage i starts
(its pre-hook; those before `R L`, the head, at the last block's post-hook; those before `loss`
at the model's forward hook) and are waited for when the stage ends; in the backward phase,
`_run_until` issues them like the other ops, and those whose window is autograd's `B i` are
waited for when the next hook runs (the backward's start is a pre-hook on the loss's node, when
the model returns its loss). Stages whose record, input or output moves record under the
offloader's saved-tensor hooks (the block's other arguments are saved as they are), and a
recompute's input is its `_Cut` alias. A kept a_i moved to the host is an `OnHost` in the step's
kept outputs until it is fetched. Transfers of the head's record or of the loss a_L, save
policies and compiled blocks with transfers are refused; on the CPU the plan is refused
before it is installed (the same message as the runner's).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import statistics
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from memplan.executor.guards import StageGuards
from memplan.executor.offload import (
    CPU_REFUSAL,
    TRANSFER_OPS,
    Offloader,
    OnHost,
    Slots,
    has_transfers,
)
from memplan.executor.report import ExecutorError, InfeasiblePlanError, error_pct
from memplan.planner.schema import Op, Plan, PlanError
from memplan.profiler.schema import (
    LayerProfile,
    Profile,
    ProfileError,
    check_optimizer,
    format_validation_error,
)
from pydantic import ValidationError
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten

__all__ = [
    "auto_checkpoint",
    "install_plan",
    "remove_checkpoint",
    "measure_step",
    "profile_model",
    "find_blocks",
    "installable",
    "StepMeasurement",
    "InstallError",
    "OffloadNeedsCudaError",
]

log = logging.getLogger(__name__)


class InstallError(ExecutorError):
    """A plan or model that cannot be installed; the message names the field and the fix."""


class OffloadNeedsCudaError(InstallError):
    """The plan moves tensors to host memory and the model is not on a CUDA device
    (`CPU_REFUSAL`); a caller that took the option under another name says it in its own words."""


# ---------------------------------------------------------------------------------------------
# the batch, the call and the loss


def _no_cache(model: nn.Module, kwargs: dict) -> dict:
    """NOTE [ No KV cache in a training step ]: a Hugging Face model whose config says use_cache
    keeps every layer's keys and values in a cache during a training forward too, and a
    recomputed layer would append to it (and attend to it). As Hugging Face's own gradient
    checkpointing does, a step with a plan installed (and its profile) runs with use_cache=False
    unless the caller passes use_cache."""
    if "use_cache" not in kwargs and getattr(getattr(model, "config", None), "use_cache", False):
        return {**kwargs, "use_cache": False}
    return kwargs


def _call(model: nn.Module, inputs: Any, *, arg: str = "example_batch") -> Any:
    """The model called as a training loop calls it: a dict as keywords (NOTE [ No KV cache in a
    training step ]), a tuple or list as positional arguments, anything else as the one argument.
    A TypeError of the call (most often a batch of the wrong form: (inputs, target) without
    loss_fn) is an `InstallError` naming `arg` and loss_fn, the original chained."""
    if inputs is None:
        raise InstallError(f"{arg}: got None; give the batch the model is called on ({_FORMS})")
    try:
        if isinstance(inputs, dict):
            return model(**_no_cache(model, inputs))
        if isinstance(inputs, (tuple, list)):
            return model(*inputs)
        return model(inputs)
    except TypeError as err:
        raise InstallError(f"{arg}: calling the model on it raised TypeError ({err}); {_FORMS}") from err


_FORMS = ("a dict batch is passed as keywords, a tuple or list as positional arguments, anything "
          "else as the one argument; for a model that returns logits give loss_fn=f, "
          "f(output, target) -> scalar loss, and the batch as (inputs, target)")


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InstallError(f"model: expected a torch.nn.Module, got {type(model).__name__}")


def _check_flag(value: Any, name: str) -> None:
    """Refuse a non-bool where a True/False switch belongs ("yes" is not a switch)."""
    if not isinstance(value, bool):
        raise InstallError(f"{name}: True or False, got {value!r}")


def _check_trainable(model: nn.Module, caller: str = "profile_model") -> None:
    """A training step can run: gradients are enabled and some parameter requires grad."""
    if not torch.is_grad_enabled():
        raise InstallError(f"{caller}: called under torch.no_grad() or torch.inference_mode(), where "
                           "no training step runs; call it where gradients are enabled")
    if not any(p.requires_grad for p in model.parameters()):
        raise InstallError(f"model: no parameter requires grad, so a training step computes no "
                           f"gradient and {caller} has nothing to measure; unfreeze the parameters "
                           "you train (p.requires_grad_(True))")


def _backward(loss: torch.Tensor) -> None:
    """loss.backward(), refused with a clear line when the loss is not connected to the graph."""
    if not loss.requires_grad:
        raise InstallError("loss_fn: the loss does not require grad (it depends on no parameter that "
                           "requires grad: a detached output, or a loss_fn that returns a constant)")
    loss.backward()


def _split(batch: Any, loss_fn: Callable | None) -> tuple[Any, Any]:
    """(model inputs, target): with `loss_fn` the batch is (inputs, target)."""
    if loss_fn is None:
        return batch, None
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise InstallError(
            "example_batch: with loss_fn give (inputs, target): the model is called on inputs and "
            f"the loss is loss_fn(output, target); got {type(batch).__name__}"
        )
    return batch[0], batch[1]


def _loss_of(out: Any, target: Any, loss_fn: Callable | None) -> torch.Tensor:
    """The scalar loss: loss_fn(output, target), else output.loss / output["loss"], else the
    output itself when it is a scalar tensor."""
    if loss_fn is not None:
        loss = loss_fn(out, target)
    elif getattr(out, "loss", None) is not None:
        loss = out.loss
    elif isinstance(out, dict) and out.get("loss") is not None:
        loss = out["loss"]
    else:
        loss = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        raise InstallError(
            "loss_fn: the model's output has no loss (no .loss, no 'loss' key, not a scalar "
            "tensor); pass loss_fn=f, f(output, target) -> scalar, and a batch (inputs, target)"
        )
    return loss


def _loss_bytes(loss: torch.Tensor) -> int:
    """Bytes the loss holds: its storage's, which is not always the scalar's 4 (mse_loss returns
    a view of its unreduced buffer, the output's size). The chain model's a_L is the 4-byte
    scalar, dropped before `B L`; the caller holds the loss through the whole backward, so the
    rest of its storage counts in x_0 (always live: over by that much before the loss, exact
    from it on)."""
    return sum(_storages(loss).values())


def _storages(values: Any) -> dict[int, int]:
    """{data pointer: bytes} of the distinct non-empty storages of the tensors in `values`."""
    flat, _ = tree_flatten(values)
    out: dict[int, int] = {}
    for t in flat:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            if st.nbytes():
                out[st.data_ptr()] = st.nbytes()
    return out


def _hidden_of(out: Any) -> torch.Tensor | None:
    """A block's output as the chain's value: the tensor, or the first tensor of a tuple/list."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _hidden_in(args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, tuple[str, Any]]:
    """A block's input hidden states and where they were: ("arg", 0) or ("kw", name)."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0], ("arg", 0)
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"], ("kw", "hidden_states")
    return None, ("arg", 0)


def _with_hidden(args: tuple, kwargs: dict, where: tuple[str, Any], hidden: torch.Tensor):
    if where[0] == "arg":
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, where[1]: hidden}


# ---------------------------------------------------------------------------------------------
# finding the blocks


def find_blocks(model: nn.Module, blocks: str | Sequence[nn.Module] | None = None) -> tuple[str, list[nn.Module]]:
    """The model's chain of repeated blocks: (a name for them, the blocks in order).

    `blocks`: a dotted path to an nn.ModuleList or nn.Sequential ("model.layers"), a list of the
    model's modules, or None: the longest run of consecutive same-type modules in any
    nn.ModuleList or nn.Sequential of the model (the model itself included), as FSDP's and
    torchtitan's wrap policies choose (ties: the first found). Raises `InstallError`."""
    if isinstance(blocks, str):
        try:
            container = model.get_submodule(blocks)
        except AttributeError:
            raise InstallError(f"blocks: the model has no submodule {blocks!r}; give the dotted "
                               "path of its list of blocks, e.g. 'model.layers'") from None
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(container) == 0:
            raise InstallError(f"blocks: {blocks!r} is a {type(container).__name__}, not a non-empty "
                               "nn.ModuleList or nn.Sequential")
        return blocks, list(container)
    if blocks is not None and not isinstance(blocks, (list, tuple, nn.ModuleList, nn.Sequential)):
        raise InstallError("blocks: give a dotted path ('model.layers'), a list of the model's own "
                           f"modules, or None (found); got {type(blocks).__name__}")
    if blocks is not None:
        mods = list(blocks)
        ids = {id(m) for m in model.modules()}
        if not mods or any(not isinstance(m, nn.Module) or id(m) not in ids for m in mods):
            raise InstallError("blocks: give a dotted path or a non-empty list of the model's own modules")
        return "blocks", mods
    best: tuple[int, str, list[nn.Module]] = (0, "", [])
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(mod.named_children())
        k = 0
        while k < len(children):
            j = k
            while j + 1 < len(children) and type(children[j + 1][1]) is type(children[k][1]):
                j += 1
            run = [m for _, m in children[k : j + 1]]
            if len(run) > best[0]:
                prefix = f"{name}." if name else ""
                label = f"{prefix}{children[k][0]}-{children[j][0]}" if j > k else f"{prefix}{children[k][0]}"
                best = (len(run), label, run)
            k = j + 1
    if best[0] < 2:
        raise InstallError("blocks: the model has no nn.ModuleList or nn.Sequential with two or more "
                           "consecutive blocks of one type; name them with blocks='path.to.layers'")
    return best[1], best[2]


# ---------------------------------------------------------------------------------------------
# profiling through the model's own step


# NOTE [ Gradients only along the chain ]
# The installation recomputes a block from its hidden input alone and joins a block it forwarded
# without a record to the graph only through its output, so gradients may cross between the
# chain's parts only along the chain. The rules, checked on the profiled store-all step's graph:
# 1. Each autograd node belongs to the part of the forward that created it: the prefix, a block
#    (with the code between it and the block before), or the head (after the last block). Nodes
#    are numbered on creation (per thread), and the hooks at the blocks' boundaries read the
#    counter. Leaves (parameters, the batch) belong to no part: a parameter used by two parts is
#    the chain model's tied weight.
# 2. An edge of the graph that crosses parts must be the previous part's output taken by the next
#    part: the prefix's output by the first block, block j's by block j+1, the last block's by the
#    head.
# 3. What breaks rule 2 is refused by `profile_model`, naming the part, because the installed step
#    would lose that gradient (a wrong gradient, or autograd's "backward through the graph a second
#    time"): a block argument with gradients besides the previous output (a skip from the
#    embeddings, T5's position bias made by its first block), a value made inside a block that
#    reaches the loss other than through its output (an auxiliary or router loss, router logits
#    recorded by a hook), a block's output used again after the next block (a sum over layers).


def _seq_now() -> int:
    """The autograd sequence number of a node made now (NOTE [ Gradients only along the chain ]):
    every node made later on this thread has a larger one."""
    with torch.enable_grad():
        return torch.empty(0, requires_grad=True).view(0).grad_fn._sequence_nr()


def chain_crossing(root: Any, starts: list[int], ends: list[int], outputs: list[Any]) -> str | None:
    """None when every edge of the graph below `root` (the loss's node) that crosses the chain's
    parts follows NOTE [ Gradients only along the chain ] rule 2; else which parts break it, in
    words. starts[j], ends[j]: `_seq_now()` at block j's pre- and post-hook; outputs[0]: the node
    of the first block's input (None without one), outputs[j + 1]: of block j's output."""
    import bisect

    n = len(starts)
    unnumbered = 2**63  # AccumulateGrad (a leaf's) carries the largest sequence number

    def part(node: Any) -> int | None:  # 0: the prefix, j + 1: block j, n + 1: the head
        q = node._sequence_nr()
        if q >= unnumbered:
            return None
        j = bisect.bisect_left(starts, q) - 1  # the last block started before the node
        if j < 0:
            return 0
        return j + 1 if q < ends[j] else j + 2  # after block j: block j + 1's part, or the head

    def name(k: int) -> str:
        return "the prefix (before the first block)" if k == 0 else (
            "the head (after the last block) or the loss" if k == n + 1 else f"block {k - 1}")

    seen = {id(root)}
    todo = [root]
    while todo:
        node = todo.pop()
        kp = part(node)
        for child, _ in node.next_functions:
            if child is None:
                continue
            if kp is not None and kp >= 1 and child is not outputs[kp - 1]:
                kc = part(child)
                if kc is not None and kc != kp:
                    if kc >= 1 and any(child is o for o in outputs[1:]):
                        return (f"{name(kc)}'s output is used again by {name(kp)}; name blocks "
                                "(blocks=) whose outputs only the next one takes")
                    if 1 <= kc <= n:
                        return (f"a value made inside {name(kc)} other than its output (a second "
                                f"output, an auxiliary or router loss, a value a hook recorded) "
                                f"reaches {name(kp)}; turn that value off (output_router_logits="
                                "False for a router loss) or name other blocks with blocks=")
                    return (f"{name(kp)} takes a value with gradients from {name(kc)} besides "
                            "the previous block's output (a skip connection, a bias made once); "
                            "detach that value or name other blocks with blocks=")
            if id(child) not in seen:
                seen.add(id(child))
                todo.append(child)
    return None


class _Tap:
    """Hooks on the model and its blocks for one instrumented pass: each stage boundary calls
    `on_boundary(label)`; block inputs, outputs and arguments are recorded, and with `grad_hooks`
    where each block's autograd nodes start and end (NOTE [ Gradients only along the chain ])."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        self.model, self.blocks = model, blocks
        self.on_boundary: Callable[[str], None] = lambda label: None
        self.inputs: list[Any] = [None] * len(blocks)
        self.outputs: list[Any] = [None] * len(blocks)
        self.args: list[Any] = [None] * len(blocks)
        self.calls = 0
        self.order_ok = True
        self.repeat = [False] * len(blocks)
        self.grad_hooks = False
        self.held: torch.Tensor | None = None
        self.starts: list[int] = [0] * len(blocks)
        self.ends: list[int] = [0] * len(blocks)
        self.nodes: list[Any] = [None] * (len(blocks) + 1)  # the first input's, each output's
        self.handles: list[Any] = []
        for j, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(self._pre(j), with_kwargs=True))
            self.handles.append(block.register_forward_hook(self._post(j)))

    def _pre(self, j: int):
        def hook(module, args, kwargs):
            self.repeat[j] = j != self.calls or not self.order_ok  # a block called again, or out
            self.calls += 1  # of order: refused after the pass, nothing marked for it
            if self.repeat[j]:
                self.order_ok = False
                return
            hidden, _ = _hidden_in(args, kwargs)
            self.inputs[j] = hidden
            self.args[j] = (args, kwargs)
            self.on_boundary(f"F{j}")
            if self.grad_hooks:
                if j == 0:
                    self.nodes[0] = hidden.grad_fn if hidden is not None else None
                self.starts[j] = _seq_now()
            if self.grad_hooks and j == 0 and hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda g: self._grad("B-1", g))
        return hook

    def _post(self, j: int):
        def hook(module, args, out):
            if self.repeat[j]:
                return
            hidden = _hidden_of(out)
            self.outputs[j] = hidden
            if self.grad_hooks:
                self.ends[j] = _seq_now()
                self.nodes[j + 1] = hidden.grad_fn if hidden is not None else None
            self.on_boundary(f"E{j}")
            if self.grad_hooks and hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda g: self._grad(f"B{j}", g))
        return hook

    def _grad(self, label: str, grad: torch.Tensor) -> None:
        """A stage's backward starts: its output's gradient d_i is held until the next stage's
        starts, as the installation's `B i` of a no-grad stage holds it (NOTE [ Measured in
        context ])."""
        self.held = None
        self.on_boundary(label)
        self.held = grad

    def reset(self) -> None:
        self.inputs = [None] * len(self.blocks)
        self.outputs = [None] * len(self.blocks)
        self.args = [None] * len(self.blocks)
        self.calls = 0

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def _state_kept(model: nn.Module, device: torch.device, *, grads: bool = True):
    """Buffers, gradients and random streams as they were, after the block; parameter gradients
    allocated (zeros) inside it (`grads`; else left alone)."""
    bufs = [(b, b.detach().clone()) for b in model.buffers()]
    params = [p for p in model.parameters() if p.requires_grad and grads]
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in params]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for b, saved in bufs:
                b.copy_(saved)
            for p, g in grads:
                p.grad = g


def _stage_labels(n_blocks: int, has_prefix: bool) -> tuple[list[str], list[str]]:
    names = (["prefix"] if has_prefix else []) + [f"block.{j}" for j in range(n_blocks)] + ["head"]
    kinds = (["embed"] if has_prefix else []) + ["block"] * n_blocks + ["head"]
    return names, kinds


def profile_model(
    model: nn.Module,
    example_batch: Any,
    *,
    blocks: str | Sequence[nn.Module] | None = None,
    loss_fn: Callable | None = None,
    optimizer: str = "adamw",
    repeats: int = 3,
    warmup: int = 1,
    name: str | None = None,
    policies: bool | Sequence[str] = False,
    compile: bool = False,
) -> Profile:
    """Measure the model as a chain (NOTE [ The model as a chain ]) through its own forward and
    loss on `example_batch` (NOTE [ Measured in context ]).

    `policies`: also measure save policies for each block (NOTE [ Save policies of installed
    blocks ]): False (none), True (the profiler's built-in candidates) or a list of their names.
    `compile`: measure the model with each block compiled (`torch.compile` per block, NOTE
    [ Compiled blocks ]), as `auto_checkpoint(..., compile=True)` runs it; with `policies=True`
    the min-cut policies are offered too.

    Returns a `Profile` (seconds, bytes; `meta["apply"]` records the blocks, the batch bytes and
    whether there is a prefix stage). A plan installed in `model` is set aside while it is measured
    (NOTE [ Re-planning replaces the plan ]). Raises `InstallError` when the blocks do not form a
    chain, and on bad input."""
    _check_model(model)
    _check_trainable(model)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InstallError(f"repeats: must be an integer >= 1, got {repeats!r}")
    _check_flag(compile, "compile")
    try:
        check_optimizer(optimizer)  # before measuring: it is priced only at the end
    except ProfileError as err:
        raise InstallError(str(err)) from None
    with _plan_set_aside(model, replace=False):
        return _measure_chain(model, example_batch, blocks=blocks, loss_fn=loss_fn, optimizer=optimizer,
                              repeats=repeats, warmup=warmup, name=name, policies=policies,
                              compile=compile)


def _measure_chain(model: nn.Module, example_batch: Any, *, blocks, loss_fn, optimizer: str,
                   repeats: int, warmup: int, name: str | None, policies, compile: bool) -> Profile:
    """`profile_model` of a model with no plan installed."""
    from memplan.profiler.fixed import optimizer_state_bytes
    from memplan.profiler.memory import measure_memory

    policy_names = _policy_names(policies, compiled=compile)
    label, blist = find_blocks(model, blocks)
    inputs, target = _split(example_batch, loss_fn)
    dev = _device_of(model)
    n = len(blist)
    compiled = _CompiledBlocks(blist) if compile else None
    tap = _Tap(model, blist)
    calls: list[Any] = []
    iso: list[dict[str, dict[str, float]]] = []
    try:
        with _state_kept(model, dev):
            # 1. memory of one store-all step, and what each stage saves
            owner: list[int | None] = [None]  # the stage running (index into the chain) in the forward
            packs: dict[int, dict[int, int]] = {}

            def pack(t: torch.Tensor):
                if owner[0] is not None:
                    st = t.untyped_storage()
                    if st.nbytes():
                        packs.setdefault(owner[0], {})[st.data_ptr()] = st.nbytes()
                return t

            with measure_memory(dev) as meter:
                def boundary(lbl: str) -> None:
                    meter.mark(lbl)
                    if lbl.startswith("F"):
                        owner[0] = int(lbl[1:]) + 1
                    elif lbl.startswith("E"):
                        owner[0] = n + 1 if int(lbl[1:]) == n - 1 else None
                tap.on_boundary = boundary
                tap.grad_hooks = True
                owner[0] = 0
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = _call(model, inputs)
                    loss = _loss_of(out, target, loss_fn)
                meter.mark("loss")
                del out  # as the user's step drops it (NOTE [ Measured in context ], the head)
                meter.mark("backward")
                owner[0] = None
                root = loss.grad_fn
                loss_b = _loss_bytes(loss)
                _backward(loss)
                tap.held = None
                del loss
            if not tap.order_ok or tap.calls != n:
                raise InstallError(
                    f"blocks: the forward called the {n} blocks {tap.calls} times or out of order; "
                    "auto_checkpoint needs each block called once, in order (name them with blocks=)"
                )
            hidden_in = tap.inputs
            hidden_out = tap.outputs
            for j in range(1, n):
                if hidden_in[j] is None or hidden_out[j - 1] is None or (
                        hidden_in[j].untyped_storage().data_ptr() != hidden_out[j - 1].untyped_storage().data_ptr()):
                    raise InstallError(
                        f"blocks: block {j} does not take block {j - 1}'s output (its first tensor) as "
                        "its input; auto_checkpoint needs a chain of blocks (name them with blocks=)"
                    )
            crossing = chain_crossing(root, tap.starts, tap.ends, tap.nodes) if root else None
            del root
            tap.nodes = [None] * (n + 1)
            if crossing is not None:  # NOTE [ Gradients only along the chain ]
                raise InstallError(
                    f"blocks: in {label}, {crossing} (memplan recomputes a block from the previous "
                    "block's output alone, so that gradient would be lost)")
            batch_st = _storages(inputs) | _storages(target)
            has_prefix = hidden_in[0] is None or hidden_in[0].untyped_storage().data_ptr() not in batch_st
            fixed_st = _storages(list(model.parameters())) | _storages(list(model.buffers())) | _storages(
                [p.grad for p in model.parameters()])
            phases = meter.phases
            mem_phases = {k: (v.start_bytes, v.peak_bytes, v.end_bytes) for k, v in phases.items()}
            arg_st = [_storages(tap.args[j]) for j in range(n)]
            x_block = [sum(_storages(hidden_out[j]).values()) for j in range(n)]
            out_st = [_storages(hidden_out[j]) for j in range(n)]
            in_st = [_storages(hidden_in[j]) for j in range(n)]
            x_prefix = sum(_storages(hidden_in[0]).values()) if has_prefix else 0
            if policy_names:
                calls = [(hidden_in[j].detach(), *tap.args[j]) for j in range(n)]
            del hidden_in, hidden_out
            tap.reset()

            # 2. the forward under torch.no_grad(), split the same way
            tap.grad_hooks = False
            with measure_memory(dev) as ng:
                tap.on_boundary = ng.mark
                with torch.no_grad(), _no_cast_cache():  # as the installation's F stages run
                    out = _call(model, inputs)
                    _loss_of(out, target, loss_fn)
                ng.mark("loss")
                del out
            ng_phases = {k: (v.start_bytes, v.peak_bytes, v.end_bytes) for k, v in ng.phases.items()}
            tap.reset()

            # 3. times: medians of store-all passes and no-grad forwards, marked at the same hooks
            times: dict[str, list[float]] = {}
            for r in range(warmup + repeats):
                for grad in (True, False):
                    marks: list[tuple[str, float]] = [("start", time.perf_counter())]
                    tap.grad_hooks = grad
                    tap.on_boundary = lambda lbl, marks=marks: marks.append((lbl, _now(dev)))
                    with torch.set_grad_enabled(grad):
                        out = _call(model, inputs)
                        loss = _loss_of(out, target, loss_fn)
                        marks.append(("loss", _now(dev)))
                        if grad:
                            loss.backward()
                    marks.append(("end", _now(dev)))
                    tap.held = None
                    del out, loss
                    tap.reset()
                    if r >= warmup:
                        for (a, t0), (_, t1) in zip(marks, marks[1:], strict=False):
                            times.setdefault(("g" if grad else "n") + a, []).append(t1 - t0)

            # 4. save policies of the blocks, each block alone on its input (NOTE [ Save policies
            # of installed blocks ])
            tap.remove()  # its hooks would keep (and free mid-measurement) each block's output
            tap.reset()
            for j in range(n):
                iso.append(_block_policies(blist[j], calls[j], policy_names, dev, repeats, warmup,
                                           compile=compile) if policy_names else {})
            calls = []
    finally:
        tap.remove()
        if compiled is not None:
            compiled.remove()

    med = {k: statistics.median(v) for k, v in times.items()}
    L = n + 2 if has_prefix else n + 1
    off = 1 if has_prefix else 0
    names, kinds = _stage_labels(n, has_prefix)
    side_st = _side_values(arg_st, in_st, fixed_st | batch_st) if has_prefix else {}
    side_b = sum(side_st.values())
    earlier_st = {p: b for k, st in packs.items() if k <= n for p, b in st.items()}  # before the head

    def labels_of(i: int) -> tuple[str, str]:
        """Stage i's (1-based) forward and backward phase labels (spans start at their label)."""
        if has_prefix and i == 1:
            return "start", "B-1"
        if i == L:
            return f"E{n - 1}", "loss"
        j = i - 1 - off
        return f"F{j}", f"B{j}"

    layers = []
    for i in range(1, L + 1):
        fl, bl = labels_of(i)
        s0, peak, end = mem_phases.get(fl, (0, 0, 0))
        _, npeak, nend = ng_phases.get(fl, (0, 0, 0))
        if has_prefix and i == 1:
            out_b, in_b = x_prefix, 0
            # what it saves; its side values are always live (x_0: NOTE [ Measured in context ])
            excl = fixed_st | batch_st | in_st[0] | side_st
            saved = sum(b for p, b in packs.get(0, {}).items() if p not in excl)
            saved = max(0, min(saved, end - s0 - out_b - side_b))
        elif i == L:
            out_b, in_b = 4, x_block[n - 1]  # the scalar; the rest of its storage is in x_0
            excl = fixed_st | batch_st | side_st | out_st[n - 1] | earlier_st
            saved = sum(b for p, b in packs.get(n + 1, {}).items() if p not in excl)
        else:
            j = i - 1 - off
            out_b = x_block[j]
            in_b = x_block[j - 1] if j > 0 else x_prefix
            excl = fixed_st | batch_st | arg_st[j] | out_st[j]
            saved = sum(b for p, b in packs.get(j + 1, {}).items() if p not in excl)
            saved = max(0, min(saved, end - s0 - out_b))
        b0, bpeak, _ = mem_phases.get("backward" if i == L else bl, (0, 0, 0))
        f_s = med.get("g" + fl, 0.0)
        layers.append(LayerProfile(
            name=names[i - 1], kind=kinds[i - 1],
            forward_s=f_s, backward_s=med.get("g" + bl, 0.0),
            forward_nograd_s=med.get("n" + fl, f_s),
            output_bytes=out_b, saved_bytes=saved, forward_temp_bytes=max(0, peak - end),
            forward_nograd_temp_bytes=max(0, npeak - nend),
            backward_temp_bytes=max(0, bpeak - b0 - in_b),
        ))
    _param_bytes(model, blist, layers, has_prefix)
    if policy_names:
        for j in range(n):
            i = j + off
            layers[i] = _with_block_policies(layers[i], iso[j])
    params = [p for p in model.parameters()]
    fixed = (sum(p.numel() * p.element_size() for p in params)
             + sum(p.numel() * p.element_size() for p in params if p.requires_grad)
             + optimizer_state_bytes(params, optimizer, dev)
             + sum(b.numel() * b.element_size() for b in model.buffers())
             + _tied_grad_bytes(model))
    return Profile(
        name=name or type(model).__name__, device=str(dev),
        dtype=str(next((p.dtype for p in params if p.is_floating_point()), torch.float32)).removeprefix("torch."),
        input_bytes=sum(batch_st.values()) + side_b + max(0, loss_b - 4), fixed_bytes=fixed,
        layers=layers,
        meta={"source": "memplan.executor.apply.profile_model (measured in the model's own step)",
              "torch": torch.__version__, "optimizer": optimizer, "repeats": repeats,
              "policies": policy_names or None, "compiled": bool(compile),
              "apply": {"blocks": label, "n_blocks": n, "prefix": has_prefix,
                        "call_bytes": sum(_storages(inputs).values())}},
    )


# NOTE [ Save policies of installed blocks ]
# 1. Each block (not the prefix or the head: they run inside the model's own forward, where no
#    call can be wrapped) is offered the profiler's candidate policies
#    (`memplan.profiler.policies.candidate_policies` over one traced forward of the block).
# 2. Each candidate and 'all' run on the block alone, on its input from the store-all step with
#    its other arguments, the block's forward through `recorded` (what the installation runs),
#    in one meter block for the forward and its backward from a held d_i: s = what the forward
#    leaves beyond its new output, tf = its peak above that, tb = the backward's peak above its
#    start less d_i and d_{i-1}; times are medians of `repeats` passes.
# 3. A policy's fields are the block's own (measured in context, NOTE [ Measured in context ])
#    plus the policy's difference from 'all' measured alone, so what the block does in the
#    model's step and is not the policy's (side values, autograd's order) stays as measured.
# 4. `select_policies` keeps the candidates that keep fewer bytes and are not beaten.


def _policy_names(policies: bool | Sequence[str], *, compiled: bool) -> list[str]:
    from memplan.profiler.policies import policy_names

    return policy_names(policies, error=InstallError, compiled=compiled)


def _block_fn(block: nn.Module, call: tuple, forward: Callable[..., Any] | None = None
              ) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """(the block's input hidden states, h -> the block's output hidden states with its other
    arguments as in `call`), through `forward(block, *args, **kwargs)` (default: calling the
    block)."""
    hidden, args, kwargs = call
    _, where = _hidden_in(args, kwargs)

    def fn(h: torch.Tensor) -> torch.Tensor:
        a, kw = _with_hidden(args, kwargs, where, h)
        return _hidden_of(block(*a, **kw) if forward is None else forward(block, *a, **kw))
    return hidden, fn


def _block_policies(block: nn.Module, call: tuple, names: list[str], dev: torch.device,
                    repeats: int, warmup: int, *, compile: bool = False) -> dict[str, dict[str, Any]]:
    """'all' and each candidate policy of `block` measured alone (NOTE [ Save policies of
    installed blocks ] rule 2), compiled as the installation runs it with `compile` (NOTE
    [ Compiled blocks ]): name -> saved/forward_temp/backward_temp bytes, forward/backward
    seconds and its recompute list."""
    from memplan.profiler.memory import measure_memory
    from memplan.profiler.policies import recorded

    hidden, fn = _block_fn(block, call)
    _, eager = _block_fn(block, call, type(block).forward)  # traced op by op: not compiled
    rg = hidden.is_floating_point()
    try:
        from memplan.profiler.policies import candidate_policies, trace_ops

        eager(hidden.detach().requires_grad_(rg))  # one-off initialisations out of the trace
        cands = candidate_policies(trace_ops(eager, hidden.detach().requires_grad_(rg)), names)
    except ImportError:
        cands = [("none", ["*"])] if "none" in names else []
    out: dict[str, dict[str, Any]] = {}
    for name, rec in [("all", [])] + cands:
        if compile and rec:
            _, run = _block_fn(block, call, _compiled(type(block), rec))
        else:
            def uncached(h: torch.Tensor) -> Any:
                with _no_cast_cache():  # as the installation runs it (NOTE [ Autocast's cast cache
                    return fn(h)        # and selective recompute ])

            def run(x, rec=rec):
                return recorded(uncached if rec else fn, x, recompute=rec)
        try:
            x = hidden.detach().requires_grad_(rg)
            gc.collect()  # a previous pass's reference cycles (checkpoint's frames) freed first
            with measure_memory(dev) as meter:
                y = run(x)
                meter.mark("backward")
                d = torch.ones_like(y)  # held through the backward, as the installation holds d_i
                y.backward(d)
            fwd, bwd = meter.phases["start"], meter.phases["backward"]
            in_grad = sum(_storages([x.grad, d]).values()) if x.grad is not None else 0
            new = sum(b for p, b in _storages(y).items() if p not in _storages(x))
            del y, d, x
            f_s, b_s = [], []
            for r in range(warmup + repeats):
                x = hidden.detach().requires_grad_(rg)
                t0 = _now(dev)
                y = run(x)
                t1 = _now(dev)
                y.backward(torch.ones_like(y))
                t2 = _now(dev)
                del y, x
                if r >= warmup:
                    f_s.append(t1 - t0)
                    b_s.append(t2 - t1)
        except RuntimeError as err:  # the selective checkpoint refuses an op of this block
            log.warning("policy %s cannot run on this block (%s); left out", name,
                        str(err).splitlines()[0] if str(err) else err)
            continue
        out[name] = {"recompute": rec, "saved_bytes": max(0, fwd.end_bytes - new),
                     "forward_temp_bytes": max(0, fwd.peak_bytes - fwd.end_bytes),
                     "backward_temp_bytes": max(0, bwd.peak_bytes - bwd.start_bytes - in_grad),
                     "forward_s": statistics.median(f_s), "backward_s": statistics.median(b_s)}
    return out


def _with_block_policies(layer: LayerProfile, iso: dict[str, dict[str, Any]]) -> LayerProfile:
    """`layer` with the policies measured alone in `iso`, as differences from its 'all' added to
    its own fields (NOTE [ Save policies of installed blocks ] rules 3 and 4)."""
    from memplan.profiler.schema import SavePolicy

    base = iso.get("all")
    if base is None:
        return layer
    offered = []
    for name, m in iso.items():
        if name == "all":
            continue
        fields = {k: max(0, getattr(layer, k) + m[k] - base[k]) for k in (
            "saved_bytes", "forward_temp_bytes", "backward_temp_bytes")}
        times = {k: max(0.0, getattr(layer, k) + m[k] - base[k]) for k in ("forward_s", "backward_s")}
        offered.append(SavePolicy(name=name, recompute=m["recompute"], **fields, **times))
    try:
        from memplan.profiler.policies import select_policies
    except ImportError:
        kept = [p for p in offered if p.saved_bytes < layer.saved_bytes]
    else:
        kept = select_policies((layer.saved_bytes, layer.backward_temp_bytes, layer.backward_s),
                               offered)
    return layer.model_copy(update={"policies": kept})


def _now(dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


def _param_bytes(model, blist, layers, has_prefix) -> None:
    """Each stage's parameter bytes (a tied weight belongs to the first stage that has it)."""
    off = 1 if has_prefix else 0
    block_ids: set[int] = set()
    for j, block in enumerate(blist):
        b = 0
        for p in block.parameters():
            if id(p) not in block_ids:
                block_ids.add(id(p))
                b += p.numel() * p.element_size()
        layers[j + off].param_bytes = b
    rest = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in block_ids)
    (layers[0] if has_prefix else layers[-1]).param_bytes = rest


def _tied_grad_bytes(model: nn.Module) -> int:
    """Bytes of the gradients of weights the model uses under two names (tied embeddings): their
    second contribution is held through the backward (NOTE [ Parameters shared between stages ])."""
    count: dict[int, int] = {}
    params: dict[int, nn.Parameter] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        count[id(p)] = count.get(id(p), 0) + 1
        params[id(p)] = p
    return sum(p.numel() * p.element_size() for k, p in params.items() if count[k] > 1 and p.requires_grad)


# ---------------------------------------------------------------------------------------------
# installing a plan


def installable(plan: Plan | Sequence[Op], n_stages: int) -> str | None:
    """None when the schedule can be installed into a model (NOTE [ Installing a schedule ]);
    otherwise why not: its forward phase must run stages 1..L once each, in order, the last as a
    record, and the backward phase must not run the last stage again."""
    ops = [tuple(op) for op in (plan.ops() if isinstance(plan, Plan) else plan)]
    if ("loss",) not in ops:
        return "it has no ['loss'] op"
    k = ops.index(("loss",))
    fwd = [op for op in ops[:k] if op[0] in ("F", "R")]
    if [op[1] for op in fwd] != list(range(1, n_stages + 1)):
        return ("its forward phase does not run stages 1..L once each, in order (a model's forward "
                "runs each of its blocks once)")
    if fwd[-1][0] != "R":
        return "it does not record the last stage (the head and the loss) in the forward"
    if any(op[0] in ("F", "R") and op[1] == n_stages for op in ops[k + 1:]):
        return "it runs the last stage (the head and the loss) again after the loss"
    return None


class _Stop(Exception):
    """Raised at the first block's pre-hook to end a recompute of the prefix there."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("prefix recomputed")
        self.hidden = hidden


def _autocast_state() -> list[tuple[str, torch.dtype]]:
    """The device types autocast is on for, with their dtypes."""
    return [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]


def _autocast(state: list[tuple[str, torch.dtype]]) -> contextlib.ExitStack:
    """Autocast as `state` says, without the cast cache (NOTE [ Autocast's cast cache and
    no-grad stages ])."""
    stack = contextlib.ExitStack()
    for d, dtype in state:
        stack.enter_context(torch.autocast(d, dtype=dtype, cache_enabled=False))
    return stack


def _no_cast_cache() -> contextlib.ExitStack:
    """Autocast as it is, without its cache of casted weights. NOTE [ Autocast's cast cache and
    selective recompute ]: inside one autocast region autocast casts a weight once and serves
    later casts from its cache without dispatching them; a selective checkpoint's rerun inside
    the backward of a user who runs the backward under autocast too would then dispatch fewer
    casts than the forward did, and the checkpoint's cache, matched op by op in call order, hands
    back the wrong tensors. Without the cache both dispatch every cast (the same values)."""
    stack = contextlib.ExitStack()
    for d, dtype in _autocast_state():
        stack.enter_context(torch.autocast(d, dtype=dtype, cache_enabled=False))
    return stack


class _Rejoin(torch.autograd.Function):
    """Joins the output of a stage forwarded under no_grad to the graph: its backward is the
    stage's `B i`, run by the installation (NOTE [ Installing a schedule ])."""

    @staticmethod
    def forward(ctx, inst, step, i, x_in, dummy, out):
        ctx.inst, ctx.step, ctx.i = inst, step, i
        ctx.in_grad = x_in is not None and x_in.requires_grad
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        d = ctx.inst._backward_stage(ctx.step, ctx.i, grad)
        return None, None, None, d if ctx.in_grad else None, None, None


class _Holder(nn.Module):
    """The modules of the prefix (the model's modules outside the blocks), for the guards."""

    def __init__(self, modules: list[nn.Module]) -> None:
        super().__init__()
        self._mods = modules

    def modules(self):  # type: ignore[override]
        yield from self._mods


@dataclass
class _Step:
    """One training step's state: the model's call, kept outputs, recomputed records."""

    args: tuple
    kwargs: dict
    kept: dict[int, torch.Tensor] = field(default_factory=dict)  # stage -> a_i held for recomputes
    recs: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # stage -> (input alias, edge)
    inputs: dict[int, Any] = field(default_factory=dict)  # F stage -> its input, until its output
    blocks: dict[int, tuple] = field(default_factory=dict)  # block -> (args, kwargs, where, rg, autocast)
    autocast: dict[int, list] = field(default_factory=dict)  # stage -> autocast state at its forward
    open: list[Any] = field(default_factory=list)  # context managers entered in the forward
    cursor: int = 0
    held: Any = None  # the gradient of the output of the stage whose backward runs
    queued: bool = False
    input_bytes: int = 0
    head_hooks: Any = None  # the head's saved-tensor hooks while it runs (NOTE [ Offload in installed plans ])
    window: bool = False  # a window op has started whose copies are not yet waited for


# NOTE [ Compiled blocks ]
# 1. `compile=True` runs each block's forward through `torch.compile` (per block: compile fuses
#    inside the block, the plan places the blocks), installed as the block's own `forward` so
#    the installation's hooks stay outside the compiled code; `remove_checkpoint` takes it away.
# 2. One compiled function per block class and save policy, taking the block as its first
#    argument (its parameters are the graph's inputs), shared by every block of the class and
#    by profile_model and the installation, so a model compiles once per kind of block.
# 3. A recorded block under a policy is compiled as `recorded(forward, ., recompute=r)`: the
#    selective checkpoint is traced by compile, and its recomputation is part of the compiled
#    backward (no Python rerun, so the guards count none).
# 4. A min-cut policy (`["mincut:B"]`, NOTE [ min-cut policies of compiled stages ] in
#    profiler/policies.py) is the block's forward compiled by inductor under that memory budget;
#    `policies=True` offers them only with `compile=True`, and an eager installation refuses
#    a plan that records a block under one.
_COMPILED: dict[tuple[type, tuple[str, ...] | None], Callable[..., Any]] = {}


def _compiled(cls: type, recompute: Sequence[str] | None) -> Callable[..., Any]:
    """torch.compile of `cls.forward` (recompute None) or of it recorded under the policy
    `recompute`; called as fn(block, *args, **kwargs) (NOTE [ Compiled blocks ])."""
    from memplan.profiler.policies import compiled_policy, mincut_budget

    key = (cls, tuple(recompute) if recompute else None)
    fn = _COMPILED.get(key)
    if fn is None:
        forward = cls.forward
        if not recompute or mincut_budget(recompute) is not None:  # the forward as it is
            fn = compiled_policy(forward, recompute)
        else:
            from memplan.profiler.policies import recorded

            rec = list(recompute)

            def under_policy(block, *args: Any, **kwargs: Any) -> Any:
                hidden, where = _hidden_in(args, kwargs)

                def run(h: torch.Tensor) -> Any:
                    a, kw = _with_hidden(args, kwargs, where, h)
                    return forward(block, *a, **kw)
                return recorded(run, hidden, recompute=rec)
            fn = torch.compile(under_policy)
        _COMPILED[key] = fn
    return fn


class _BlockForwards:
    """Forwards set on blocks as instance attributes; `remove` puts back what was there."""

    def __init__(self) -> None:
        self.saved: list[tuple[nn.Module, Any]] = []

    def set(self, block: nn.Module, forward: Callable[..., Any]) -> None:
        self.saved.append((block, block.__dict__.get("forward")))
        object.__setattr__(block, "forward", forward)

    def remove(self) -> None:
        while self.saved:
            block, before = self.saved.pop()
            if before is None:
                block.__dict__.pop("forward", None)
            else:
                object.__setattr__(block, "forward", before)


class _CompiledBlocks(_BlockForwards):
    """The blocks compiled for profiling (NOTE [ Compiled blocks ])."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        for block in blocks:
            fn = _compiled(type(block), None)
            self.set(block, lambda *a, fn=fn, block=block, **kw: fn(block, *a, **kw))


class _Hook:
    """A hook the installation adds to the model. It refuses to be saved or copied with the model
    in one line: it belongs to an installation, which holds the step's tensors and the model."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def _refuse(self, *args: Any) -> Any:
        raise InstallError("model: a model with an installed plan is not saved or copied whole "
                           "(torch.save, pickle, copy.deepcopy); save model.state_dict(), or call "
                           "memplan.remove_checkpoint(model) first and install the plan again after")

    __reduce_ex__ = __deepcopy__ = __copy__ = _refuse


class _Installation:
    """A plan installed in a model by hooks (NOTE [ Installing a schedule ])."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], has_prefix: bool, plan: Plan,
                 profile: Profile | None, *, policies: dict[int, list[str]] | None = None,
                 compile: bool = False, host_device: str | None = None) -> None:
        from memplan.executor.runner import forward_counts

        self.model, self.blocks, self.has_prefix = model, blocks, has_prefix
        self.off = 1 if has_prefix else 0
        self.L = len(blocks) + 1 + self.off
        self.plan, self.profile = plan, profile
        ops = plan.ops()
        reason = installable(ops, self.L)
        if reason is not None:
            raise InstallError(f"plan.schedule: the {plan.strategy} plan cannot be installed: {reason}; "
                               "plan with strategy='optimal' (its plans always can)")
        k = ops.index(("loss",))
        self.kind = {op[1]: op[0] for op in ops[:k] if op[0] in ("F", "R")}
        dropped = {op[1] for op in ops[:k] if op[0] == "drop"}
        self.keep = {i for i in range(1, self.L) if i not in dropped}
        self.bops = ops[k + 1:]
        self.counts = forward_counts(ops, self.L)
        self.policies = {i: list(r) for i, r in (policies or {}).items() if list(r)}
        for i in self.policies:
            if not 1 + self.off <= i < self.L:
                part = "prefix" if i == 1 and has_prefix else "head" if i == self.L else "no stage"
                raise InstallError(
                    f"plan.stage_policies.{i}: stage {i} is the model's {part}, which runs inside "
                    "the model's own forward; only blocks can run under a save policy (plan with "
                    "a profile from profile_model, which offers policies for blocks only)")
        self.compile = bool(compile)
        from memplan.profiler.policies import first_mincut

        i = None if self.compile else first_mincut(self.policies)
        if i is not None:  # NOTE [ Compiled blocks ] rule 4
            raise InstallError(f"plan.stage_policies.{i}: {self.policies[i][0]!r} is torch's "
                               "min-cut and runs only on compiled blocks; install with "
                               "compile=True, or plan a profile measured without compile")
        self._armed: set[int] = set()  # blocks whose next call records under their policy
        rerun = () if self.compile else self.policies.keys()
        inside = {id(m) for b in blocks for m in b.modules()}
        prefix = _Holder([m for m in model.modules() if id(m) not in inside])
        stages: list[nn.Module] = ([prefix] if has_prefix else []) + list(blocks) + [nn.Module()]
        self.device = _device_of(model)
        # forward hooks are not filtered (NOTE [ Installing a schedule ]): the installation's own
        # hooks are on the blocks
        self.guards = StageGuards(stages, forward_counts(ops, self.L, rerun), device=self.device,
                                  enabled=("rng", "buffers", "decisions"))
        self.step: _Step | None = None
        # an input that requires grad, so that a no-grad stage's _Rejoin output always does
        self._dummy = torch.empty(0, device=self.device, requires_grad=True)
        self.busy = False
        self.stopping = False
        self.warned_shape = False
        # what `again` rebuilds this installation from (NOTE [ Re-planning replaces the plan ])
        self._spec = ((model, blocks, has_prefix, plan, profile),
                      {"policies": policies, "compile": compile, "host_device": host_device})
        # every check that can refuse the plan runs before the model is touched: a refused plan
        # leaves no hook and no forward behind
        self.offload: Offloader | None = None
        if has_transfers(ops):
            self.offload = self._offloader(ops, k, host_device)
        self.forwards = _BlockForwards()
        for j, block in enumerate(blocks):
            s = j + 1 + self.off
            if s in self.policies or self.compile:
                self.forwards.set(block, self._forward_of(j, block, self.policies.get(s)))
        self.handles = [model.register_forward_pre_hook(_Hook(self._model_pre), with_kwargs=True),
                        model.register_forward_hook(_Hook(self._model_raised), always_call=True)]
        if self.offload is not None:
            self.handles.append(model.register_forward_hook(_Hook(self._model_post)))
        for j, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(_Hook(self._block_pre(j)),
                                                                with_kwargs=True))
            self.handles.append(block.register_forward_hook(_Hook(self._block_post(j))))

    def _offloader(self, ops: list, k: int, host_device: str | None) -> Offloader:
        """The transfer ops' machinery and where the forward phase runs them (NOTE [ Offload in
        installed plans ]); raises InstallError for what it does not run."""
        if host_device is None and (self.device.type != "cuda" or not torch.cuda.is_available()):
            raise OffloadNeedsCudaError(CPU_REFUSAL)
        L = self.L
        for op in ops:
            if op[0] in ("offload_record", "fetch_record") and op[1] == L or (
                    op[0] in ("offload", "fetch") and op[1] == L):
                raise InstallError(f"plan.schedule: {list(op)} moves the head's record or the loss, "
                                   "which run inside the model's forward and its loss; plan again")
        if self.compile:
            raise InstallError("compile: a plan with offload ops is installed uncompiled (saved-tensor "
                               "hooks move its records); install it with compile=False")
        off = Offloader(ops, [self.model], device=self.device, host_device=host_device)
        both = sorted(set(self.policies) & off.hooked)
        if both:
            raise InstallError(f"plan.stage_policies.{both[0]}: stage {both[0]} runs under a save "
                               "policy and its record, input or output moves to the host; offload "
                               "ops and save policies are not installed on one stage")
        # the drops and transfers before each forward-phase compute op (stage i; L + 1: loss)
        self.fwd_before: dict[int, list] = {}
        pending: list = []
        for op in ops[: k + 1]:
            if op[0] in ("F", "R") or op[0] == "loss":
                self.fwd_before[op[1] if op[0] != "loss" else L + 1] = pending
                pending = []
            elif op[0] in TRANSFER_OPS or op[0] == "drop":
                pending.append(op)
        return off

    def _window_start(self, step: _Step, i: int) -> None:
        """Forward phase: stage i (L + 1: the loss) starts; the transfers before it start with it."""
        off = self.offload
        if off is None:
            return
        self._window_end(step)
        for n, op in enumerate(self.fwd_before.get(i, [])):
            if op[0] == "drop":  # the installation keeps only `keep`; the offloader forgets a_i
                off.dropped(op[1], n, op)
            else:
                off.issue(n, op)
        off.start_window()
        step.window = True

    def _window_end(self, step: _Step) -> None:
        """The window op ended: its copies are waited for, a moved kept output is an `OnHost`
        until fetched (NOTE [ Offload in installed plans ])."""
        off = self.offload
        if off is None or not step.window:
            return
        step.window = False
        for kind, j in off.end_window():
            if kind == "offload" and j in step.kept:
                step.kept[j] = OnHost(j)  # type: ignore[assignment]
            elif kind == "fetch" and isinstance(step.kept.get(j), OnHost):
                step.kept[j] = off.value(j)

    def _model_post(self, module, args, out):
        """The model's forward returned (offload only): the head's window ends, the loss's starts,
        and the backward's start is hooked on the loss's node."""
        step = self.step
        if not self._active() or step is None:
            return None
        if step.head_hooks is not None:
            step.head_hooks.__exit__(None, None, None)
            step.head_hooks = None
        self._window_start(step, self.L + 1)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if loss is None and isinstance(out, torch.Tensor):
            loss = out
        if isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            loss.grad_fn.register_prehook(lambda grads: self._backward_start(step))
        return None

    def _backward_start(self, step: _Step) -> None:
        """The backward reached the loss: the ops before `B L` run (B L is the head's backward)."""
        if step is not self.step:
            return
        self._queue_end(step)
        self._run_until(step, self.L)

    # -- the forward phase ----------------------------------------------------------------------

    def _active(self) -> bool:
        return not self.busy and self.step is not None and (torch.is_grad_enabled() or bool(self.step.open))

    def _enter(self, i: int, inputs: Any = None) -> None:
        step = self.step
        assert step is not None
        step.autocast[i] = _autocast_state()
        self._window_start(step, i)
        cm = self.guards.forward(i)
        cm.__enter__()
        step.open.append(cm)
        if self.offload is not None and self.kind[i] == "R" and i in self.offload.hooked:
            hooks = self.offload.recording(i, inputs)  # NOTE [ Offload in installed plans ]
            hooks.__enter__()
            step.open.append(hooks)
        if self.kind[i] == "F":
            # NOTE [ Autocast's cast cache and no-grad stages ]: inside the user's autocast region
            # autocast keeps every weight it casts (weights that require grad) until the region
            # ends. A no-grad stage's casts would stay in that cache through the whole forward (a
            # low-precision copy of every forwarded block's weights: +30% on a 6-layer Llama at
            # 30% of store-all under fp16), and so would the recomputes' casts when the user's
            # backward runs under autocast too; the profile measures no-grad forwards without
            # the cache. So F stages and recomputes run without it (the same values).
            for cm in (torch.no_grad(), _no_cast_cache()):
                cm.__enter__()
                step.open.append(cm)

    def _exit(self) -> None:
        step = self.step
        assert step is not None
        while step.open:
            step.open.pop().__exit__(None, None, None)

    def _model_pre(self, module, args, kwargs):
        if self.busy or not torch.is_grad_enabled():
            return None
        if self.step is not None and self.step.open:
            self._exit()
        new = _no_cache(module, kwargs)
        self.step = _Step(args=args, kwargs=new)
        self._check_shape(args, kwargs)
        self.guards.prepare()
        if self.offload is not None:
            self.offload.begin_step()
        if self.has_prefix:
            self._enter(1, (args, new))
        return (args, new) if new is not kwargs else None

    def _model_raised(self, module, args, out):
        """The model's forward ended; when it raised (torch passes no output, inside its `except`:
        a forward that returns None normally is not this), the contexts its stages entered
        (no_grad, the guards) are left, so grad mode and the random streams are as the user had
        them, and the next step starts afresh."""
        raised = out is None and sys.exc_info()[1] is not None
        if raised and not self.busy and not self.stopping and self.step is not None:
            if self.step.open:
                self._exit()
            self.step = None
        return None

    def _check_shape(self, args, kwargs) -> None:
        if self.profile is None or self.warned_shape:
            return
        got = sum(_storages((args, kwargs)).values())
        want = self.profile.meta.get("apply", {}).get("call_bytes")
        if want is not None and got != want:
            self.warned_shape = True
            log.warning("memplan: this batch has %d bytes, the profiled one %d: the plan runs (same "
                        "gradients) but its peak will not be the predicted %d bytes; re-plan with "
                        "auto_checkpoint on a batch of this shape", got, want,
                        self.plan.predicted.peak_bytes if self.plan.predicted else 0)

    def _block_pre(self, j: int):
        def hook(module, args, kwargs):
            if self.stopping and j == 0:
                hidden, _ = _hidden_in(args, kwargs)
                raise _Stop(hidden)
            if not self._active():
                return None
            step = self.step
            s = j + 1 + self.off
            hidden, where = _hidden_in(args, kwargs)
            replaced = None
            if j == 0 and self.has_prefix:
                self._exit()
                if hidden is not None:
                    new = self._output(1, hidden, None)
                    if new is not hidden:
                        replaced = _with_hidden(args, kwargs, where, new)
                        hidden = new
            # the block's other arguments, the hidden states left out (holding them would pin a_{s-1})
            keep_in = j == 0 and not self.has_prefix  # a_0, the batch: the caller holds it anyway
            bare = _with_hidden(args, kwargs, where, hidden if keep_in else None)
            rg = bool(hidden is not None and hidden.requires_grad)
            step.blocks[j] = (bare[0], bare[1], where, rg)
            step.inputs[s] = hidden if self.kind[s] == "F" else None
            if keep_in and hidden is not None:
                step.kept[0] = hidden
            if self.kind[s] == "R" and s in self.policies:
                self._armed.add(j)
            self._enter(s, (args, kwargs) if replaced is None else replaced)
            return replaced
        return hook

    def _block_post(self, j: int):
        def hook(module, args, out):
            if not self._active():
                return None
            self._exit()
            s = j + 1 + self.off
            hidden = _hidden_of(out)
            x_in = self.step.inputs.pop(s, None)
            if hidden is None:
                return None
            new = self._output(s, hidden, x_in)
            if self.offload is not None and j == len(self.blocks) - 1:
                self._head_start(self.step, new)
            if new is hidden:
                return None
            return new if isinstance(out, torch.Tensor) else type(out)((new, *out[1:]))
        return hook

    def _output(self, i: int, hidden: torch.Tensor, x_in: torch.Tensor | None) -> torch.Tensor:
        """Stage i's output in the forward: kept if the schedule keeps it; an `F` stage's (computed
        under no_grad) is joined to the graph by a `_Rejoin` node whose backward runs `B i`; a
        recorded stage's output gets a gradient hook that runs the ops before `B i`."""
        step = self.step
        assert step is not None
        if i in self.keep:
            step.kept[i] = hidden.detach()
        if self.offload is not None:
            self.offload.produced(i, hidden.detach())
            if self.kind[i] == "R":
                self.offload.recorded(i)
        if self.kind[i] == "F":
            return _Rejoin.apply(self, step, i, x_in, self._dummy, hidden)
        if hidden.requires_grad:
            hidden.register_hook(self._trigger(i))
        return hidden

    def _head_start(self, step: _Step, hidden: torch.Tensor) -> None:
        """The head (stage L) starts after the last block: its window, and its saved-tensor hooks
        when its input moves (NOTE [ Offload in installed plans ])."""
        off = self.offload
        assert off is not None
        self._window_start(step, self.L)
        if self.L in off.hooked:
            step.head_hooks = off.recording(self.L, hidden)
            step.head_hooks.__enter__()

    def _forward_of(self, j: int, block: nn.Module, recompute: list[str] | None) -> Callable:
        """The forward installed on block j (NOTE [ Save policies of installed blocks ], NOTE
        [ Compiled blocks ]): its recorded calls (armed by the installation) run under its save
        policy through `recorded`; with `compile`, through `torch.compile` of the block's forward
        (plain calls) and of its forward under the policy (recorded calls)."""
        from memplan.profiler.policies import recorded

        orig = block.forward
        s = j + 1 + self.off

        if self.compile:
            plain = _compiled(type(block), None)
            policy = _compiled(type(block), recompute) if recompute else None

            def compiled_forward(*args: Any, **kwargs: Any) -> Any:
                armed = j in self._armed
                self._armed.discard(j)
                if policy is not None and armed and torch.is_grad_enabled():
                    return policy(block, *args, **kwargs)
                return plain(block, *args, **kwargs)
            return compiled_forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            armed = j in self._armed
            self._armed.discard(j)
            hidden, where = _hidden_in(args, kwargs)
            if not armed or not torch.is_grad_enabled() or hidden is None:
                return orig(*args, **kwargs)
            calls = [0]

            def fn(h: torch.Tensor) -> Any:
                calls[0] += 1
                a, kw = _with_hidden(args, kwargs, where, h)
                if calls[0] == 1:  # the recorded forward itself, inside the stage's guards
                    with _no_cast_cache():
                        return orig(*a, **kw)
                # its rerun inside the backward (NOTE [ Save policies in the runner ] points 2-3
                # in executor/runner.py): the stage's guards, the installation's hooks idle
                busy, self.busy = self.busy, True
                try:
                    with self.guards.forward(s), _no_cast_cache():
                        out = orig(*a, **kw)
                finally:
                    self.busy = busy
                self.guards.flush()
                return out
            return recorded(fn, hidden, recompute=recompute)
        return forward

    # -- the backward phase ---------------------------------------------------------------------

    def _queue_end(self, step: _Step) -> None:
        if not step.queued:
            step.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._end(step))

    def _current(self, step: _Step) -> None:
        """Raise unless `step` is the one whose backward the installation runs."""
        if step is not self.step:
            raise InstallError(
                "backward: this backward runs through a forward that the installed plan has "
                "already finished or replaced (retain_graph=True and a second backward, or two "
                "forwards before one backward); an installed plan runs each forward's backward "
                "once, before the next forward: call remove_checkpoint(model) for such a loop")

    def _trigger(self, i: int):
        step = self.step

        def hook(grad):
            self._current(step)
            step.held = None
            self._queue_end(step)
            self._run_until(step, i)
            if i in self.policies and not self.compile:
                self.guards.flush()  # before checkpoint's rerun saves the stream's state
            # d_i lives until B i ends, as the chain model (and a no-grad stage's B i) has it
            step.held = grad
            return None
        return hook

    def _backward_stage(self, step: _Step, i: int, grad: torch.Tensor) -> torch.Tensor | None:
        """`B i` of a stage forwarded without a record: the ops before it (its `R i` among them),
        then the backward through the recomputed record. Returns d_{i-1}."""
        self._current(step)
        step.held = None
        self._queue_end(step)
        self._run_until(step, i)
        rec = step.recs.pop(i, None)
        if rec is None:
            raise InstallError(f"plan.schedule: stage {i}'s backward has no record (no R {i} before B {i})")
        inp, edge = rec
        if i in self.policies and not self.compile:
            self.guards.flush()  # before checkpoint's rerun saves the stream's state
        if edge is not None:
            torch.autograd.backward([edge], [grad])
        if isinstance(inp, Slots):
            return inp.gradients()[0]
        return inp.grad if inp is not None and inp.requires_grad else None

    def _run_until(self, step: _Step, i: int) -> None:
        """Run the schedule's ops after `loss` up to `B i` (the B ops of autograd are passed);
        transfers as NOTE [ Offload in installed plans ] says."""
        off = self.offload
        self._window_end(step)  # the window op before (a B autograd ran) ended
        while step.cursor < len(self.bops):
            k = step.cursor
            op = self.bops[k]
            step.cursor += 1
            if op[0] == "B":
                if off is not None:
                    off.start_window()
                    step.window = True
                    if op[1] == i:
                        self._check_reads(step, op)
                if op[1] == i:
                    return
                self._window_end(step)
            elif op[0] == "drop":
                if off is not None:
                    off.dropped(op[1], k, op)
                step.kept.pop(op[1], None)
            elif op[0] in TRANSFER_OPS:
                assert off is not None
                off.issue(k, op)
            else:
                if off is not None:
                    off.start_window()
                    step.window = True
                    self._check_reads(step, op)
                self._recompute(step, op[0], op[1])
                self._window_end(step)

    def _check_reads(self, step: _Step, op: tuple) -> None:
        """Refuse an op that reads a tensor on the host (a tensor whose fetch is pending in this
        window is waited for)."""
        off = self.offload
        assert off is not None
        j = op[1] - 1
        if isinstance(step.kept.get(j), OnHost):
            if not off.fetch_pending(j):
                raise InstallError(f"plan.schedule {list(op)}: a_{j} is on the host; fetch it "
                                   f"(fetch {j}) with the op before")
            step.kept[j] = off.value(j)
        if op[0] == "B" and off.record_on_host(op[1]):
            raise InstallError(f"plan.schedule {list(op)}: the record of stage {op[1]} is on the "
                               f"host; fetch it (fetch_record {op[1]}) with the op before")

    def _recompute(self, step: _Step, kind: str, i: int) -> None:
        record = kind == "R"
        grad_ctx = torch.enable_grad() if record else torch.no_grad()
        inp = None
        self.busy = True
        try:
            with self.guards.forward(i), _autocast(step.autocast.get(i, [])), grad_ctx:
                if self.has_prefix and i == 1:
                    self.stopping = True
                    try:
                        self.model(*step.args, **step.kwargs)
                        raise InstallError("blocks: the forward did not reach the first block again")
                    except _Stop as stop:
                        out = stop.hidden
                    finally:
                        self.stopping = False
                else:
                    j = i - 1 - self.off
                    args, kwargs, where, rg = step.blocks[j]
                    a_in = step.kept.get(i - 1)
                    if a_in is None:
                        raise InstallError(f"plan.schedule: stage {i}'s input a_{i - 1} is not kept")
                    off = self.offload
                    hooked = record and off is not None and i in off.hooked
                    if hooked:  # NOTE [ Offload in installed plans ]
                        x, inp = off.cut(a_in) if rg else (a_in.detach(), None)
                    else:
                        x = a_in.detach().requires_grad_(rg) if record else a_in
                        inp = x if record else None
                    a, kw = _with_hidden(args, kwargs, where, x)
                    if record and i in self.policies:
                        self._armed.add(j)
                    with off.recording(i, (a, kw)) if hooked else contextlib.nullcontext():
                        out = _hidden_of(self.blocks[j](*a, **kw))
                    del x, a, kw
        finally:
            self.busy = False
        step.kept[i] = out.detach()
        if self.offload is not None:
            self.offload.produced(i, step.kept[i])
            if record:
                self.offload.recorded(i)
        if record:
            # the record keeps the input alias and the output's autograd edge, not the output:
            # `drop i` frees a_i while the record lives (as in executor/runner.py)
            step.recs[i] = (inp, get_gradient_edge(out) if out.requires_grad else None)
        del out

    def _end(self, step: _Step) -> None:
        """End of the backward: the random streams where the unplanned step leaves them, and
        nothing the step kept."""
        self._window_end(step)
        self.guards.flush()
        if self.step is step:
            self.step = None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.forwards.remove()
        if self.step is not None and self.step.open:
            self._exit()
        self.step = None

    def again(self) -> _Installation:
        """A fresh installation of the same plan into the same model (after `remove`)."""
        args, kwargs = self._spec
        return _Installation(*args, **kwargs)


_INSTALLED: weakref.WeakKeyDictionary[nn.Module, _Installation] = weakref.WeakKeyDictionary()


# NOTE [ Re-planning replaces the plan ]
# A model measured or planned while a plan is installed is measured as it was without one: the
# installation's hooks (and its compiled or policy forwards) would otherwise run inside the
# profile's own hooks and marks. So `profile_model`, `auto_checkpoint` and `install_plan` first
# set the installed plan aside (`remove`: every hook and forward it added is gone, the model is
# exactly as it was):
# - `auto_checkpoint` and `install_plan` replace it: the new plan is installed as into a fresh
#   model; when they raise (bad input, nothing fits, a plan refused), the old plan is installed
#   again (`again`), so a refused call leaves the model as it found it;
# - `profile_model` installs it again when it returns or raises.
# Invariant: at most one installation per model, and none while the model is measured.


@contextlib.contextmanager
def _plan_set_aside(model: nn.Module, *, replace: bool):
    """The model without its installed plan inside the block (NOTE [ Re-planning replaces the
    plan ]); afterwards the old plan is installed again unless the block returned and `replace`."""
    old = _INSTALLED.pop(model, None)
    if old is None:
        yield
        return
    old.remove()
    log.info("memplan: the installed %s plan is set aside while the model is measured", old.plan.strategy)
    try:
        yield
    except BaseException:
        _reinstall(model, old)
        raise
    if not replace:
        _reinstall(model, old)


def _reinstall(model: nn.Module, old: _Installation) -> None:
    """`old`'s plan installed in `model` again, unless the block installed another one."""
    if model in _INSTALLED:
        return
    _INSTALLED[model] = old.again()


def _side_values(arg_st: list[dict[int, int]], in_st: list[dict[int, int]],
                 excl: dict[int, int]) -> dict[int, int]:
    """The prefix's side values (storage -> bytes): what the blocks are called with besides their
    hidden states and `excl` (the batch, the weights): masks, rotary tables, positions, held for
    the blocks' recomputes through the whole step (NOTE [ Measured in context ])."""
    return {p: b for j, args in enumerate(arg_st) for p, b in args.items()
            if p not in in_st[j] and p not in excl}


def _model_stages(model: nn.Module, example_batch: Any, blocks, loss_fn) -> Profile:
    """The model's chain layout (names, output and parameter bytes; no times) on a batch: what a
    plan's fingerprint covers, from one forward under torch.no_grad()."""
    label, blist = find_blocks(model, blocks)
    inputs, target = _split(example_batch, loss_fn)
    tap = _Tap(model, blist)
    try:
        # a forward (BatchNorm's statistics, dropout's stream) that leaves no trace
        with _state_kept(model, _device_of(model), grads=False), torch.no_grad():
            loss_b = _loss_bytes(_loss_of(_call(model, inputs), target, loss_fn))
        batch_st = _storages(inputs) | _storages(target)
        has_prefix = tap.inputs[0] is None or tap.inputs[0].untyped_storage().data_ptr() not in batch_st
        x = [sum(_storages(o).values()) for o in tap.outputs]
        x0 = sum(_storages(tap.inputs[0]).values()) if has_prefix else 0
        excl = batch_st | _storages(list(model.parameters())) | _storages(list(model.buffers()))
        side = sum(_side_values([_storages(a) for a in tap.args], [_storages(h) for h in tap.inputs],
                                excl).values()) if has_prefix else 0
    finally:
        tap.remove()
    names, kinds = _stage_labels(len(blist), has_prefix)
    outs = ([x0] if has_prefix else []) + x + [4]
    layers = [LayerProfile(name=nm, kind=kd, forward_s=0, backward_s=0, output_bytes=o, saved_bytes=0)
              for nm, kd, o in zip(names, kinds, outs, strict=True)]
    _param_bytes(model, blist, layers, has_prefix)
    # a layout, not a measurement: no saved bytes or times (measure_step predicts no store-all
    # peak from it); call_bytes for the installation's batch-shape warning
    return Profile(input_bytes=sum(batch_st.values()) + side + max(0, loss_b - 4), layers=layers,
                   meta={"apply": {"blocks": label, "n_blocks": len(blist), "prefix": has_prefix,
                                   "call_bytes": sum(_storages(inputs).values()), "layout": True}})


def _install(model: nn.Module, plan: Plan, profile: Profile, blocks, *,
             compile: bool = False, _host_device: str | None = None) -> None:
    """Install `plan` (checked) into `model`. `_host_device` is for tests only: the CPU runs a
    plan's transfer ops as copies to other CPU tensors (NOTE [ Offload in the executor ])."""
    from memplan.executor.run import policy_recompute

    if model in _INSTALLED:
        remove_checkpoint(model)
    _, blist = find_blocks(model, blocks)
    has_prefix = bool(profile.meta.get("apply", {}).get("prefix", True))
    if plan.n_stages != profile.n_stages:
        raise InstallError(f"plan.n_stages: the plan is for {plan.n_stages} stages, the model has "
                           f"{profile.n_stages}; plan this model")
    try:
        policies = policy_recompute(plan, profile)
    except ExecutorError as err:
        raise InstallError(str(err)) from None
    _INSTALLED[model] = _Installation(model, blist, has_prefix, plan, profile, policies=policies,
                                      compile=compile, host_device=_host_device)


def install_plan(model: nn.Module, plan: Plan | dict | str, example_batch: Any, *,
                 blocks: str | Sequence[nn.Module] | None = None, loss_fn: Callable | None = None,
                 profile: Profile | dict | str | None = None, compile: bool = False) -> Plan:
    """Install a plan made earlier (the CLI, the API, another machine) into `model` in place.

    `example_batch` (one forward under torch.no_grad()) gives the model's stage sizes: a plan whose
    `profile_fingerprint` is not this model's on this batch shape is refused with `InstallError`,
    as is a schedule that cannot be installed (`installable`). A plan that records blocks under
    save policies (`plan.stage_policies`) needs `profile`, the profile it was made from (it holds
    the policies' recompute lists); without it `measure_step` reports no store-all peak (the
    plan carries none). `compile`: run each block through `torch.compile` (NOTE [ Compiled
    blocks ]). A plan already installed in `model` is replaced; when this raises, it stays
    (NOTE [ Re-planning replaces the plan ]). Returns the plan."""
    _check_model(model)
    _check_flag(compile, "compile")
    try:
        if isinstance(plan, str):
            plan = Plan.model_validate_json(plan)
        elif isinstance(plan, dict):
            plan = Plan.model_validate(plan)
    except ValidationError as err:
        raise InstallError(format_validation_error(err, what="plan")) from None
    if not isinstance(plan, Plan):
        raise InstallError(f"plan: expected a Plan, a dict or JSON text, got {type(plan).__name__}")
    if not plan.feasible or not plan.schedule:
        raise InfeasiblePlanError(f"plan: it has no schedule ({plan.message or 'infeasible'})")
    with _plan_set_aside(model, replace=True):
        _install_checked(model, plan, example_batch, blocks=blocks, loss_fn=loss_fn, profile=profile,
                         compile=compile)
    return plan


def _install_checked(model: nn.Module, plan: Plan, example_batch: Any, *, blocks, loss_fn,
                     profile: Profile | dict | str | None, compile: bool) -> None:
    """`install_plan` into a model with no plan installed: the plan checked against the model's
    layout on `example_batch` (and `profile`, when given), then installed."""
    layout = _model_stages(model, example_batch, blocks, loss_fn)
    if plan.profile_fingerprint and plan.profile_fingerprint != layout.fingerprint():
        raise InstallError(
            f"plan.profile_fingerprint: {plan.profile_fingerprint} is not this model's "
            f"{layout.fingerprint()} ({layout.n_stages} stages on this batch shape): the plan was made "
            "for another model or batch shape; plan this one (auto_checkpoint)"
        )
    prof = _profile_checked(profile, layout) if profile is not None else None
    # the full profile, when given, is the installation's: measure_step's store-all comparison
    _install(model, plan, prof or layout, blocks, compile=compile)


def remove_checkpoint(model: nn.Module) -> Plan | None:
    """Remove the installed plan: every hook the installation added is removed, so the model is
    exactly as it was (no parameter, buffer or attribute was changed). Returns the removed plan,
    or None when none was installed."""
    _check_model(model)
    inst = _INSTALLED.pop(model, None)
    if inst is None:
        return None
    inst.remove()
    return inst.plan


def installed_plan(model: nn.Module) -> Plan | None:
    """The plan installed in `model`, or None."""
    _check_model(model)
    inst = _INSTALLED.get(model)
    return inst.plan if inst is not None else None


# the plan request's fields that auto_checkpoint's arguments fill, by argument name
_REQUEST_ARGS = {"budget_bytes": "budget", "memory_bytes": "memory",
                 "options.max_overhead": "max_overhead", "options.offload_bandwidth":
                 "offload_bandwidth", "options.host_memory_bytes": "host_memory_bytes"}


def _profile_for(model: nn.Module, example_batch: Any, profile: Profile | dict | str, *, blocks,
                 loss_fn) -> Profile:
    """`profile` read and checked against the model's layout on `example_batch` (its fingerprint:
    stages, output and parameter bytes), as `install_plan` checks a plan's."""
    return _profile_checked(profile, _model_stages(model, example_batch, blocks, loss_fn))


def _profile_checked(profile: Profile | dict | str, layout: Profile) -> Profile:
    """`profile` read, and refused (`InstallError`) unless its fingerprint is the model's
    `layout`'s: the same stages, output and parameter bytes, so made for this model and batch
    shape."""
    from memplan.profiler.schema import load_profile

    try:
        prof = load_profile(profile)
    except ProfileError as exc:
        msg = str(exc)
        raise InstallError(msg if msg.startswith("profile") else f"profile: {msg}") from None
    if prof.fingerprint() != layout.fingerprint():
        raise InstallError(f"profile: its fingerprint {prof.fingerprint()} is not this model's "
                           f"{layout.fingerprint()} ({layout.n_stages} stages on this batch shape): "
                           "it was made for another model or batch shape")
    return prof


def auto_checkpoint(
    model: nn.Module,
    example_batch: Any,
    *,
    budget: int | str | None = None,
    memory: int | str | None = None,
    max_overhead: float | None = None,
    strategy: str = "optimal",
    blocks: str | Sequence[nn.Module] | None = None,
    loss_fn: Callable | None = None,
    optimizer: str = "adamw",
    profile: Profile | None = None,
    repeats: int = 3,
    policies: bool | Sequence[str] = False,
    compile: bool = False,
    offload_bandwidth: float | None = None,
    host_memory_bytes: int | None = None,
) -> Plan:
    """Profile `model` through its own forward and loss on `example_batch`, plan, and install the
    plan into the model in place (NOTE [ The model as a chain ], [ Installing a schedule ]).

    `budget`: activation bytes (an int or "8GiB"); `memory`: a device's memory, from which the
    fixed bytes (parameters, gradients, `optimizer` state) are subtracted; `max_overhead`: the
    least memory for at most that fraction of recompute time (optimal only); none of them: the
    fastest plan. `blocks`: the repeated blocks (default: found). With `loss_fn`, the batch is
    (inputs, target) and the loss is loss_fn(model(inputs), target); otherwise the model returns
    it (`.loss`, a "loss" key, or a scalar). `profile`: one made earlier by `profile_model` for
    this model and batch shape (skips profiling). `policies`: profile the blocks' save policies
    too (True: the built-in candidates, or a list of their names), so the planner can record
    blocks under them (NOTE [ Save policies of installed blocks ]). `compile`: compile each block
    (`torch.compile` per block), profile and plan on the compiled costs (with `policies=True`,
    inductor's min-cut under memory budgets among the blocks' policies), and install the plan on
    the compiled blocks (NOTE [ Compiled blocks ]). `offload_bandwidth` (bytes/s) and
    `host_memory_bytes`: the optimal plan may also move kept activations to host memory
    (docs/chain-model.md section 10.9; CUDA only: on the CPU the install is refused).

    A plan already installed in `model` is replaced: the model is profiled and planned without it,
    as a fresh one; when this raises, it stays (NOTE [ Re-planning replaces the plan ]).

    Returns the installed `Plan` (predicted seconds and bytes). Raises `InfeasiblePlanError` when
    nothing fits (the message says the least budget that does), `InstallError` on bad input."""
    from memplan.planner import plan as make_plan
    from memplan.planner.units import parse_bytes

    _check_model(model)
    _check_flag(compile, "compile")
    if profile is None:
        _check_trainable(model, "auto_checkpoint")
    try:
        budget_bytes = parse_bytes(budget, field="budget") if budget is not None else None
        memory_bytes = parse_bytes(memory, field="memory") if memory is not None else None
    except ValueError as exc:  # the message names the argument
        raise InstallError(str(exc)) from None
    if max_overhead is not None and (isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float))
                                     or max_overhead < 0):
        raise InstallError(f"max_overhead: a fraction >= 0 (0.2 = 20%), got {max_overhead!r}")
    options: dict[str, Any] = {}
    if max_overhead is not None:
        options["max_overhead"] = float(max_overhead)
    if offload_bandwidth is not None:
        options["offload_bandwidth"] = offload_bandwidth
    if host_memory_bytes is not None:
        options["host_memory_bytes"] = host_memory_bytes
    if budget_bytes is not None and memory_bytes is not None:
        raise InstallError("budget, memory: give one of them (activation bytes, or the device's "
                           "memory), not both")
    with _plan_set_aside(model, replace=True):
        if profile is not None:
            prof = _profile_for(model, example_batch, profile, blocks=blocks, loss_fn=loss_fn)
        else:
            prof = profile_model(model, example_batch, blocks=blocks, loss_fn=loss_fn,
                                 optimizer=optimizer, repeats=repeats, policies=policies,
                                 compile=compile)
        try:
            plan = make_plan(prof, budget_bytes=budget_bytes, memory_bytes=memory_bytes,
                             strategy=strategy, **options)
        except PlanError as exc:  # named by this function's arguments, not the plan request's
            field = _REQUEST_ARGS.get(exc.field or "", exc.field)
            raise InstallError(f"{field}: {exc.reason}" if field else exc.reason) from None
        if not plan.feasible:
            raise InfeasiblePlanError(f"budget: {plan.message}")
        _install(model, plan, prof, blocks, compile=compile)
    return plan


# ---------------------------------------------------------------------------------------------
# measuring a step of the user's loop


@dataclass
class StepMeasurement:
    """One training step (forward, loss, backward) of the user's model, measured against the
    installed plan's prediction."""

    measured_peak_bytes: int  # activation peak: above the level before the step, batch included
    predicted_peak_bytes: int | None  # the installed plan's (None: no plan installed)
    store_all_peak_bytes: int | None  # the same model with nothing recomputed, predicted
    peak_error_pct: float | None  # (measured - predicted) / measured, %
    measured_step_s: float  # median seconds of the timed steps (forward, loss, backward)
    predicted_step_s: float | None
    time_error_pct: float | None
    loss: float
    strategy: str | None
    message: str

    def __str__(self) -> str:
        return self.message


def measure_step(model: nn.Module, batch: Any, *, loss_fn: Callable | None = None,
                 time_steps: int = 2) -> StepMeasurement:
    """Measure the user's own step on `batch`: `time_steps` timed steps, then one under exact
    memory accounting (CPU) or the allocator's counters (CUDA). Each step zeroes the gradients
    first (allocating missing ones, as every step after the first has them) and runs forward, loss
    and backward; the last step's gradients are left in `.grad` (call the optimizer after it).

    Returns a `StepMeasurement`: measured activation peak (bytes, the batch included, the gradient
    of tied weights left out as the profile's fixed memory) and step time (seconds) against the
    installed plan's prediction, with a sentence saying what they mean. The store-all peak is
    predicted from the installed plan's profile; a plan installed by `install_plan` without
    `profile=` has none (its layout holds no saved bytes), and the store-all peak is left out
    (None) with a sentence saying so."""
    from memplan.profiler.memory import measure_memory

    _check_model(model)
    if isinstance(time_steps, bool) or not isinstance(time_steps, int) or time_steps < 0:
        raise InstallError(f"time_steps: an integer >= 0, got {time_steps!r}")
    _check_trainable(model, "measure_step")
    inputs, target = _split(batch, loss_fn)
    dev = _device_of(model)
    params = [p for p in model.parameters() if p.requires_grad]

    def zero() -> None:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    seconds = []
    loss_v = 0.0
    for _ in range(time_steps):
        zero()
        t0 = _now(dev)
        loss = _loss_of(_call(model, inputs, arg="batch"), target, loss_fn)
        _backward(loss)
        seconds.append(_now(dev) - t0)
        loss_v = float(loss.detach())
        del loss
    zero()
    with measure_memory(dev) as meter:
        loss = _loss_of(_call(model, inputs, arg="batch"), target, loss_fn)
        meter.mark("backward")
        _backward(loss)
        loss_v = float(loss.detach())
        del loss
    tied = _tied_grad_bytes(model)
    fwd, bwd = meter.phases["start"], meter.phases["backward"]
    batch_b = sum((_storages(inputs) | _storages(target)).values())
    measured = max(fwd.peak_bytes, bwd.peak_bytes - tied) + batch_b
    inst = _INSTALLED.get(model)
    pred = inst.plan.predicted if inst is not None else None
    store = _store_all_peak(inst)
    step_s = statistics.median(seconds) if seconds else 0.0
    pk, ts = (pred.peak_bytes, pred.time_s) if pred is not None else (None, None)
    perr = error_pct(measured, pk)
    terr = error_pct(step_s, ts) if seconds else None
    if inst is None:
        msg = f"no plan installed: activation peak {measured} bytes, step {step_s:.4g} s"
    else:
        msg = (f"{inst.plan.strategy} plan: activation peak {measured} bytes measured, {pk} predicted "
               f"({perr:+.2f}%)" + (f"; store-all would be {store} bytes" if store else "")
               + ("; store-all peak unknown (installed without profile=: give install_plan the "
                  "profile the plan was made from)" if store is None and _is_layout(inst.profile) else "")
               + (f"; step {step_s:.4g} s measured, {ts:.4g} s predicted ({terr:+.1f}%)" if seconds else ""))
        if store and measured >= 0.98 * store:
            msg += ("; the plan saves nothing here: the budget is at or above the store-all peak, "
                    "or the batch is not the profiled shape")
    return StepMeasurement(
        measured_peak_bytes=measured, predicted_peak_bytes=pk, store_all_peak_bytes=store,
        peak_error_pct=perr, measured_step_s=step_s, predicted_step_s=ts, time_error_pct=terr,
        loss=loss_v, strategy=inst.plan.strategy if inst is not None else None, message=msg,
    )


def _store_all_peak(inst: _Installation | None) -> int | None:
    """The store-all activation peak predicted from the installation's profile; None without a
    measured one: `install_plan` without `profile=` keeps only the model's layout (`_is_layout`),
    whose saved bytes and temporaries are unknown, and a store-all replay of it would predict
    little more than the blocks' outputs (a twentieth of a tiny GPT-2's real peak)."""
    from memplan.planner import plan as make_plan

    if inst is None or inst.profile is None or _is_layout(inst.profile):
        return None
    try:
        return make_plan(inst.profile, strategy="store-all").predicted.peak_bytes
    except ValueError:
        return None


def _is_layout(profile: Profile) -> bool:
    """True for `_model_stages`'s layout (sizes of outputs and parameters, nothing measured)."""
    return bool(profile.meta.get("apply", {}).get("layout"))
