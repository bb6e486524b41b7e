"""What one training step sends: every collective and p2p call of a rank, per pipeline stage.

(Links and call times are :mod:`dslc.cost.topology`'s; parameters and memory
:mod:`dslc.cost.memory`'s.)

Notation: b micro_batch, s seq_len, T = b·s/cp tokens per rank per micro-batch, h hidden,
t tp, p pp, v virtual stages, m micro-batches, e bytes of the plan's dtype (fp32 4,
bf16/fp16 2). Every number is *per rank and per step* unless it says otherwise.

Rows: :func:`traffic` (every stage), :func:`stage_traffic` (one stage), :func:`rank_payload`
(one rank, by group and kind). Payload S of a call is the full tensor (NCCL tests
PERFORMANCE.md): the all-reduced tensor, the all-gather output, the reduce-scatter input,
the all-to-all input of one rank, the tensor a ``send`` ships (counted on the sender).
Wire bytes per rank: all-reduce 2(n−1)/n·S, all-gather and reduce-scatter (n−1)/n·S,
all-to-all (n−1)/n·S, send S. Calls per step:

* tp, per layer per micro-batch (Megatron, Shoeybi et al. 2019): 2 all-reduces forward
  (attention and MLP outputs) + 2 backward, S = T·h·e (1 + 1 on MoE layers: the experts
  are whole on every tp rank, which routes the tokens it holds, so the MoE block has no
  tp collective); with sequence parallelism
  (Korthikanti et al. 2022) each becomes an all-gather/reduce-scatter pair of the same S.
  Full recompute repeats the forward ones up to the last tensor the layer saves: the
  generated script's checkpoint (non-reentrant, with autograd's early stop) never re-runs
  the MLP's exit (all-reduce, or reduce-scatter under SP), whose output nothing in the
  layer saves — unless a dropout mask follows it; selective_ops re-runs the same (its
  checkpoint keeps op outputs, never a collective's), ``full every N`` on every N-th
  layer (:mod:`dslc.cost.recompute`). Vocab-parallel embedding: all-reduce of its
  output (SP: reduce-scatter forward, all-gather backward); head: all-reduce of its input
  gradient (SP: all-gather forward, reduce-scatter backward); vocab-parallel cross-entropy:
  3 fp32 all-reduces of R elements per chunk of R rows (max, sum-exp, target logit). With SP the grads of
  tp-replicated weights (norms, row-parallel biases, router; experts when there is no
  data-parallel group to reduce them in) are all-reduced once per step.
* pp, per micro-batch: one send of the activation (T·h·e, /t under SP) per chunk
  boundary forward and one of its gradient backward (×v interleaved; SC21 §2.2).
  Tied embeddings with p > 1: an all-reduce of the embedding grads between the first
  and last stage once per step.
* cp, per layer per micro-batch: Ulysses (Jacobs et al. 2023) all-to-alls of q, k, v and
  the attention output, same backward; ring attention (Liu et al. 2023) (cp−1) sends of
  the K and V blocks forward, (cp−1) of K, V and cp of dK, dV backward (fp32: the
  accumulators of every rank's contribution travel with their block). Full recompute
  runs the forward's again.
* ep, per MoE layer per micro-batch: dispatch and combine all-to-alls of R·h·e, the same
  two backward, R = :func:`~dslc.cost.memory.routed_slots` (dropless: T·top_k, T/t under
  SP, uniform routing; capacity factor: the padded E·b·C). Dropless, the script also
  all-to-alls E int64 token counts before each dispatch; under SP and cp each MoE layer
  all-gathers the choice counts per sequence (b·top_k·E int64 per tp slice, and per
  chunk a cp rank holds): bookkeeping, not counted.
* data parallel, once per step: dense grads over dp×cp×ep, expert grads over dp×cp (×tp
  under SP, whose partial sums their buckets add: :func:`~dslc.cost.memory.grad_group`) —
  all-reduce (zero 0), reduce-scatter + all-gather of the updated params (zero 1, 2).
  Sharded buffers are padded to a multiple of the group size.
* zero 3, per unit as the script builds them (:func:`~dslc.cost.memory.zero3_units`):
  the outer unit (embeddings, final norm, head) is gathered once per step and its grads
  reduce-scattered once; each block (its dense unit over the dense group, its experts'
  over theirs) is reduce-scattered once per step and all-gathered at
  every forward (F) or backward (B) of its chunk that finds it freed — with
  reshard_after_forward twice per micro-batch, without it once per micro-batch unless
  the pipeline schedule runs a backward of the chunk between two forwards
  (:func:`chunk_gathers` replays the rank's action list).
* HSDP (``data_parallel.shard`` below dp): ZeRO's groups are the shard groups
  (dp_shard × cp × ep, :func:`dslc.groups.group_mesh`), and each reduced gradient shard
  (per bucket set, ZeRO-3 per unit) is all-reduced over dp_replicate once per step.

Scalar reductions (loss for logging, grad-norm) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from ..arch import layer_model, widths
from ..groups import axes_of, group_mesh, replica_group
from ..ir import Plan
from . import recompute as rc
from .collectives import Comm
from .loss import chunk_rows, chunks
from .memory import (
    StageParams,
    actions,
    chunk_layers,
    dtype_bytes,
    grad_group,
    group_size,
    local_tokens,
    routed_slots,
    stage_params,
    zero3_units,
)
from .schedule import build


@dataclass(frozen=True)
class _Spec:
    """A collective called ``fwd`` + ``bwd`` times per layer, micro-batch or step."""

    axes: tuple[str, ...]
    kind: str
    what: str
    nbytes: int
    fwd: int
    bwd: int = 0
    overlap: str = "exposed"  # one of dslc.cost.collectives.OVERLAPS
    ends: bool = False  # only the first and the last rank of the group take part


def layer_specs(plan: Plan, reruns: bool | None = None) -> list[_Spec]:
    """Collectives of one layer for one micro-batch (ep ones on MoE layers only); ``reruns``:
    whether backward re-runs its forward (default: under the plan's policy)."""
    m, e, T, t, cp = plan.model, dtype_bytes(plan), local_tokens(plan), plan.tp, plan.cp
    full = plan.train.recompute in rc.RERUNS if reruns is None else reruns
    fp = 2 if full else 1
    q, kv, _ = widths(m, t)
    out: list[_Spec] = []
    if t > 1:
        # regions: attention, and the dense MLP (a MoE block has none); tail: the MLP exit is re-run
        n, S, tail = 1 if m.is_moe else 2, T * m.hidden * e, 1 if m.dropout > 0 and not m.is_moe else 0
        if plan.tensor_parallel.sequence_parallel:
            out += [_Spec(("tp",), "all_gather", "layer activations", S, n * fp, n),
                    _Spec(("tp",), "reduce_scatter", "layer activations", S, n + full * (1 + tail), n)]
        else:
            out.append(_Spec(("tp",), "all_reduce", "layer activations", S, n + full * (1 + tail), n))
    if cp > 1 and plan.context_parallel.method == "ulysses":
        out += [_Spec(("cp",), "all_to_all", "q and attention output", T * q * e, 2 * fp, 2),
                _Spec(("cp",), "all_to_all", "k and v", T * kv * e, 2 * fp, 2)]
    elif cp > 1:
        out += [_Spec(("cp",), "send", "K, V blocks (ring)", T * kv * e, 2 * (cp - 1) * fp, 2 * (cp - 1), "attention"),
                _Spec(("cp",), "send", "dK, dV blocks (ring, fp32 accumulators)", T * kv * 4, 0, 2 * cp, "attention")]
    if plan.ep > 1 and m.is_moe:
        a2a = routed_slots(plan) * m.hidden * e
        if m.shared_experts:  # forward's dispatch in flight while the shared experts run (expert_parallel.py)
            out += [_Spec(("ep",), "all_to_all", "token dispatch (behind the shared experts)", a2a, fp, 0, "shared"),
                    _Spec(("ep",), "all_to_all", "token combine, and both in backward", a2a, fp, 2)]
        else:
            out.append(_Spec(("ep",), "all_to_all", "token dispatch and combine", a2a, 2 * fp, 2))
    return out


def edge_specs(plan: Plan, first: bool, last: bool) -> list[_Spec]:
    """Per micro-batch collectives of the embedding (first chunk) and head + loss (last)."""
    if plan.tp == 1:
        return []
    S, sp, out = local_tokens(plan) * plan.model.hidden * dtype_bytes(plan), plan.tensor_parallel.sequence_parallel, []
    if first:
        out += ([_Spec(("tp",), "reduce_scatter", "embedding output", S, 1), _Spec(("tp",), "all_gather", "embedding output", S, 0, 1)]
                if sp else [_Spec(("tp",), "all_reduce", "embedding output", S, 1)])
    if last:
        out += ([_Spec(("tp",), "all_gather", "head input", S, 1), _Spec(("tp",), "reduce_scatter", "head input", S, 0, 1)]
                if sp else [_Spec(("tp",), "all_reduce", "head input grad", S, 0, 1)])
        out.append(_Spec(("tp",), "all_reduce", "cross-entropy max, sum-exp, target (fp32)", chunk_rows(plan) * 4, 3 * chunks(plan)))
    return out


def step_specs(plan: Plan, sp_params: StageParams) -> list[_Spec]:
    """Once-per-step collectives of the ranks holding ``sp_params``."""
    e, zero, out = dtype_bytes(plan), plan.data_parallel.zero, []
    for expert, count in ((False, sp_params.dense), (True, sp_params.expert)):
        axes = grad_group(plan, expert)
        n, tag = group_size(plan, axes), "expert" if expert else "dense"
        if n == 1 or count == 0:
            continue
        padded = n * ceil(count / n) * e
        if zero == 0:
            out.append(_Spec(axes, "all_reduce", f"{tag} grads", count * e, 0, 1, "backward"))
            continue
        if zero == 3:  # per unit: zero3_specs
            continue
        out.append(_Spec(axes, "reduce_scatter", f"{tag} grads", padded, 0, 1, "backward"))
        out += replica_specs(plan, f"{tag} grad shard", padded // n, 1)
        out.append(_Spec(axes, "all_gather", f"{tag} params after the step", padded, 1))
    # experts are whole on every tp rank; their buckets add their tp partial sums when tp is in their group
    replicated = sp_params.tp_replicated + sp_params.expert * ("tp" not in grad_group(plan, True))
    if plan.tp > 1 and plan.tensor_parallel.sequence_parallel and replicated:
        out.append(_Spec(("tp",), "all_reduce", "grads of tp-replicated weights (SP)", replicated * e, 0, 1))
    if sp_params.tied:
        out.append(_Spec(("pp",), "all_reduce", "tied embedding grads", sp_params.tied * e, 0, 1, ends=True))
    return out


def chunk_gathers(plan: Plan, stage: int) -> list[tuple[int, int]]:
    """(forward, backward) all-gathers per step of each block of each chunk of a rank of
    ``stage``, per chunk: the rank's F and B actions replayed (one micro-batch after the
    other without a pipeline), each gathering the blocks of its chunk when they are freed;
    F frees them again with reshard_after_forward, B always."""
    m, v, reshard = plan.microbatches, plan.pipeline.virtual_stages, plan.data_parallel.reshard_after_forward
    acts = actions(plan)[stage] if plan.pp > 1 else build("1f1b", 1, m, 1)[0]
    gathered, out = [False] * v, [{"F": 0, "B": 0} for _ in range(v)]
    for a in acts:
        if a.kind in ("F", "B"):
            out[a.chunk][a.kind] += not gathered[a.chunk]
            gathered[a.chunk] = a.kind == "F" and not reshard
    return [(c["F"], c["B"]) for c in out]


def zero3_specs(plan: Plan, stage: int) -> list[_Spec]:
    """The per-step ZeRO-3 collectives of a rank of ``stage``: per block its dense unit
    over the dense group, its experts' unit over theirs (none when no other rank holds
    them), and the outer unit; blocks of another size (a dense prefix's) in rows of their own."""
    units, e = zero3_units(plan, stage), dtype_bytes(plan)
    if units.n == 1 or plan.data_parallel.zero != 3:
        return []
    out = []
    per_block = [g for g, layers in zip(chunk_gathers(plan, stage), chunk_layers(plan)[stage]) for _ in range(layers)]
    groups = ((grad_group(plan, False), units.n, 0, ""), (grad_group(plan, True), units.n_expert, 1, "expert "))
    for axes, n, part, tag in groups:
        rows: dict[int, list[int]] = {}  # unit size -> [forward gathers, backward gathers, units]
        for block, (fwd, bwd) in zip(units.blocks, per_block):
            if block[part] and n > 1:
                row = rows.setdefault(block[part], [0, 0, 0])
                row[0], row[1], row[2] = row[0] + fwd, row[1] + bwd, row[2] + 1
        for size, (fwd, bwd, count) in rows.items():
            what = f"block {tag}params" + (f" ({size} elements)" if len(rows) > 1 else "")
            out += [_Spec(axes, "all_gather", f"{what} (forward)", size * e, fwd, 0, "forward"),
                    _Spec(axes, "all_gather", f"{what} (backward)", size * e, 0, bwd, "backward"),
                    _Spec(axes, "reduce_scatter", what.replace("params", "grads"), size * e, 0, count, "backward")]
            out += replica_specs(plan, what.replace("params", "grad shards"), size * e // n, count)
    if units.outer:
        axes, n = grad_group(plan, False), units.n
        out += [_Spec(axes, "all_gather", "outer unit params (embeddings, head)", units.outer * e, 1),
                _Spec(axes, "reduce_scatter", "outer unit grads", units.outer * e, 0, 1)]
        out += replica_specs(plan, "outer unit grad shard", units.outer * e // n, 1)
    return out


def replica_specs(plan: Plan, what: str, nbytes: int, calls: int) -> list[_Spec]:
    """HSDP: each reduced gradient shard (one per bucket set or ZeRO-3 unit) all-reduced
    over the replicas, dp_replicate, once per step after its reduce-scatter."""
    axes = replica_group(plan)
    return [_Spec(axes, "all_reduce", what, nbytes, 0, calls, "backward")] if axes else []


def pp_sends(plan: Plan, stage: int) -> tuple[int, int]:
    """(activation sends, gradient sends) of a rank of ``stage`` per micro-batch: one per
    chunk boundary leaving the rank (v, or v−1 at the last/first stage; in a V one fewer at
    the bottom's turn, which stays on the rank, and at rank 0, which holds both ends)."""
    at = plan.placement
    chunks = range(len(at.ids(stage)))
    return (sum(at.peer(stage, c, +1) is not None for c in chunks),
            sum(at.peer(stage, c, -1) is not None for c in chunks))


def pp_bytes(plan: Plan) -> int:
    """Activation (= gradient) sent between stages: T·h·e, the SP shard T·h·e/t under SP."""
    b = local_tokens(plan) * plan.model.hidden * dtype_bytes(plan)
    return b // plan.tp if plan.tensor_parallel.sequence_parallel else b


def to_comm(plan: Plan, sp: _Spec, calls: int, per: str = "micro-batch") -> Comm:
    axes = axes_of(group_mesh(plan), sp.axes)
    members = (0, plan.pp - 1) if sp.ends else None
    group = 2 if members else group_size(plan, axes)
    return Comm("+".join(axes), axes, sp.kind, sp.what, calls, sp.nbytes, group, per, sp.overlap, members)


def stage_traffic(plan: Plan, stage: int) -> list[Comm]:
    """Every collective a rank of pipeline ``stage`` calls in one step, per rank."""
    m, p, v = plan.microbatches, plan.pp, plan.pipeline.virtual_stages
    ids, rows = rc.stage_layer_ids(plan, stage), []
    for moe in sorted({plan.model.moe_layer(i) for i in ids}):  # a dense prefix's blocks, then MoE blocks
        layers = [i for i in ids if plan.model.moe_layer(i) == moe]
        kind, rerun = replace(plan, model=layer_model(plan.model, layers[0])), rc.recomputed_layers(plan, layers)  # full every N: not all
        rows += [to_comm(plan, sp, m * n * (sp.fwd + sp.bwd)) for n, again in ((rerun, True), (len(layers) - rerun, False))
                 for sp in layer_specs(kind, again)]
    for g in plan.placement.ids(stage):
        rows += [to_comm(plan, sp, m * (sp.fwd + sp.bwd)) for sp in edge_specs(plan, g == 0, g == p * v - 1)]
    sends = zip(("activations to the next stage", "gradients to the previous stage"), (False, True), pp_sends(plan, stage))
    rows += [Comm("pp", ("pp",), "send", what, m * n, pp_bytes(plan), p, back=back) for what, back, n in sends]
    rows += [to_comm(plan, sp, sp.fwd + sp.bwd, "step") for sp in step_specs(plan, stage_params(plan)[stage]) + zero3_specs(plan, stage)]
    merged: dict[tuple, Comm] = {}
    for c in rows:
        key = (c.axis, c.kind, c.what)
        merged[key] = replace(c, calls=merged[key].calls + c.calls) if key in merged else c
    return [c for c in merged.values() if c.calls]


def traffic(plan: Plan) -> tuple[tuple[Comm, ...], ...]:
    """:func:`stage_traffic` of every pipeline stage."""
    return tuple(tuple(stage_traffic(plan, s)) for s in range(plan.pp))


def rank_payload(plan: Plan, rank: int) -> dict[tuple[str, str], int]:
    """Payload bytes per step of ``rank`` by (group, kind): what ``train.py --measure`` counts."""
    out: dict[tuple[str, str], int] = {}
    for c in stage_traffic(plan, plan.mesh.coords(rank)["pp"]):
        out[(c.axis, c.kind)] = out.get((c.axis, c.kind), 0) + c.payload
    return out
