"""Parameters per pipeline stage after tp, pp and ep: what each rank holds before ZeRO
shards it (:mod:`dslc.cost.memory`), kept for the next plan of the same model and split
(the search asks for thousands of plans).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import arch
from ..chunks import Placement
from ..ir import Model, Plan
from ..units import DTYPE_BYTES
from . import recompute as rc


def dtype_bytes(plan: Plan) -> int:
    """e: bytes per element of the plan's precision."""
    return DTYPE_BYTES[plan.train.precision]


def local_tokens(plan: Plan) -> int:
    """T: the tokens of one rank's micro-batch (its cp share of the sequences)."""
    return plan.train.micro_batch * plan.model.seq_len // plan.cp


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of a pipeline stage (after tp, pp and ep)."""

    dense: int
    expert: int
    tp_replicated: int  # part of dense replicated over tp (its grads are all-reduced under SP)
    tied: int  # embedding weights shared between the first and last stage (tied, p > 1)

    @property
    def total(self) -> int:
        return self.dense + self.expert


def chunk_layers(plan: Plan) -> list[list[int]]:
    """Layers of each local chunk of each pp rank: [rank][chunk] (placement: dslc.chunks)."""
    split = plan.stage_layers()
    return [[split[g] for g in plan.placement.ids(r)] for r in range(plan.pp)]


def stage_params(plan: Plan) -> tuple[StageParams, ...]:
    """Vocab-parallel embedding (+ gpt2 positions) on the first stage; final norm and head on
    the last (with tied embeddings and p > 1 the last stage holds a copy, as Megatron; in a V
    the first rank holds both ends, and one embedding).
    Experts: layers·(all E experts of a layer)/ep, whole on every tp rank (not /t)."""
    return _stage_params(plan.model, plan.tp, plan.stage_layers(), plan.ep, plan.placement)


@functools.lru_cache(maxsize=4096)
def _stage_params(m: Model, t: int, split: tuple[int, ...], ep: int, placement: Placement) -> tuple[StageParams, ...]:
    a, h, emb = arch.of(m), m.hidden, arch.vocab_per_rank(m, t) * m.hidden
    p = placement.pp
    last = placement.rank(placement.chunks - 1)  # the rank of the final norm and the head
    tied, out = emb if m.tie_embeddings and last > 0 else 0, []
    for r in range(p):  # the rank's blocks, each by its kind (a dense prefix, MoE blocks)
        sharded, reps, experts = arch.layers_params(m, t, rc.layer_ids(split, r, placement))
        dense = sharded + reps
        if r == 0:  # gpt2's positions are replicated over tp (under SP each rank sees its slice)
            pos = m.max_positions * h if a.positions == "learned" else 0
            dense, reps = dense + emb + pos, reps + pos
        if r == last:
            norm = a.norm_params * h
            dense, reps = dense + norm + (emb if not m.tie_embeddings or last > 0 else 0), reps + norm
        out.append(StageParams(dense, experts // ep, reps, tied if r in (0, last) else 0))
    return tuple(out)
