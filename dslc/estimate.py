"""What one training step sends, holds and computes: pure functions of (Plan, Topology).

Notation: b micro_batch, s seq_len, T = b·s/cp tokens per rank per micro-batch, h hidden,
t tp, p pp, v virtual stages, m micro-batches, e bytes of the plan's dtype (fp32 4,
bf16/fp16 2). Every number is *per rank and per step* unless it says otherwise.

Traffic (:func:`traffic`). Payload S of a call is the full tensor (NCCL tests
PERFORMANCE.md): the all-reduced tensor, the all-gather output, the reduce-scatter input,
the all-to-all input of one rank, the tensor a ``send`` ships (counted on the sender).
Wire bytes per rank: all-reduce 2(n−1)/n·S, all-gather and reduce-scatter (n−1)/n·S,
all-to-all (n−1)/n·S, send S. Calls per step:

* tp, per layer per micro-batch (Megatron, Shoeybi et al. 2019): 2 all-reduces forward
  (attention and MLP outputs) + 2 backward, S = T·h·e; with sequence parallelism
  (Korthikanti et al. 2022) each becomes an all-gather/reduce-scatter pair of the same S.
  Full recompute repeats the forward ones. Vocab-parallel embedding: all-reduce of its
  output (SP: reduce-scatter forward, all-gather backward); head: all-reduce of its input
  gradient (SP: all-gather forward, reduce-scatter backward); vocab-parallel cross-entropy:
  3 fp32 all-reduces of T elements (max, sum-exp, target logit). With SP the grads of
  tp-replicated weights (norms, row-parallel biases, router) are all-reduced once per step.
* pp, per micro-batch: one send of the activation (T·h·e, /t under SP) per chunk
  boundary forward and one of its gradient backward (×v interleaved; SC21 §2.2).
  Tied embeddings with p > 1: an all-reduce of the embedding grads between the first
  and last stage once per step.
* cp, per layer per micro-batch: Ulysses (Jacobs et al. 2023) all-to-alls of q, k, v and
  the attention output, same backward; ring attention (Liu et al. 2023) (cp−1) sends of
  the K and V blocks forward, (cp−1) of K, V and cp of dK, dV backward.
* ep, per MoE layer per micro-batch: dispatch and combine all-to-alls of T·top_k·h·e
  (× capacity_factor when set), same backward.
* data parallel, once per step: dense grads over dp×cp×ep, expert grads over dp×cp —
  all-reduce (zero 0), reduce-scatter + all-gather of the updated params (zero 1, 2),
  reduce-scatter + all-gathers of the params forward and backward (zero 3). Sharded
  buffers are padded to a multiple of the group size.

Scalar reductions (loss for logging, grad-norm) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from . import schedule as sched
from .diagnostics import Diagnostic, error
from .ir import Model, Plan
from .topology import Flow, Topology, axes_of

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GiB = 2**30
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "send": lambda n: 1.0}
STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
         "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1, "send": lambda n: 1}


@dataclass(frozen=True)
class Settings:
    """``attention="paper"``: the setting of Korthikanti et al. (softmax scores of s² stored,
    dropout on). ``"sdpa"`` (default, what the generated script runs): a fused attention
    kernel keeps only its output and log-sum-exp. ``dropout=None`` follows model.dropout > 0.
    ``efficiency``: achieved fraction of peak matmul FLOP/s (0.5, roughly Megatron's MFU)."""

    attention: str = "sdpa"
    dropout: bool | None = None
    efficiency: float = 0.5


DEFAULT = Settings()
PAPER = Settings(attention="paper", dropout=True)


# ---------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Params:
    """Exact parameter count of the generated model, by part."""

    embedding: int  # V·h token embedding
    positions: int  # s·h learned positions (gpt2)
    layer: int  # one layer without its experts
    experts: int  # all experts of one layer (mixtral)
    final_norm: int
    head: int  # V·h, 0 when tied to the embedding
    layers: int

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.layers * (self.layer + self.experts) + self.final_norm + self.head


def _dims(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(q, kv, ffn) widths on one tp rank; kv heads are replicated when fewer than t."""
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    return q // t, (kv // t if model.kv_heads % t == 0 else kv), model.ffn // t


def _layer(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(tp-sharded, tp-replicated, expert) parameters of one layer on one tp rank.

    gpt2: LayerNorm (weight+bias) ×2, qkv and out projections with biases, GELU MLP with
    biases. llama: RMSNorm ×2, no biases, SwiGLU (3 matrices), GQA k/v of kv_heads·head_dim.
    mixtral: llama attention, router h×E, E SwiGLU experts."""
    h = model.hidden
    q, kv, f = _dims(model, t)
    attn = h * (q + 2 * kv) + q * h
    if model.arch == "gpt2":
        return attn + (q + 2 * kv) + 2 * h * f + f, 4 * h + 2 * h, 0
    if model.is_moe:
        return attn, 2 * h + h * model.experts, 3 * h * f * model.experts
    return attn + 3 * h * f, 2 * h, 0


def params(model: Model) -> Params:
    h, gpt2 = model.hidden, model.arch == "gpt2"
    sharded, rep, experts = _layer(model)
    return Params(model.vocab * h, model.seq_len * h if gpt2 else 0, sharded + rep, experts,
                  2 * h if gpt2 else h, 0 if model.tie_embeddings else model.vocab * h, model.layers)


def sc21_params(l: int, h: int, V: int, s: int) -> float:
    """Narayanan et al. SC21 eq. (2): 12·l·h²(1 + 13/(12h) + (V+s)/(12lh)) (GPT, tied head,
    no final LayerNorm)."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of a pipeline stage (after tp, pp and ep)."""

    dense: int
    expert: int
    tp_replicated: int  # part of dense replicated over tp (its grads are all-reduced under SP)
    embedding: int  # local vocab-parallel embedding (stage 0), or the tied copy on the last stage

    @property
    def total(self) -> int:
        return self.dense + self.expert


def chunk_layers(plan: Plan) -> list[list[int]]:
    """Layers of each local chunk of each pp rank: [rank][chunk] (chunk g on rank g % p)."""
    p, v = plan.pp, plan.pipeline.virtual_stages
    split = plan.stage_layers()
    return [[split[c * p + r] for c in range(v)] for r in range(p)]


def stage_params(plan: Plan) -> tuple[StageParams, ...]:
    m, t, p = plan.model, plan.tp, plan.pp
    h, vl = m.hidden, ceil(m.vocab / t)
    sharded, rep, experts = _layer(m, t)
    out = []
    for r, chunks in enumerate(chunk_layers(plan)):
        n = sum(chunks)
        dense, reps, emb = n * (sharded + rep), n * rep, 0
        if r == 0:
            emb = vl * h
            dense += emb + (m.seq_len * h if m.arch == "gpt2" else 0)
        if r == p - 1:
            norm = 2 * h if m.arch == "gpt2" else h
            head = vl * h if (not m.tie_embeddings or p > 1) else 0
            dense, reps, emb = dense + norm + head, reps + norm, emb or (vl * h if m.tie_embeddings and p > 1 else 0)
        out.append(StageParams(dense, n * experts // plan.ep, reps, emb))
    return tuple(out)


# ---------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Comm:
    """One row of the traffic table for the ranks of one pipeline stage."""

    axis: str  # the group: "tp", "pp", "cp", "ep", "dp", "dp+ep", …
    axes: tuple[str, ...]
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send
    what: str
    calls: int  # per step per rank
    bytes_per_call: int  # payload S
    group: int  # ranks in the group
    pattern: str = "ring"  # ring | pairwise | chain (how NCCL lays it on links)
    overlap: str = "exposed"  # exposed | backward | attention | prefetch
    members: tuple[int, ...] | None = None

    @property
    def payload(self) -> int:
        return self.calls * self.bytes_per_call

    @property
    def wire(self) -> float:
        return self.calls * FACTOR[self.kind](self.group) * self.bytes_per_call

    def call_seconds(self, topo: Topology) -> float:
        """latency × ring steps + wire bytes / bandwidth of the slowest link crossed."""
        route = topo.route(self.axes, "pairwise" if self.kind == "all_to_all" else "ring", self.members)
        if route is None:
            return 0.0
        return STEPS[self.kind](self.group) * route.latency + FACTOR[self.kind](self.group) * self.bytes_per_call / route.bandwidth

    def seconds(self, topo: Topology) -> float:
        return self.calls * self.call_seconds(topo)


@dataclass(frozen=True)
class _Spec:
    """A collective repeated ``fwd`` + ``bwd`` times per unit (layer, micro-batch or step)."""

    axes: tuple[str, ...]
    kind: str
    what: str
    nbytes: int
    fwd: int
    bwd: int = 0
    overlap: str = "exposed"


def _e(plan: Plan) -> int:
    return BYTES[plan.train.precision]


def _tokens(plan: Plan) -> int:
    return plan.train.micro_batch * plan.model.seq_len // plan.cp


def layer_specs(plan: Plan) -> list[_Spec]:
    """Collectives of one layer for one micro-batch (MoE ones on MoE layers only)."""
    m, e, T, t, cp = plan.model, _e(plan), _tokens(plan), plan.tp, plan.cp
    fp = 2 if plan.train.recompute == "full" else 1
    q, kv, _ = _dims(m, t)
    out: list[_Spec] = []
    if t > 1:
        kinds = ("all_gather", "reduce_scatter") if plan.tensor_parallel.sequence_parallel else ("all_reduce",)
        out += [_Spec(("tp",), k, "layer activations", T * m.hidden * e, 2 * fp, 2) for k in kinds]
    if cp > 1 and plan.context_parallel.method == "ulysses":
        out += [_Spec(("cp",), "all_to_all", "q and attention output", T * q * e, 2 * fp, 2),
                _Spec(("cp",), "all_to_all", "k and v", T * kv * e, 2 * fp, 2)]
    elif cp > 1:
        out += [_Spec(("cp",), "send", "K, V blocks (ring)", T * kv * e, 2 * (cp - 1) * fp, 2 * (cp - 1), "attention"),
                _Spec(("cp",), "send", "dK, dV blocks (ring)", T * kv * e, 0, 2 * cp, "attention")]
    if plan.ep > 1 and m.is_moe:
        tok = T // t if plan.tensor_parallel.sequence_parallel else T
        slots = tok * m.top_k if not m.capacity_factor else m.experts * ceil(m.capacity_factor * tok * m.top_k / m.experts)
        out.append(_Spec(("ep",), "all_to_all", "token dispatch and combine", slots * m.hidden * e, 2 * fp, 2))
    return out


def edge_specs(plan: Plan, first: bool, last: bool) -> list[_Spec]:
    """Per micro-batch collectives of the embedding (first chunk) and head + loss (last)."""
    if plan.tp == 1:
        return []
    S, sp, out = _tokens(plan) * plan.model.hidden * _e(plan), plan.tensor_parallel.sequence_parallel, []
    if first:
        out += ([_Spec(("tp",), "reduce_scatter", "embedding output", S, 1), _Spec(("tp",), "all_gather", "embedding output", S, 0, 1)]
                if sp else [_Spec(("tp",), "all_reduce", "embedding output", S, 1)])
    if last:
        out += ([_Spec(("tp",), "all_gather", "head input", S, 1), _Spec(("tp",), "reduce_scatter", "head input", S, 0, 1)]
                if sp else [_Spec(("tp",), "all_reduce", "head input grad", S, 0, 1)])
        out.append(_Spec(("tp",), "all_reduce", "cross-entropy max, sum-exp, target (fp32)", _tokens(plan) * 4, 3))
    return out


def _grad_group(plan: Plan, expert: bool) -> tuple[str, ...]:
    return axes_of(plan.mesh, ("dp", "cp") if expert else ("dp", "cp", "ep"))


def _group_size(plan: Plan, axes: tuple[str, ...]) -> int:
    n = 1
    for a in axes:
        n *= plan.mesh.size(a)
    return n


def step_specs(plan: Plan, stage: int, sp_params: StageParams) -> list[_Spec]:
    """Once-per-step collectives of the ranks of pipeline stage ``stage``."""
    e, zero, out = _e(plan), plan.data_parallel.zero, []
    for expert, count in ((False, sp_params.dense), (True, sp_params.expert)):
        axes = _grad_group(plan, expert)
        n, tag = _group_size(plan, axes), "expert" if expert else "dense"
        if n == 1 or count == 0:
            continue
        padded = n * ceil(count / n) * e
        if zero == 0:
            out.append(_Spec(axes, "all_reduce", f"{tag} grads", count * e, 0, 1, "backward"))
            continue
        out.append(_Spec(axes, "reduce_scatter", f"{tag} grads", padded, 0, 1, "backward"))
        if zero < 3:
            out.append(_Spec(axes, "all_gather", f"{tag} params after the step", padded, 1))
        else:
            out += [_Spec(axes, "all_gather", f"{tag} params (forward)", padded, 1, 0, "prefetch"),
                    _Spec(axes, "all_gather", f"{tag} params (backward)", padded, 0, 1, "prefetch")]
    if plan.tp > 1 and plan.tensor_parallel.sequence_parallel and sp_params.tp_replicated:
        out.append(_Spec(("tp",), "all_reduce", "grads of tp-replicated weights (SP)", sp_params.tp_replicated * e, 0, 1))
    if plan.pp > 1 and plan.model.tie_embeddings and stage in (0, plan.pp - 1):
        out.append(_Spec(("pp",), "all_reduce", "tied embedding grads", sp_params.embedding * e, 0, 1))
    return out


def pp_sends(plan: Plan, stage: int) -> tuple[int, int]:
    """(activation sends, gradient sends) of a rank of ``stage`` per micro-batch."""
    p, v = plan.pp, plan.pipeline.virtual_stages
    if p == 1:
        return 0, 0
    return (v if stage < p - 1 else v - 1), (v if stage > 0 else v - 1)


def pp_bytes(plan: Plan) -> int:
    b = _tokens(plan) * plan.model.hidden * _e(plan)
    return b // plan.tp if plan.tensor_parallel.sequence_parallel else b


def _comm(plan: Plan, sp: _Spec, calls: int) -> Comm:
    axes = axes_of(plan.mesh, sp.axes)
    members = (0, plan.pp - 1) if sp.what == "tied embedding grads" else None
    group = 2 if members else _group_size(plan, axes)
    pattern = "pairwise" if sp.kind == "all_to_all" else "ring"
    return Comm("+".join(axes), axes, sp.kind, sp.what, calls, sp.nbytes, group, pattern, sp.overlap, members)


def _merge(rows: list[Comm]) -> list[Comm]:
    out: dict[tuple, Comm] = {}
    for c in rows:
        key = (c.axis, c.kind, c.what, c.bytes_per_call)
        out[key] = replace(c, calls=out[key].calls + c.calls) if key in out else c
    return [c for c in out.values() if c.calls]


def stage_traffic(plan: Plan, stage: int) -> list[Comm]:
    """Every collective a rank of pipeline ``stage`` calls in one step, per rank."""
    m, p, v = plan.microbatches, plan.pp, plan.pipeline.virtual_stages
    chunks = chunk_layers(plan)[stage]
    layers = sum(chunks)
    rows: list[Comm] = []
    for sp in layer_specs(plan):
        rows.append(_comm(plan, sp, m * layers * (sp.fwd + sp.bwd)))
    for c in range(v):
        g = c * p + stage
        for sp in edge_specs(plan, g == 0, g == p * v - 1):
            rows.append(_comm(plan, sp, m * (sp.fwd + sp.bwd)))
    fwd, bwd = pp_sends(plan, stage)
    if fwd:
        rows.append(Comm("pp", ("pp",), "send", "activations to the next stage", m * fwd, pp_bytes(plan), p, "chain"))
    if bwd:
        rows.append(Comm("pp", ("pp",), "send", "gradients to the previous stage", m * bwd, pp_bytes(plan), p, "chain"))
    for sp in step_specs(plan, stage, stage_params(plan)[stage]):
        rows.append(_comm(plan, sp, sp.fwd + sp.bwd))
    return _merge(rows)


def traffic(plan: Plan) -> tuple[tuple[Comm, ...], ...]:
    """:func:`stage_traffic` for every pipeline stage."""
    return tuple(tuple(stage_traffic(plan, s)) for s in range(plan.pp))


def rank_payload(plan: Plan, rank: int) -> dict[tuple[str, str], int]:
    """Payload bytes per step of ``rank`` by (group, kind): what ``train.py --measure`` counts."""
    out: dict[tuple[str, str], int] = {}
    for c in stage_traffic(plan, plan.mesh.coords(rank)["pp"]):
        if c.members is not None and plan.mesh.coords(rank)["pp"] not in c.members:
            continue
        out[(c.axis, c.kind)] = out.get((c.axis, c.kind), 0) + c.payload
    return out


def flows(plan: Plan, stages: tuple[tuple[Comm, ...], ...]) -> list[Flow]:
    """The traffic of all stages as :class:`~dslc.topology.Flow` s for link charging."""
    keyed: dict[tuple, list[float]] = {}
    for s, rows in enumerate(stages):
        for c in rows:
            if c.pattern == "chain":
                continue
            key = (c.axes, c.pattern, c.members)
            keyed.setdefault(key, [0.0] * plan.pp)[s] += c.wire
    out = [Flow(axes, pattern, tuple(w), members=members) for (axes, pattern, members), w in keyed.items()]
    if plan.pp > 1:
        fwd = [next((c.wire for c in rows if c.what.startswith("activations")), 0.0) for rows in stages]
        bwd = [next((c.wire for c in rows if c.what.startswith("gradients")), 0.0) for rows in stages]
        out.append(Flow(("pp",), "chain", tuple(fwd), tuple(bwd)))
    return out
