"""Pipeline parallelism's memory: the 1F1B schedule, the micro-batches each stage holds in flight,
and each pipeline stage's activation and model-state bytes.

NOTE [ 1F1B in flight ]
Under the non-interleaved 1F1B schedule (PipeDream-Flush; Narayanan et al. 2021, "Efficient
large-scale language model training on GPU clusters using Megatron-LM", section 2.2.1) with P
pipeline stages and M micro-batches, stage p (0-based) runs min(P - p - 1, M) warm-up forwards,
then alternates one forward and one backward, then drains its backwards. So it holds at most
min(P - p, M) micro-batches' activations at once: the first stage P, the last one. memplan states
this as a formula (`in_flight`) and checks it against an event simulation of the schedule
(`simulate_1f1b`: each op waits for its stage's previous op and for its data, the forward of the
stage before or the backward of the stage after), which also gives the schedule's makespan,
(M + P - 1)(f + b) for uniform stage times.

NOTE [ Interleaved 1F1B in flight ]
The interleaved schedule (Narayanan et al. 2021, section 2.2.2; Megatron-LM's
forward_backward_pipelining_with_interleaving) gives each of the P ranks v model chunks (chunk j
of rank p holds the layers of virtual stage j P + p) and runs M micro-batches (M a multiple of P)
as M v chunk-micro-batches. Its k-th forward on a rank is chunk (k mod P v) div P of micro-batch
(k div P v) P + k mod P, its k-th backward the same with chunk v - 1 - that; rank p runs
W = min(2 (P - p - 1) + (v - 1) P, M v) warm-up forwards (all M v when M = P), then alternates one
forward and one backward, then drains. So rank p holds at most min(W + 1, M v) chunk-micro-batches
of activations, each 1 / v of its layers: rank 0 holds L/P (1 + (P - 1)/(P v)) layers' worth of
micro-batches against 1F1B's L (Korthikanti et al. 2022, section 4.2.3), and the bubble shrinks
from (P - 1)/M to (P - 1)/(v M) of the step. `in_flight_interleaved` states it; the event
simulation `simulate_interleaved` (each chunk's forward after the previous virtual stage's, each
backward after the next virtual stage's and its own forward) checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.planner.schema import PlanError

__all__ = ["one_f_one_b", "in_flight", "simulate_1f1b", "PipelineSimulation", "split_layers",
           "pipeline_stage_bytes", "interleaved_1f1b", "in_flight_interleaved", "simulate_interleaved",
           "bubble_fraction"]


def _check(P: int, M: int) -> None:
    for name, v in (("pp", P), ("micro_batches", M)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"{name}: expected an integer >= 1, got {v!r}")


def one_f_one_b(P: int, M: int) -> list[list[tuple[str, int]]]:
    """The 1F1B order of ops for each of `P` stages over `M` micro-batches: per stage a list of
    ("F", m) and ("B", m), m 0-based (NOTE [ 1F1B in flight ])."""
    _check(P, M)
    orders = []
    for p in range(P):
        warm = min(P - p - 1, M)
        ops = [("F", m) for m in range(warm)]
        f, b = warm, 0
        while f < M:
            ops += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        ops += [("B", m) for m in range(b, M)]
        orders.append(ops)
    return orders


def in_flight(P: int, M: int, p: int) -> int:
    """Micro-batches whose activations stage `p` (0-based) of `P` holds at most under 1F1B with
    `M` micro-batches: min(P - p, M)."""
    _check(P, M)
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < P:
        raise PlanError(f"stage: expected 0 <= stage < pp ({P}), got {p!r}")
    return min(P - p, M)


@dataclass(frozen=True)
class PipelineSimulation:
    """What an event simulation of a pipeline schedule gives."""

    max_in_flight: tuple[int, ...]  # per stage: most micro-batches forwarded, not yet backwarded
    makespan_s: float  # seconds from the first forward to the last backward


def simulate_1f1b(P: int, M: int, *, forward_s: float = 1.0, backward_s: float = 2.0) -> PipelineSimulation:
    """Run the 1F1B schedule of `P` stages and `M` micro-batches as events (each stage one op at a
    time, in its order; F(p, m) after F(p-1, m), B(p, m) after B(p+1, m) and F(p, m)), with
    uniform op times in seconds. Returns the per-stage most micro-batches in flight and the
    makespan (seconds)."""
    orders = [[(kind, 0, m) for kind, m in order] for order in one_f_one_b(P, M)]  # one chunk
    return _run_events(orders, 1, forward_s, backward_s,
                       deadlock="schedule: deadlock (an op waits on one that comes later)")


def _run_events(orders: list[list[tuple[str, int, int]]], v: int, forward_s: float,
                backward_s: float, *, deadlock: str) -> PipelineSimulation:
    """Run per-rank orders of ("F" or "B", chunk, micro-batch) over `v` chunks a rank as events:
    each rank one op at a time, in its order; F(p, j, m) after F(p - 1, j, m) (rank 0: after
    F(P - 1, j - 1, m)), B(p, j, m) after B(p + 1, j, m) (rank P - 1: after B(0, j + 1, m)) and
    F(p, j, m); forwards take `forward_s`, backwards `backward_s` seconds. With v = 1 these are
    1F1B's dependencies. Returns per rank the most ops forwarded and not yet backwarded, and the
    makespan (seconds); raises PlanError with `deadlock` when no op can run."""
    P = len(orders)
    done: dict[tuple[str, int, int, int], float] = {}
    pos, free, held, peak = [0] * P, [0.0] * P, [0] * P, [0] * P
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for p in range(P):
            if pos[p] == len(orders[p]):
                continue
            kind, j, m = orders[p][pos[p]]
            if kind == "F":
                deps = [("F", p - 1, j, m)] if p > 0 else ([("F", P - 1, j - 1, m)] if j > 0 else [])
            else:
                deps = [("F", p, j, m)]
                deps += [("B", p + 1, j, m)] if p < P - 1 else ([("B", 0, j + 1, m)] if j < v - 1 else [])
            if any(d not in done for d in deps):
                continue
            end = max([free[p], *(done[d] for d in deps)]) + (forward_s if kind == "F" else backward_s)
            done[(kind, p, j, m)] = free[p] = end
            held[p] += 1 if kind == "F" else -1
            peak[p] = max(peak[p], held[p])
            pos[p] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise PlanError(deadlock)
    return PipelineSimulation(max_in_flight=tuple(peak), makespan_s=max(done.values()))


def _check_v(P: int, M: int, v: int) -> None:
    _check(P, M)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PlanError(f"virtual_stages: expected an integer >= 1, got {v!r}")
    if v > 1 and M % P:
        raise PlanError(f"micro_batches: the interleaved schedule runs a multiple of pp ({P}) "
                        f"micro-batches, got {M}")


def interleaved_1f1b(P: int, M: int, v: int) -> list[list[tuple[str, int, int]]]:
    """The interleaved 1F1B order of `P` ranks with `v` model chunks each over `M` micro-batches
    (NOTE [ Interleaved 1F1B in flight ]): per rank a list of ("F" or "B", chunk, micro-batch)."""
    _check_v(P, M, v)
    total = M * v

    def op(kind: str, k: int) -> tuple[str, int, int]:
        j = (k % (P * v)) // P
        m = (k // (P * v)) * P + k % P
        return (kind, j if kind == "F" else v - 1 - j, m)

    orders = []
    for p in range(P):
        warm = total if M == P else min(2 * (P - p - 1) + (v - 1) * P, total)
        ops = [op("F", k) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            ops += [op("F", f), op("B", b)]
            f, b = f + 1, b + 1
        ops += [op("B", k) for k in range(b, total)]
        orders.append(ops)
    return orders


def in_flight_interleaved(P: int, M: int, v: int, p: int) -> int:
    """Chunk-micro-batches whose activations rank `p` (0-based) of `P` holds at most under the
    interleaved schedule with `v` chunks a rank and `M` micro-batches (NOTE [ Interleaved 1F1B in
    flight ]); each is one chunk's layers (1 / v of the rank's). v = 1 is 1F1B's min(P - p, M)."""
    _check_v(P, M, v)
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < P:
        raise PlanError(f"stage: expected 0 <= stage < pp ({P}), got {p!r}")
    if v == 1:
        return min(P - p, M)
    if M == P:
        return M * v
    return min(2 * (P - p - 1) + (v - 1) * P + 1, M * v)


def simulate_interleaved(P: int, M: int, v: int, *, forward_s: float = 1.0,
                         backward_s: float = 2.0) -> PipelineSimulation:
    """Run the interleaved schedule (`interleaved_1f1b`) as events with uniform chunk op times
    (seconds, for one chunk: 1 / v of a rank's layers): F(p, j, m) after F(p - 1, j, m) (rank 0:
    after F(P - 1, j - 1, m)), B(p, j, m) after B(p + 1, j, m) (rank P - 1: after B(0, j + 1, m))
    and F(p, j, m). Returns per rank the most chunk-micro-batches in flight and the makespan."""
    return _run_events(interleaved_1f1b(P, M, v), v, forward_s, backward_s,
                       deadlock=f"schedule: the interleaved order of pp={P}, micro_batches={M}, "
                                f"virtual_stages={v} deadlocks")


def bubble_fraction(P: int, M: int, v: int = 1) -> float:
    """The pipeline bubble as a fraction of the ideal step: (P - 1) / (v M) (Narayanan et al.
    2021, sections 2.2.1-2.2.2); the step takes (1 + bubble) times M micro-batches' stage time."""
    _check_v(P, M, v)
    return (P - 1) / (v * M)


def split_layers(n_layers: int, P: int) -> list[range]:
    """The decoder layers of each of `P` pipeline stages: contiguous, the first n_layers % P
    stages one layer more."""
    _check(P, 1)
    if P > n_layers:
        raise PlanError(f"pp: {P} pipeline stages for {n_layers} layers; use at most {n_layers}")
    q, r = divmod(n_layers, P)
    out, start = [], 0
    for p in range(P):
        size = q + (1 if p < r else 0)
        out.append(range(start, start + size))
        start += size
    return out


def pipeline_stage_bytes(profile, P: int, M: int) -> list[dict]:
    """Per pipeline stage of a decoder profile (embedding, layers, head as `hf_analytic_profile`
    makes it) split over `P` stages: its layers, parameter bytes, and the activation bytes it
    holds with nothing recomputed: min(P - p, M) micro-batches of its chain stages' saved and
    output bytes (the embedding on stage 0, the head on stage P - 1). Returns one dict per stage
    (bytes)."""
    _check(P, M)
    layers = profile.layers
    blocks = [i for i, ly in enumerate(layers) if ly.kind == "block"]
    parts = split_layers(len(blocks), P)
    out = []
    for p, part in enumerate(parts):
        idx = [blocks[i] for i in part]
        if p == 0:
            idx = [i for i, ly in enumerate(layers) if ly.kind == "embed"] + idx
        if p == P - 1:
            idx = idx + [i for i, ly in enumerate(layers) if ly.kind == "head"]
        per_mb = sum(layers[i].saved_bytes + layers[i].output_bytes for i in idx)
        k = in_flight(P, M, p)
        out.append({"stage": p, "layers": [layers[i].name for i in idx], "in_flight": k,
                    "activation_bytes": k * per_mb, "param_bytes": sum(layers[i].param_bytes for i in idx)})
    return out
