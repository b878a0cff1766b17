"""Guards that make a recomputed forward identical to the first one, and free of double side effects.

NOTE [ The traps of recomputation ]
A recompute (the second or later forward of a stage within one step) must produce exactly the
tensors of the first forward, or the gradients are silently wrong, and must not repeat the first
forward's side effects, or the model's state drifts from the unplanned run:

- randomness (dropout masks): the generator state before the stage's first forward is kept and
  restored for each recompute, and the stream's state after the recompute is set back, so the run
  consumes the random stream exactly as the unplanned step does;
- stateful buffers (BatchNorm running statistics, `num_batches_tracked`, quantization observers'
  min/max, expert counters kept in buffers): the buffers as they were before the first forward are
  loaded for the recompute, so that it computes what the first forward computed (an observer sees
  the same history), and the buffers as the first forward left them are put back afterwards, so
  that each is updated once per step;
- data-dependent decisions (MoE routing with near ties and capacity drops, early-exit choices):
  each recomputed stage gets a `DecisionLog` recorded during its first forward and replayed in
  call order during recomputes (profiler.models.decisions); modules skip other side effects while
  `is_replaying()` is true;
- forward hooks: a hook that returned nothing in the first forward (a counter, a logger) is not
  called again during a recompute; one that replaced an output is, since the output depends on it.

Only stages that the schedule runs forward more than once are guarded; snapshots are allocated
before the step starts (`prepare`) so that the measured peak is the plan's. The one allocation left
inside the step is the CPU generator's 5056-byte state tensor made while restoring it, freed at
once; every restore happens at the start of a forward (or at the step's end), where the level is
below the op's peak unless the stage's x_i + s_i + tf_i is under 5 KB.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["StageGuards", "is_recomputing", "decisions_module", "GUARDS"]

GUARDS = ("rng", "buffers", "decisions", "hooks")  # every guard; tests switch some off to show the trap

log = logging.getLogger(__name__)

_RECOMPUTING = [False]


def is_recomputing() -> bool:
    """True inside a recomputed forward run by the executor (for hooks and custom modules)."""
    return _RECOMPUTING[0]


def decisions_module() -> Any | None:
    """memplan.profiler.models.decisions when it is installed (the decision log), else None."""
    try:
        from memplan.profiler.models import decisions
    except ImportError:
        return None
    return decisions


class _RngState:
    """Generator states (CPU, and the CUDA device in use) without tracked allocations to keep."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.default_generator.clone_state()
        self.cuda = None
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            self.cuda = torch.cuda.default_generators[idx].clone_state()

    def restore(self) -> None:
        """Put the generators back to the kept states; repeatable (the kept states never move)."""
        # CPU generators cannot take a Generator state directly; the tensor made here is freed at once
        torch.default_generator.set_state(self.cpu.get_state())
        if self.cuda is not None:
            idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
            # graphsafe_set_state shares the given state object with the generator, which then
            # advances it: hand over a copy, or the next restore of this snapshot (a stage
            # forwarded three times in a step) would start from where the recompute left it
            torch.cuda.default_generators[idx].graphsafe_set_state(self.cuda.clone_state())


class _Buffers:
    """Preallocated copies of a stage's buffers: `save` and `load` copy in place."""

    def __init__(self, stage: nn.Module) -> None:
        self.slots: list[tuple[nn.Module, str]] = []
        for module in stage.modules():
            for name, buf in module._buffers.items():
                if buf is not None:
                    self.slots.append((module, name))
        self.copies = [self._get(m, n).detach().clone() for m, n in self.slots]

    @staticmethod
    def _get(module: nn.Module, name: str) -> torch.Tensor:
        return module._buffers[name]

    def save(self) -> None:
        with torch.no_grad():
            for k, (m, n) in enumerate(self.slots):
                buf = self._get(m, n)
                if buf.shape == self.copies[k].shape and buf.dtype == self.copies[k].dtype:
                    self.copies[k].copy_(buf)
                else:  # an observer that initialises its buffers lazily changed their shape
                    self.copies[k] = buf.detach().clone()

    def load(self) -> None:
        with torch.no_grad():
            for k, (m, n) in enumerate(self.slots):
                buf = self._get(m, n)
                if buf.shape == self.copies[k].shape and buf.dtype == self.copies[k].dtype:
                    # through .data: autograd may hold the buffer (BatchNorm saves its running
                    # statistics), and a version bump would fail that record's backward
                    buf.data.copy_(self.copies[k])
                else:
                    m._buffers[n] = self.copies[k].clone()


class _HookFilter:
    """Records which forward hooks of a stage return nothing, and silences those in recomputes."""

    def __init__(self, stage: nn.Module) -> None:
        self.modules = [m for m in stage.modules() if m._forward_hooks or m._forward_pre_hooks]
        self.returned: set[tuple[int, str, int]] = set()  # (module id, kind, hook id) that returned
        self.silenced = 0

    @contextlib.contextmanager
    def _swapped(self, wrap) -> Iterator[None]:
        saved = []
        for m in self.modules:
            saved.append((m, dict(m._forward_hooks), dict(m._forward_pre_hooks)))
            for kind, table in (("post", m._forward_hooks), ("pre", m._forward_pre_hooks)):
                for hid, fn in list(table.items()):
                    table[hid] = wrap(m, kind, hid, fn)
        try:
            yield
        finally:
            for m, post, pre in saved:
                m._forward_hooks.clear()
                m._forward_hooks.update(post)
                m._forward_pre_hooks.clear()
                m._forward_pre_hooks.update(pre)

    def recording(self) -> contextlib.AbstractContextManager:
        if not self.modules:
            return contextlib.nullcontext()

        def wrap(m, kind, hid, fn):
            def hook(*args, **kwargs):
                out = fn(*args, **kwargs)
                if out is not None:
                    self.returned.add((id(m), kind, hid))
                return out
            return hook

        return self._swapped(wrap)

    def replaying(self) -> contextlib.AbstractContextManager:
        if not self.modules:
            return contextlib.nullcontext()

        def wrap(m, kind, hid, fn):
            if (id(m), kind, hid) in self.returned:
                return fn

            def silent(*args, **kwargs):
                self.silenced += 1
                return None
            return silent

        return self._swapped(wrap)


class StageGuards:
    """Per-stage guards for one schedule: call `prepare()` before each step (outside any memory
    measurement), then run every forward of stage i inside `forward(i)`."""

    def __init__(
        self, stages: Sequence[nn.Module], forward_counts: Sequence[int], *, device: torch.device,
        enabled: Sequence[str] = GUARDS,
    ) -> None:
        unknown = set(enabled) - set(GUARDS)
        if unknown:
            raise ValueError(f"guards: unknown {sorted(unknown)}; choose from {', '.join(GUARDS)}")
        self.enabled = set(enabled)
        self.stages = list(stages)
        self.counts = list(forward_counts)  # per stage 1..L: forwards in one step
        self.device = device
        self.guarded = [i + 1 for i, n in enumerate(self.counts) if n > 1]
        self._decisions = decisions_module() if "decisions" in self.enabled else None
        self._buffers: dict[int, tuple[_Buffers, _Buffers]] = {}
        self._hooks: dict[int, _HookFilter] = {}
        for i in self.guarded:
            stage = self.stages[i - 1]
            first = _Buffers(stage)
            if first.slots and "buffers" in self.enabled:
                self._buffers[i] = (first, _Buffers(stage))
            hooks = _HookFilter(stage)
            if hooks.modules and "hooks" in self.enabled:
                self._hooks[i] = hooks
        self._seen: dict[int, int] = {}
        self._rng: dict[int, _RngState] = {}
        self._logs: dict[int, Any] = {}
        self._pending: _RngState | None = None
        self.recomputes = 0

    def flush(self) -> None:
        """Put the random stream where the unplanned run has it (after the last recompute)."""
        if self._pending is not None:
            self._pending.restore()
            self._pending = None

    def prepare(self) -> None:
        """Reset per-step state (no allocation inside the step comes from here)."""
        self._pending = None
        self._seen = {}
        self._rng = {}
        self._logs = {}

    def notes(self) -> list[str]:
        """What the guards did, for the run report."""
        if not self.guarded:
            return ["no stage is recomputed: no guard needed"]
        out = [f"{len(self.guarded)} recomputed stage(s)"
               + (": RNG state restored for each recompute" if "rng" in self.enabled else
                  ": RNG guard OFF")]
        if self._buffers:
            n = sum(len(b[0].slots) for b in self._buffers.values())
            out.append(f"{n} buffer(s) in {len(self._buffers)} stage(s) updated once per step")
        if self._decisions is None:
            out.append("decision replay unavailable (profiler.models.decisions missing)")
        else:
            out.append("decisions recorded in the first forward and replayed in recomputes")
        silenced = sum(h.silenced for h in self._hooks.values())
        if self._hooks:
            out.append(f"forward hooks that return nothing skipped in recomputes ({silenced} calls)")
        return out

    @contextlib.contextmanager
    def forward(self, i: int) -> Iterator[bool]:
        """Context for one forward of stage i; yields True when it is a recompute."""
        if self.counts[i - 1] <= 1:
            self.flush()
            yield False
            return
        n = self._seen.get(i, 0) + 1
        self._seen[i] = n
        if n == 1:
            self.flush()
            with self._first(i):
                yield False
        else:
            with self._again(i):
                yield True
        if n >= self.counts[i - 1]:  # its last forward in this step: release what it kept
            self._rng.pop(i, None)
            self._logs.pop(i, None)

    @contextlib.contextmanager
    def _first(self, i: int) -> Iterator[None]:
        if "rng" in self.enabled:
            self._rng[i] = _RngState(self.device)
        bufs = self._buffers.get(i)
        if bufs is not None:
            bufs[0].save()  # the state the recomputes start from
        with contextlib.ExitStack() as stack:
            if self._decisions is not None:
                self._logs[i] = self._decisions.DecisionLog()
                stack.enter_context(self._decisions.recording(self._logs[i]))
            if i in self._hooks:
                stack.enter_context(self._hooks[i].recording())
            yield

    @contextlib.contextmanager
    def _again(self, i: int) -> Iterator[None]:
        self.recomputes += 1
        now = None
        if i in self._rng:
            # where the stream must be after this recompute: a state still owed from an earlier
            # recompute, or the current one
            now = self._pending or _RngState(self.device)
            self._pending = None
            self._rng[i].restore()
        bufs = self._buffers.get(i)
        if bufs is not None:
            bufs[1].save()  # the state after the first forward, put back below
            bufs[0].load()
        _RECOMPUTING[0] = True
        try:
            with contextlib.ExitStack() as stack:
                if self._decisions is not None:
                    stack.enter_context(self._decisions.replaying(self._logs[i]))
                if i in self._hooks:
                    stack.enter_context(self._hooks[i].replaying())
                yield
        finally:
            _RECOMPUTING[0] = False
            if bufs is not None:
                bufs[1].load()
            # restored lazily, at the start of the next forward (or the step's end): restoring
            # makes a 5056-byte tensor on the CPU, which must not land at an op's end
            self._pending = now
