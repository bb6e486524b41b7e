"""FLOPs of one training step and the peak they are measured against (MFU).

Per-layer FLOPs are the architecture's (:func:`dslc.arch.layer_flops`); the model FLOPs
per token are :func:`dslc.arch.model_flops_per_token`, the same number the generated
script divides by for its MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import arch
from ..ir import Plan
from .memory import local_tokens, routed_slots, routed_tokens
from .recompute import shares


def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """FLOPs per step of GPT with full recompute, Narayanan et al. (SC21):
    96·B·s·l·h²(1 + s/(6h) + V/(16lh))."""
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


@dataclass(frozen=True)
class Flops:
    model: float  # 3 passes (forward + backward): what MFU counts
    hardware: float  # + the forward recomputed in backward (:func:`recomputed_flops`)


def batch_tokens(plan: Plan) -> int:
    """Tokens per step: micro_batch × micro-batches × dp × ep sequences of seq_len."""
    return plan.train.micro_batch * plan.microbatches * plan.data_parallel_size * plan.model.seq_len


def flops(plan: Plan, causal: bool = True) -> Flops:
    """Per step, whole cluster: model = 3·tokens·(l·layer + 2·h·V) — for GPT this is
    72·B·s·l·h²(1 + s/(12h) + V/(12lh)); hardware adds l·:func:`recomputed_flops`, l·layer
    with full recompute. The attention core is counted causal (:func:`dslc.arch.layer_flops`),
    as the step time charges it; ``causal=False`` counts the whole square, the convention
    of the sources' published FLOP rates (full recompute: SC21's 96·B·s·l·h²(1 + s/(6h) +
    V/(16lh))), only to turn such a rate into a step time."""
    m = plan.model
    tokens = batch_tokens(plan)
    model = tokens * arch.model_flops_per_token(m, causal)
    recomputed = sum(n * recomputed_flops(plan, *arch.layer_flops(km, m.seq_len, causal=causal)) for n, km in arch.kinds(m))
    return Flops(model, model + tokens * recomputed)


def chunk_flops(plan: Plan, layer_ids) -> tuple[float, float]:
    """(matmul, attention-core) forward FLOPs per token of blocks ``layer_ids`` on one tp rank,
    each block by its kind (a dense prefix's MLP, a MoE block's experts: :func:`dslc.arch.kinds`)."""
    per = [(n, arch.layer_flops(km, plan.model.seq_len, plan.tp)) for n, km in arch.kinds(plan.model, layer_ids)]
    return sum(n * mm for n, (mm, _) in per), sum(n * core for n, (_, core) in per)


def recomputed_flops(plan: Plan, mm: float, core: float) -> float:
    """Forward FLOPs backward re-runs in one layer of ``mm`` matmul and ``core`` attention-core
    FLOPs, averaged over the layers: selective the core, selective_ops every other matmul
    (and a ring attention's core), full all (``full every N``: 1/N of the layers), per
    :func:`dslc.cost.recompute.shares`."""
    gemm, attention, _ = shares(plan)
    return gemm * mm + attention * core


def peak_flops(plan: Plan) -> float:
    """FLOP/s per device in the plan's precision: the catalog's dense bf16 peak, half of
    it for fp32 (TF32 tensor cores)."""
    return plan.cluster.device.peak_flops * (0.5 if plan.train.precision == "fp32" else 1.0)


def layer_rank_flops(plan: Plan, imbalance: float = 1.0) -> tuple[float, float, float]:
    """(matmul without the experts, attention core, experts) forward FLOPs of one layer on
    one rank for one micro-batch of T tokens: T·(matmul, core) of
    :func:`dslc.arch.layer_flops` on the rank's tp shard, except the MoE block, which runs
    whole experts on what the rank routes: the router 2·h·E per routed token
    (:func:`~dslc.cost.memory.routed_tokens`), the experts 2·3·h·f per slot of
    :func:`~dslc.cost.memory.routed_slots` — padded slots included, ⌈r×⌉ the uniform
    slots at a dropless load imbalance r on the busiest rank. A model with a dense prefix:
    a MoE layer's (``replace(plan, model=arch.layer_model(...))`` for another block's)."""
    m, T = plan.model, local_tokens(plan)
    mm, core = arch.layer_flops(m, m.seq_len, plan.tp)
    if not m.is_moe:
        return T * mm, T * core, 0.0
    # the router and the shared experts (one MLP of shared_experts·f) run on the routed tokens
    attention, router = arch.attention_matmul_flops(m, plan.tp), 2 * m.hidden * (m.experts + arch.of(m).mlp_matrices * m.shared_experts * m.ffn)
    experts = routed_slots(plan, imbalance) * 2 * arch.of(m).mlp_matrices * m.hidden * m.ffn
    return T * attention + routed_tokens(plan) * router, T * core, float(experts)
