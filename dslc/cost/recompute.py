"""What each activation-recompute policy keeps for backward and what backward re-runs.

Policies (``train { recompute = … }``), per transformer block:

* ``none``: autograd keeps every tensor it saves.
* ``selective`` (Korthikanti et al. 2022): the attention core is re-run in backward from
  q, k and v (with ring attention nothing is: the ring is not re-run).
* ``selective_ops`` (torchtitan's op-level selective activation checkpointing): the block
  runs under a selective checkpoint that keeps its input, the outputs of the attention
  kernel and of every other matmul of the block — the 1st, 3rd, 5th … in forward order,
  torchtitan's rule — and re-runs everything else in backward (norms, rope, activations,
  residual adds, the other matmuls, the collectives; ring attention whole). In a MoE
  block the router is one matmul and each expert weight another, however many experts
  run it; the ep all-to-alls re-run.
* ``full``: the block keeps its input and re-runs its forward in backward.
* ``full every N`` (torchtitan's layer-frequency AC): blocks N-1, 2N-1, … (0-based) are
  ``full``, the others ``none``.

Backward re-runs a block's forward up to the last tensor it saves under ``full`` and
``selective_ops`` alike (:data:`RERUNS`), so both repeat the same forward collectives.
Notation as in :mod:`dslc.cost.memory`.
"""

from __future__ import annotations

import functools
from itertools import accumulate

from .. import arch
from ..chunks import Placement
from ..ir import Plan

RERUNS = ("selective_ops", "full")  # policies under which backward re-runs a block's forward


def layer_policy(plan: Plan, layer: int | None = None) -> str:
    """The policy of block ``layer`` (0-based, of the whole model; None: the plan's)."""
    t = plan.train
    if layer is not None and t.recompute_every > 1 and (layer + 1) % t.recompute_every:
        return "none"
    return t.recompute


def stage_layer_ids(plan: Plan, stage: int) -> tuple[int, ...]:
    """The blocks a rank of pipeline ``stage`` holds: those of its chunks (dslc.chunks)."""
    return layer_ids(plan.stage_layers(), stage, plan.placement)


@functools.lru_cache(maxsize=4096)
def layer_ids(split: tuple[int, ...], stage: int, placement: Placement) -> tuple[int, ...]:
    starts = [0, *accumulate(split)]
    return tuple(i for g in placement.ids(stage) for i in range(starts[g], starts[g + 1]))


def recomputed_layers(plan: Plan, layers=None) -> int:
    """How many of ``layers`` (default: every block) backward re-runs (:data:`RERUNS`)."""
    ids = range(plan.model.layers) if layers is None else layers
    return sum(layer_policy(plan, i) in RERUNS for i in ids)


def matmuls(plan: Plan) -> list[tuple[int, int]]:
    """(output width, forward FLOPs per token) of each matmul of one block on one tp rank, in
    forward order: q, k, v and output projections, the MLP's (MoE: the router, then the
    experts' three at top_k × the rows). Each linear layer is one ``mm`` or ``addmm``."""
    out = []
    for w in arch.weights(plan.model, plan.tp):
        if len(w.shape) == 2 and w.part in ("layer", "expert"):
            k = plan.model.top_k if w.part == "expert" else 1
            out.append((k * w.shape[0], 2 * k * w.numel))
    return out


def kept_bytes(plan: Plan, T: int, e: int, routed: int = 0, slots: int = 0) -> int:
    """What ``selective_ops`` keeps of one block's ops besides its input, per micro-batch: the
    outputs of the 1st, 3rd, … matmul (T rows each: column-parallel linears run on the
    all-gathered sequence under SP, row-parallel ones leave partial sums of all T), and the
    fused attention kernel's output T·q/t·e and fp32 log-sum-exp a/t·T·4 (ring attention
    has no such kernel: it is re-run). A MoE block's router (fp32 logits) and shared experts
    run on the ``routed`` tokens of the rank (T/t under SP), its experts on the ``slots``
    (:func:`~dslc.cost.memory.routed_slots`); each expert weight counts as one matmul,
    whether the script runs it once per expert, batched or grouped."""
    m, (q, _, _) = plan.model, arch.widths(plan.model, plan.tp)
    rows = {"expert": slots, "router": routed, "shared": routed}
    outs = [rows.get(_moe_part(w), T) * w.shape[0] * (4 if _moe_part(w) == "router" else e)
            for w in arch.weights(plan.model, plan.tp) if len(w.shape) == 2 and w.part in ("layer", "expert")]
    kept = sum(outs[::2])
    if not (plan.cp > 1 and plan.context_parallel.method == "ring"):
        kept += T * q * e + m.heads // plan.tp * T * 4
    return kept


def _moe_part(w) -> str:
    """A block weight's rows under :func:`kept_bytes`: the experts', the router's, the
    shared experts' (the MoE's tokens), or "" (the block's T)."""
    if w.part == "expert":
        return "expert"
    return "router" if w.name.endswith("mlp.router") else "shared" if ".shared_experts." in w.name else ""


def shares(plan: Plan) -> tuple[float, float, float]:
    """(matmul, attention core, elementwise) fractions of one block's forward FLOPs or time
    that backward re-runs, averaged over the blocks: selective the core (not with ring
    attention), selective_ops every other matmul (by FLOPs), the elementwise work and a ring,
    full all of it (``full every N``: on its share of the blocks)."""
    rec, ring = plan.train.recompute, plan.cp > 1 and plan.context_parallel.method == "ring"
    if rec == "selective":
        return 0.0, 0.0 if ring else 1.0, 0.0
    if rec == "selective_ops":
        flops = [f for _, f in matmuls(plan)]
        return sum(flops[1::2]) / sum(flops), 1.0 if ring else 0.0, 1.0
    full = recomputed_layers(plan) / plan.model.layers if rec == "full" else 0.0
    return full, full, full
