"""A training step's time under a parallel layout: FLOPs at a stated utilisation plus communication
volume at stated link bandwidths, with the pipeline's bubble.

NOTE [ Step time under parallelism ]
Per GPU, for one step of M micro-batches (B x T tokens each, N = B T / cp a rank's tokens; c the
activations' element bytes; t = tp, q = cp, d = dp; ring collectives: an all-reduce of S bytes sends
2 (g - 1)/g S from each of g ranks, an all-gather or a reduce-scatter (g - 1)/g S; Thakur et al.
2005, NCCL's bus-bandwidth convention):
1. Compute: the optimal plan's predicted time of one micro-batch through the rank's chain (forward,
   backward at twice the forward, recompute included; FLOPs at `utilization` x the peak). The
   embedding and head (on the end ranks) run once a micro-batch, not once a chunk.
2. Tensor parallelism: per layer and micro-batch two all-reduces of c N C bytes in the forward
   (attention's and the MLP's row-parallel outputs) and two in the backward (the column-parallel
   inputs' gradients); under SP an all-gather and a reduce-scatter in place of each, the same
   volume (Korthikanti et al. 2022, section 4.2.2). A recomputed layer repeats its forward's two.
3. Context parallelism: per layer and micro-batch an all-gather of the layer's K and V (2 c B T Dkv
   / t bytes in all) in the forward and a reduce-scatter of their gradients in the backward.
4. Pipeline parallelism: per micro-batch and chunk a rank sends one activation forward and one
   gradient backward (p Ns C bytes each). The step is (M v + P - 1) chunk times, a bubble of
   (P - 1)/(v M) (NOTE [ Interleaved 1F1B in flight ]).
5. Data parallelism, per step, over the d = dp x cp GPUs that hold the same weights, of the
   rank's G gradient and W weight bytes: ZeRO 0-1 an all-reduce
   of G (ZeRO-1's reduce-scatter and all-gather are the same volume); ZeRO-2 a reduce-scatter of G
   and an all-gather of W; ZeRO-3 a reduce-scatter of G and two all-gathers of W per micro-batch
   (forward and backward): 1.5 x data parallelism's volume at M = 1 (Rajbhandari et al. 2020,
   section 7).
6. Bandwidths, bytes a second each way per GPU: tensor and context parallelism inside a node
   (NVLink, or PCIe where a GPU has none); data and pipeline parallelism across nodes once a
   group spans more than `gpus_per_node` GPUs. Nothing overlaps: the step is the sum, an upper
   bound (frameworks hide most of the data-parallel volume behind the backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.planner.schema import PlanError

__all__ = ["LINKS", "Links", "links_for", "step_time"]


@dataclass(frozen=True)
class Links:
    """Per-direction bandwidth of one GPU's links, bytes a second."""

    intra_node: float  # to the GPUs of its node (NVLink, Infinity Fabric or PCIe)
    inter_node: float  # to other nodes (its share of the node's network)
    gpus_per_node: int  # GPUs a node holds
    source: str


# per direction: NVLink's bidirectional figures halved; networks: one NIC per GPU as in the
# vendors' 8-GPU reference systems
LINKS: dict[str, Links] = {
    "a100-40gb": Links(300e9, 25e9, 8, "NVLink 3: 600 GB/s bidirectional; DGX A100: a 200 Gb/s HDR NIC per GPU"),
    "a100-80gb": Links(300e9, 25e9, 8, "NVLink 3: 600 GB/s bidirectional; DGX A100: a 200 Gb/s HDR NIC per GPU"),
    "h100": Links(450e9, 50e9, 8, "NVLink 4: 900 GB/s bidirectional; DGX H100: a 400 Gb/s NDR NIC per GPU"),
    "h200": Links(450e9, 50e9, 8, "NVLink 4: 900 GB/s bidirectional; DGX H200: a 400 Gb/s NDR NIC per GPU"),
    "l40s": Links(32e9, 25e9, 8, "PCIe Gen4 x16: 64 GB/s bidirectional (no NVLink); a 200 Gb/s NIC per GPU"),
    "rtx4090": Links(32e9, 12.5e9, 8, "PCIe Gen4 x16: 64 GB/s bidirectional (no NVLink); 100 Gb/s Ethernet"),
    "mi300x": Links(448e9, 50e9, 8, "Infinity Fabric: 896 GB/s aggregate bidirectional; a 400 Gb/s NIC per GPU"),
}
_DEFAULT = Links(300e9, 25e9, 8, "no device preset: A100-class NVLink 3 and a 200 Gb/s NIC per GPU")


def links_for(device: str | None, *, intra_node: float | None = None, inter_node: float | None = None,
              gpus_per_node: int | None = None) -> Links:
    """The links of preset `device` (None: A100-class defaults), each figure overridable (bytes a
    second per direction; GPUs a node). Raises PlanError naming the field on a bad figure."""
    from memplan.planner.devices import DEVICES, device_preset

    key = None
    if device is not None:
        name = device_preset(device).name
        key = next(k for k, v in DEVICES.items() if v.name == name)
    base = LINKS.get(key, _DEFAULT) if key else _DEFAULT
    for field_, v in (("intra_node_bandwidth", intra_node), ("inter_node_bandwidth", inter_node)):
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e15):
            raise PlanError(f"{field_}: expected bytes a second > 0, got {v!r}")
    if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                      or not 1 <= gpus_per_node <= 1024):
        raise PlanError(f"gpus_per_node: expected an integer from 1 to 1024, got {gpus_per_node!r}")
    overridden = any(v is not None for v in (intra_node, inter_node, gpus_per_node))
    return Links(intra_node or base.intra_node, inter_node or base.inter_node,
                 gpus_per_node or base.gpus_per_node,
                 base.source + ("; overridden by the request" if overridden else ""))


def step_time(shape, lay, links: Links, *, B: int, T: int, precision: str, zero_stage: int,
              chunk_time_s: float, chunk_layers: int, rank_layers: int, recompute_fraction: float,
              rank_params: int, ends_time_s: float = 0.0) -> dict:
    """The step time of one GPU (NOTE [ Step time under parallelism ]) for decoder `shape` under
    layout `lay` at `B` x `T` tokens a micro-batch: `chunk_time_s` the plan's time of one
    micro-batch through the rank's chain of `chunk_layers` layers (of `rank_layers` in all),
    `recompute_fraction` of its layers recomputed, `rank_params` its parameters (elements),
    `ends_time_s` the part of `chunk_time_s` the embedding and head take (once a micro-batch).
    Returns seconds (compute, each kind of communication, the step) and bytes sent per GPU a step."""
    from memplan.planner.precision import get_policy

    pol = get_policy(precision)
    c = 4 if precision == "fp32" else 2
    p = 2 if precision == "bf16" else 4
    t, q, P, M, v = lay.tp, lay.cp, lay.pp, lay.micro_batches, lay.virtual_stages
    d = lay.shard_group  # the gradients are reduced over dp x cp
    N = B * T // q
    C, Dkv = shape.hidden_size, shape.n_kv_head * shape.head_dim // t
    ar = lambda g: 2 * (g - 1) / g  # noqa: E731 - all-reduce factor
    ag = lambda g: (g - 1) / g  # noqa: E731 - all-gather / reduce-scatter factor
    tp_layer = (4 + 2 * recompute_fraction) * ar(t) * c * N * C if t > 1 else 0.0
    cp_layer = (2 + recompute_fraction) * ag(q) * 2 * c * B * T * Dkv if q > 1 else 0.0
    hidden = p * (N // t if lay.sp else N) * C
    pp_chunk = 2 * hidden if P > 1 else 0.0
    G, W = rank_params * pol.grad_bytes, rank_params * pol.weight_bytes
    if d == 1:
        dp_bytes = 0.0
    elif zero_stage <= 1:
        dp_bytes = ar(d) * G
    elif zero_stage == 2:
        dp_bytes = ag(d) * (G + W)
    else:
        dp_bytes = ag(d) * (G + 2 * M * W)
    intra = lambda g: links.intra_node if g <= links.gpus_per_node else links.inter_node  # noqa: E731
    chunks = M * v + P - 1  # chunk times a step takes (bubble included)
    chunk_tp_s = chunk_layers * tp_layer / intra(t * q)
    chunk_cp_s = chunk_layers * cp_layer / intra(t * q)
    chunk_pp_s = pp_chunk / intra(lay.model_parallel)
    dp_s = dp_bytes / intra(lay.gpus) if d > 1 else 0.0
    out = {
        "compute_s": chunks * chunk_time_s - (chunks - chunks / v) * ends_time_s,
        "tp_comm_s": chunks * chunk_tp_s, "cp_comm_s": chunks * chunk_cp_s, "pp_comm_s": chunks * chunk_pp_s,
        "dp_comm_s": dp_s,
        "bubble_fraction": (P - 1) / (v * M),
        "bytes_sent": {"tp": M * rank_layers * tp_layer, "cp": M * rank_layers * cp_layer,
                       "pp": M * v * pp_chunk, "dp": dp_bytes},
        "links": {"intra_node_bytes_per_s": links.intra_node, "inter_node_bytes_per_s": links.inter_node,
                  "gpus_per_node": links.gpus_per_node, "source": links.source},
        "overlap": "none: compute and every collective add up (an upper bound)",
    }
    out["step_time_s"] = out["compute_s"] + out["tp_comm_s"] + out["cp_comm_s"] + out["pp_comm_s"] + dp_s
    return out
