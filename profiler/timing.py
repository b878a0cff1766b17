"""Time and FLOPs of a chain's stages: the timing passes of `profile_chain`.

Each stage's forward, backward and no-grad forward are timed apart from the memory passes (the
PyTorch profiler's bookkeeping would slow them): CUDA events on a GPU, a monotonic clock after
synchronisation on the CPU; medians over `repeats` after `warmup` runs (NOTE [ timing in context ]).
`forward_flops` counts one forward with `torch.utils.flop_counter.FlopCounterMode`.
"""

from __future__ import annotations

import logging
import math
import statistics
import time

import torch
from memplan.profiler.tensors import stage_input

__all__ = ["time_stage", "time_chain", "forward_flops"]

log = logging.getLogger(__name__)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_stage(stage, x_prev, first, dev, ctx, repeats, warmup) -> tuple[float, float, float]:
    """Medians (seconds) of the recorded forward, its backward and the forward under
    torch.no_grad() (an `F` op; NOTE [ no-grad forward time ] in planner/simulate.py)."""
    fwd: list[float] = []
    bwd: list[float] = []
    nograd: list[float] = []
    clock = _Clock(dev)
    for r in range(warmup + repeats):
        x = stage_input(x_prev, first)
        clock.mark()
        with ctx():
            out = stage(x)
        clock.mark()
        if out.requires_grad:
            grad = torch.ones_like(out)  # made outside the timed span
            clock.mark()
            torch.autograd.backward(out, grad)
            clock.mark()
            del grad
        else:
            clock.mark()
            clock.mark()
        del out
        clock.mark()
        with torch.no_grad(), ctx():
            out = stage(x)
        clock.mark()
        f_s, b_s, n_s = _spans(clock.take())
        del out, x
        if r >= warmup:
            fwd.append(f_s)
            bwd.append(b_s)
            nograd.append(n_s)
    return statistics.median(fwd), statistics.median(bwd), statistics.median(nograd)


def time_chain(stages, x0, dev, ctx, repeats, warmup) -> tuple[list[tuple[float, float, float]] | None, str]:
    """Per stage, medians (seconds) of the recorded forward, its backward and the no-grad forward,
    each timed inside a pass over the whole chain; and what `meta["timing"]` records. None where
    the pass does not fit on the device (the caller then times each stage alone).

    NOTE [ timing in context ]
    A stage timed alone, again and again on its own input, does not run as it runs in a step,
    where every other stage has been through the caches and the allocator in between. The
    executor runs a step op by op, so its per-op times are the reference. Measured on the
    benchmark's residual MLP blocks (2-core CPU, one thread, glibc's heap kept, medians of
    interleaved repeats, the runner's op times summed over a store-all step): 32 blocks of width
    512, batch 256: recorded forwards 301.7 ms timed in the chain, 300.3 ms in the runner, 324.7 ms
    alone; backwards 619.1 / 619.8 / 682.8 ms; no-grad forwards 286 ms in the chain, 334 ms alone.
    Alone was 8-17% off; in the chain, within 0.5%.
    Each repeat here is therefore one store-all step (the stages' recorded forwards in order, each
    from a detached input that takes a gradient, as an `R` op runs them; then their backwards
    from the last, as `B` ops run them) followed by a forward under torch.no_grad() over the chain
    (`F` ops); a stage's three times are medians over the repeats. A floating a_0 takes a gradient
    here, as the executor's `R 1` gives it one (the chain model's `B 1` makes d_0).
    """
    fwd: list[list[float]] = [[] for _ in stages]
    bwd: list[list[float]] = [[] for _ in stages]
    nograd: list[list[float]] = [[] for _ in stages]
    try:
        for r in range(warmup + repeats):
            f_s, b_s, n_s = _chain_pass(stages, x0, dev, ctx)
            if r >= warmup:
                for i in range(len(stages)):
                    fwd[i].append(f_s[i])
                    bwd[i].append(b_s[i])
                    nograd[i].append(n_s[i])
    except torch.OutOfMemoryError as err:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        first = str(err).splitlines()[0] if str(err) else "out of memory"
        log.warning("timing: a store-all pass over the chain does not fit on %s (%s); timing each "
                    "stage alone instead (NOTE [ timing in context ])", dev, first)
        return None, "stage (a pass over the chain did not fit)"
    med = statistics.median
    return [(med(fwd[i]), med(bwd[i]), med(nograd[i])) for i in range(len(stages))], "chain"


def _chain_pass(stages, x0, dev, ctx) -> tuple[list[float], list[float], list[float]]:
    """One store-all step, then a no-grad forward, over the chain: seconds per stage of each."""
    L = len(stages)
    clock = _Clock(dev)
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    x = x0
    for stage in stages:
        inp = x.detach()
        if inp.is_floating_point():
            inp.requires_grad_(True)
        clock.mark()
        with torch.enable_grad(), ctx():
            out = stage(inp)
        clock.mark()
        records.append((inp, out))
        x = out.detach()
    del x, out
    f_spans = _spans(clock.take())
    grad: torch.Tensor | None = None
    for i in range(L - 1, -1, -1):
        inp, out = records.pop()  # its saved tensors are freed after its backward, as by `B i`
        if grad is None and i < L - 1:
            grad = torch.zeros_like(out)  # the next stage did not use its input
        clock.mark()
        if out.requires_grad:
            torch.autograd.backward(out, grad)
        clock.mark()
        grad = inp.grad if inp.requires_grad else None
        del inp, out
    del grad
    b_spans = _spans(clock.take())[::-1]
    x = x0
    with torch.no_grad():
        for stage in stages:
            clock.mark()
            with ctx():
                x = stage(x)
            clock.mark()
    del x
    return f_spans, b_spans, _spans(clock.take())


def _spans(marks: list[float]) -> list[float]:
    """Seconds between each pair of marks (start, end, start, end, ...)."""
    return [marks[k + 1] - marks[k] for k in range(0, len(marks), 2)]


class _Clock:
    """Time marks (seconds): CUDA events read after one synchronisation on a GPU, a monotonic
    clock after synchronisation on the CPU."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.marks: list = []

    def mark(self) -> None:
        if self.dev.type == "cuda":
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def take(self) -> list[float]:
        marks, self.marks = self.marks, []
        if self.dev.type != "cuda":
            return marks
        _sync(self.dev)
        return [marks[0].elapsed_time(e) / 1e3 for e in marks]


def forward_flops(stage, x_prev, ctx) -> float:
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_flash(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(q, k, v)

    def grouped_mm(a, b, *args, out_shape=None, **kwargs) -> int:
        # a multiply-add per output element and contracted index: (M, K) x (G, K, N) -> (M, N)
        # with offsets (each row's expert), (G, M, K) x (G, K, N); (M, Ktot) x (Ktot, N) -> (G, M, N)
        # with offsets on K sums the groups' K to Ktot
        if len(a) == 2 and len(b) == 2:  # (shapes, as FlopCounterMode passes them)
            return 2 * a[0] * a[1] * b[1]
        return 2 * math.prod(out_shape) * a[-1]

    # kernels with no formula of their own in FlopCounterMode (counted 0): the CPU flash kernel
    # (as SDPA's), and the grouped matmul of Hugging Face's MoE experts
    x = x_prev.detach()
    counter = FlopCounterMode(
        display=False,
        custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash,
                        torch.ops.aten._grouped_mm: grouped_mm},
    )
    with torch.no_grad(), counter, ctx():
        stage(x)
    return float(counter.get_total_flops())
