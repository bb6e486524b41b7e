"""How a mixture of experts' tokens are routed, as the memory, traffic and time models
count them: the tokens a rank routes, an expert's capacity, the slots a rank sends."""

from __future__ import annotations

from fractions import Fraction
from math import ceil

from ..ir import Plan
from .params import local_tokens


def routed_tokens(plan: Plan) -> int:
    """Tokens a rank routes per MoE layer per micro-batch: T, its slice T/t under sequence
    parallelism (each tp rank routes its own; without SP every tp rank routes all T)."""
    return local_tokens(plan) // (plan.tp if plan.tensor_parallel.sequence_parallel else 1)


def expert_capacity(plan: Plan) -> int | None:
    """C = ⌈cf·top_k·s/E⌉ token slots each expert accepts per sequence, None when dropless
    (cf = 0). The routing group is one sequence (GShard's groups, Lepikhin et al. 2020);
    slots past C are dropped and the token skips the MoE through the residual. Computed on
    the decimal written in the plan (1.1 is 11/10), so the script should take C from here."""
    m = plan.model
    return ceil(Fraction(repr(m.capacity_factor)) * m.top_k * m.seq_len / m.experts) if m.capacity_factor else None


def routed_slots(plan: Plan, imbalance: float = 1.0) -> int:
    """Token slots one rank sends to the experts per MoE layer per micro-batch — the rows of
    its dispatch all-to-all input, of what it receives back, and of what its experts run on.

    With a capacity factor: E·b·C, the padded buffer (E, b·C, h), with or without tp, SP
    (one rank's slice may take a whole sequence's capacity) or cp. Dropless:
    :func:`routed_tokens`·top_k under uniform routing; at a load imbalance r the busiest
    ep rank receives ⌈r·that⌉ (``imbalance``; padded buffers ignore it, and so does ep = 1,
    where one rank holds every expert)."""
    m = plan.model
    if not m.is_moe:
        return 0
    cap = expert_capacity(plan)
    if cap is not None:
        return m.experts * plan.train.micro_batch * cap
    return ceil(routed_tokens(plan) * m.top_k * (imbalance if plan.ep > 1 else 1))
