"""What one training step holds and computes: pure functions of the plan.

What it sends is :mod:`dslc.traffic`. (Links and call times are :mod:`dslc.topology`'s; the
step time, which needs both and the schedule simulation, is :func:`dslc.report.timing`.)

Notation: b micro_batch, s seq_len, T = b·s/cp tokens per rank per micro-batch, h hidden,
t tp, p pp, v virtual stages, m micro-batches, e bytes of the plan's dtype (fp32 4,
bf16/fp16 2). Every number is *per rank and per step* unless it says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from . import schedule as sched
from .diagnostics import Diagnostic, error
from .ir import Model, Plan
from .topology import axes_of

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GiB = 2**30


@dataclass(frozen=True)
class Settings:
    """``attention="paper"``: the setting of Korthikanti et al. (softmax scores of s² stored,
    dropout on). ``"sdpa"`` (default, what the generated script runs): a fused attention
    kernel keeps only its output and log-sum-exp. ``dropout=None`` follows model.dropout > 0.
    ``efficiency``: achieved fraction of peak matmul FLOP/s (0.5, roughly Megatron's MFU).
    ``sp_inputs``: under sequence parallelism, what the column-parallel linears (q/k/v, MLP
    in, head) keep of their all-gathered input: ``"gathered"`` (default, what the generated
    script does: autograd saves the gathered T·h·e) or ``"shard"`` (Megatron, the paper:
    only the T·h·e/t shard, all-gathered again in backward)."""

    attention: str = "sdpa"
    dropout: bool | None = None
    efficiency: float = 0.5
    sp_inputs: str = "gathered"


DEFAULT = Settings()
PAPER = Settings(attention="paper", dropout=True, sp_inputs="shard")


def dtype_bytes(plan: Plan) -> int:
    """e: bytes per element of the plan's precision."""
    return BYTES[plan.train.precision]


def local_tokens(plan: Plan) -> int:
    return plan.train.micro_batch * plan.model.seq_len // plan.cp


def grad_group(plan: Plan, expert: bool) -> tuple[str, ...]:
    """Mesh axes that average the grads: dp×cp×ep for dense params, dp×cp for experts."""
    return axes_of(plan.mesh, ("dp", "cp") if expert else ("dp", "cp", "ep"))


def group_size(plan: Plan, axes: tuple[str, ...]) -> int:
    return prod(plan.mesh.size(a) for a in axes)


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


def widths(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(q, kv, ffn) widths on one tp rank; kv heads are replicated when fewer than t."""
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    return q // t, (kv // t if model.kv_heads % t == 0 else kv), model.ffn // t


def _layer(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(tp-sharded, tp-replicated, expert) parameters of one layer on one tp rank.

    gpt2: LayerNorm (weight+bias) ×2, qkv and out projections with biases, GELU MLP with
    biases. llama: RMSNorm ×2, no biases, SwiGLU (3 matrices), GQA k/v of kv_heads·head_dim.
    mixtral: llama attention, router h×E, E SwiGLU experts."""
    h = model.hidden
    q, kv, f = widths(model, t)
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
    """The parameter count of Narayanan et al. (SC21): 12·l·h²(1 + 13/(12h) + (V+s)/(12lh))
    for GPT with a tied head; it leaves out the final LayerNorm (2h)."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


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
    """Layers of each local chunk of each pp rank: [rank][chunk] (chunk g on rank g % p)."""
    p, v = plan.pp, plan.pipeline.virtual_stages
    split = plan.stage_layers()
    return [[split[c * p + r] for c in range(v)] for r in range(p)]


def stage_params(plan: Plan) -> tuple[StageParams, ...]:
    """Vocab-parallel embedding (+ gpt2 positions) on the first stage; final norm and head on
    the last (with tied embeddings and p > 1 the last stage holds a copy, as Megatron)."""
    m, t, p = plan.model, plan.tp, plan.pp
    h, emb = m.hidden, ceil(m.vocab / t) * m.hidden
    sharded, rep, experts = _layer(m, t)
    tied = emb if m.tie_embeddings and p > 1 else 0
    out = []
    for r, chunks in enumerate(chunk_layers(plan)):
        n = sum(chunks)
        dense, reps = n * (sharded + rep), n * rep
        if r == 0:  # gpt2's positions are replicated over tp (under SP each rank sees its slice)
            pos = m.seq_len * h if m.arch == "gpt2" else 0
            dense, reps = dense + emb + pos, reps + pos
        if r == p - 1:
            norm = 2 * h if m.arch == "gpt2" else h
            dense, reps = dense + norm + (emb if not m.tie_embeddings or p > 1 else 0), reps + norm
        out.append(StageParams(dense, n * experts // plan.ep, reps, tied if r in (0, p - 1) else 0))
    return tuple(out)


# ---------------------------------------------------------------------------- memory


def state_bytes_per_param(plan: Plan) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes per parameter before ZeRO sharding.

    bf16/fp16: 2 + 2 + 12 — 16-bit working weights and grads, fp32 master weights + Adam m
    and v in the optimizer (Rajbhandari et al. 2020, K = 12). fp32: 4 + 4 + 8 — the weights
    are their own master copy; Adam keeps m and v. SGD keeps one momentum buffer (if any)."""
    e, opt = dtype_bytes(plan), plan.train.optimizer
    moments = 8 if opt.name in ("adam", "adamw") else (4 if opt.momentum else 0)
    return e, e, moments + (4 if e == 2 else 0)


def zero_state(n_params: int, group: int, zero: int, w: int, g: int, k: int) -> tuple[int, int, int]:
    """ZeRO (Rajbhandari et al. 2020) per-rank (params, grads, optimizer) bytes: stage 1 shards
    the optimizer over ``group`` ranks, 2 also the grads, 3 also the params:
    (2+2+K)Ψ → 4Ψ + KΨ/N → 2Ψ + (2+K)Ψ/N → (4+K)Ψ/N. Shards round up (padded buffers)."""
    shard = ceil(n_params / group)
    return ((shard if zero >= 3 else n_params) * w, (shard if zero >= 2 else n_params) * g, (shard if zero >= 1 else n_params) * k)


def layer_activation_bytes(plan: Plan, settings: Settings = DEFAULT) -> int:
    """Bytes one layer keeps for backward, per rank per micro-batch (Korthikanti et al. 2022).

    Paper setting, 16-bit: s·b·h·(34 + 5as/h); with TP s·b·h·(10 + 24/t + 5as/(ht)); TP+SP
    s·b·h/t·(34 + 5as/h); selective recompute drops the 5as/h term. Term by term (e bytes per
    element, masks 1 byte, r = 1/t under SP else 1, r' = r for ``sp_inputs="shard"`` else 1):
    2 norm inputs 2·T·h·e·r; qkv input T·h·e·r'; q, k, v T·(q + 2kv)/t·e; attention scores
    a/t·s·T·(e + dropout (1 + e)); out-projection input T·q/t·e; MLP input T·h·e·r'; GELU input and output 2·T·f/t·e
    (SwiGLU: gate, up, silu(gate), product 4·T·f/t·e); 2 dropout masks T·h·r. SDPA keeps no
    scores, only a fp32 log-sum-exp (a/t·T·4; none under selective recompute, which
    re-runs the kernel). MoE: the MLP is T·h·e·r (router input),
    fp32 router logits T·E·4, and per routed token its input, SwiGLU and output
    (h + 4f/t + h)·e. Full recompute keeps the layer input T·h·e·r (the paper's 2sbh)."""
    m, e, t, T = plan.model, dtype_bytes(plan), plan.tp, local_tokens(plan)
    r = t if plan.tensor_parallel.sequence_parallel else 1
    h, (q, kv, f) = m.hidden, widths(m, t)
    mask = 1 if (settings.dropout if settings.dropout is not None else m.dropout > 0) else 0
    rec = plan.train.recompute
    if rec == "full":
        return T * h * e // r
    heads = m.heads // t
    r_in = r if settings.sp_inputs == "shard" else 1
    rep = 2 * T * h * e // r + 2 * T * h * e // r_in + 2 * T * h * mask // r  # norms, qkv in, mlp in, masks
    attn = T * (q + 2 * kv) * e + T * q * e
    if settings.attention == "paper" and rec == "none":
        attn += heads * m.seq_len * T * (e + mask * (1 + e))
    elif settings.attention != "paper" and rec == "none":
        attn += heads * T * 4
    if m.is_moe:
        tok = T // r
        routed = tok * m.top_k if not m.capacity_factor else m.experts * ceil(m.capacity_factor * tok * m.top_k / m.experts)
        mlp = T * m.experts * 4 // r + routed * (2 * h + 4 * f) * e
    else:
        mlp = T * f * e * (2 if m.arch == "gpt2" else 4)
    return rep + attn + mlp


def edge_activation_bytes(plan: Plan, settings: Settings = DEFAULT) -> tuple[int, int]:
    """(embedding, head) activations per micro-batch: the embedding dropout mask T·h·r; the
    final norm input T·h·e·r, the head input T·h·e·r' (see layer_activation_bytes) and the
    fp32 logits of the loss 4·T·V/t (Korthikanti et al. §4.3: 4sbh/t·(1 + v/h) for the output layer)."""
    m, e, T = plan.model, dtype_bytes(plan), local_tokens(plan)
    r = plan.tp if plan.tensor_parallel.sequence_parallel else 1
    mask = settings.dropout if settings.dropout is not None else m.dropout > 0
    r_in = r if settings.sp_inputs == "shard" else 1
    head = T * m.hidden * e // r + T * m.hidden * e // r_in + 4 * T * ceil(m.vocab / plan.tp)
    return (T * m.hidden // r if mask else 0), head


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by the worst rank of one pipeline stage."""

    stage: int
    params: int
    grads: int
    optimizer: int
    activations: int
    inflight: int  # (micro-batch, chunk) activations held at the peak
    layers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


def actions(plan: Plan):
    p = plan.pipeline
    return sched.build(p.schedule, plan.pp, p.microbatches, p.virtual_stages)


def memory(plan: Plan, settings: Settings = DEFAULT, peaks: tuple[int, ...] | None = None) -> tuple[StageMemory, ...]:
    """Per stage: ZeRO model states of dense params over dp×cp×ep and expert params over
    dp×cp, plus activations × the schedule's peak in-flight count (1f1b: p on the first
    stage; gpipe: m; interleaved: p·v + p − 1 chunks on the first, i.e. ×(1 + (p−1)/(p·v)))."""
    w, g, k = state_bytes_per_param(plan)
    zero, v = plan.data_parallel.zero, plan.pipeline.virtual_stages
    if peaks is None:
        peaks = sched.simulate(actions(plan), 1.0, 2.0).peak_inflight
    per_layer = layer_activation_bytes(plan, settings)
    emb, head = edge_activation_bytes(plan, settings)
    out = []
    for s, (sp, chunks) in enumerate(zip(stage_params(plan), chunk_layers(plan))):
        dense = zero_state(sp.dense, group_size(plan, grad_group(plan, False)), zero, w, g, k)
        expert = zero_state(sp.expert, group_size(plan, grad_group(plan, True)), zero, w, g, k)
        held = peaks[s]
        act = round(held * sum(chunks) / v * per_layer)
        if s == 0:
            act += ceil(held / v) * emb
        if s == plan.pp - 1:
            act += ceil(held / v) * head
        out.append(StageMemory(s, dense[0] + expert[0], dense[1] + expert[1], dense[2] + expert[2], act, held, sum(chunks)))
    return tuple(out)


# ---------------------------------------------------------------------------- FLOPs


def layer_flops(model: Model, seq: int, t: int = 1) -> tuple[float, float]:
    """(matmul, attention-core) forward FLOPs per token of one layer on one tp rank.

    Matmuls 2·h·(q + 2kv) + 2·q·h, MLP 2·2·h·f (GELU) or 3·2·h·f (SwiGLU; MoE: top_k of them
    plus the router 2·h·E); attention core 2·2·s·q (QKᵀ and AV, no causal saving), as in
    Narayanan et al. SC21 (who count GPT: 24h² + 4sh per token per layer)."""
    h = model.hidden
    q, kv, f = widths(model, t)
    mlp = 4 * h * f if model.arch == "gpt2" else 6 * h * f
    if model.is_moe:
        mlp = model.top_k * mlp + 2 * h * model.experts
    return 2 * h * (q + 2 * kv) + 2 * q * h + mlp, 4 * seq * q


def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """FLOPs per step of GPT with full recompute, Narayanan et al. (SC21):
    96·B·s·l·h²(1 + s/(6h) + V/(16lh))."""
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


@dataclass(frozen=True)
class Flops:
    model: float  # 3 passes (forward + backward): what MFU counts
    hardware: float  # + recomputation: full re-runs the layers' forward, selective the attention core


def batch_tokens(plan: Plan) -> int:
    """Tokens per step: micro_batch × micro-batches × dp × ep sequences of seq_len."""
    return plan.train.micro_batch * plan.microbatches * plan.data_parallel_size * plan.model.seq_len


def flops(plan: Plan) -> Flops:
    """Per step, whole cluster: model = 3·tokens·(l·layer + 2·h·V) — for GPT this is
    72·B·s·l·h²(1 + s/(6h) + V/(12lh)); hardware adds l·layer (full) or l·core (selective),
    which with full recompute gives the 96·B·s·l·h²(1 + s/(6h) + V/(16lh)) of SC21."""
    m = plan.model
    tokens = batch_tokens(plan)
    mm, core = layer_flops(m, m.seq_len)
    model = 3 * tokens * (m.layers * (mm + core) + 2 * m.hidden * m.vocab)
    extra = {"none": 0, "selective": core, "full": mm + core}[plan.train.recompute]
    return Flops(model, model + tokens * m.layers * extra)


# ---------------------------------------------------------------------------- diagnostics


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def _variants(plan: Plan):
    """(knob, label, plan) for single changes that lower memory, smallest change first; the
    global batch is kept (fewer samples per micro-batch or fewer dp ranks → more micro-batches)."""
    tr, mesh, pipe = plan.train, plan.mesh, plan.pipeline
    if group_size(plan, grad_group(plan, False)) > 1:
        for z in range(plan.data_parallel.zero + 1, 4):
            yield "zero", f"zero = {z}", replace(plan, data_parallel=replace(plan.data_parallel, zero=z))
    order = ("none", "selective", "full")
    for rc in order[order.index(tr.recompute) + 1 :]:
        yield "recompute", f"recompute = {rc}", replace(plan, train=replace(tr, recompute=rc))
    k = 2
    while tr.micro_batch // k >= 1:
        mb = replace(pipe, microbatches=pipe.microbatches * k)
        yield "micro_batch", f"micro_batch = {tr.micro_batch // k}", replace(plan, train=replace(tr, micro_batch=tr.micro_batch // k), pipeline=mb)
        k *= 2
    dp = mesh.axis("dp")
    for name in ("tp", "pp"):
        k = 2
        while dp is not None and dp.size % k == 0:
            size = mesh.size(name) * k
            if (name == "tp" and (plan.model.heads % size or plan.model.ffn % size)) or (name == "pp" and plan.model.layers < size * pipe.virtual_stages):
                break
            axes = [replace(a, size=a.size // k if a.name == "dp" else size if a.name == name else a.size) for a in mesh.axes]
            axes += [] if mesh.axis(name) else [replace(dp, name=name, size=size)]
            new = replace(pipe, layers_per_stage=None, microbatches=pipe.microbatches * k)
            yield name, f"{name} = {size} with dp = {dp.size // k}", replace(plan, mesh=replace(mesh, axes=tuple(axes)), pipeline=new)
            k *= 2


def memory_diagnostics(plan: Plan, settings: Settings = DEFAULT, stages: tuple[StageMemory, ...] | None = None) -> list[Diagnostic]:
    """E090 at the plan when its worst rank needs more than the device memory, with the
    breakdown and, for each of zero, recompute, micro_batch, tp and pp, the smallest change
    that fits and the memory it would reach."""
    cap, dev = plan.cluster.device.memory, plan.cluster.device.name
    try:
        stages = stages if stages is not None else memory(plan, settings)
    except ValueError:  # no schedule for these numbers: the pipeline checks report why
        return []
    worst = max(stages, key=lambda s: s.total)
    if worst.total <= cap:
        return []
    msg = (f"pipeline stage {worst.stage} needs {_gib(worst.total)} per GPU but {dev} has {_gib(cap)}: params "
           f"{_gib(worst.params)}, grads {_gib(worst.grads)}, optimizer {_gib(worst.optimizer)}, activations "
           f"{_gib(worst.activations)} ({worst.inflight} micro-batch chunks in flight × {worst.layers} layers)")
    fits: dict[str, str] = {}
    closest: tuple[float, str] | None = None
    for knob, label, variant in _variants(plan):
        if knob in fits:
            continue
        try:
            need = max(s.total for s in memory(variant, settings))
        except ValueError:  # the schedule cannot be built for this variant
            continue
        if need <= cap:
            fits[knob] = f"{label} ({_gib(need)})"
        elif closest is None or need < closest[0]:
            closest = (need, f"{label} ({_gib(need)})")
    if fits:
        hint = "it fits with any one of: " + ", ".join(fits.values())
    else:
        hint = "no single change of zero, recompute, micro_batch, tp or pp fits" + (f"; closest: {closest[1]}" if closest else "") + "; combine them or add GPUs"
    return [error("E090", plan.span, msg, hint)]
