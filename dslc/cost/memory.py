"""What one training step holds: parameters per stage, ZeRO model states, activations.
Pure functions of the plan. What it sends is :mod:`dslc.cost.traffic`, what it computes
:mod:`dslc.cost.flops`, how long it takes :mod:`dslc.cost.time`; parameter shapes are the
architecture's (:mod:`dslc.arch`).

Notation: b micro_batch, s seq_len, T = b·s/cp tokens per rank per micro-batch, h hidden,
t tp, p pp, v virtual stages, m micro-batches, e bytes of the plan's dtype (fp32 4,
bf16/fp16 2). Every number is *per rank and per step* unless it says otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from math import ceil, prod

from .. import arch, catalog
from ..groups import DP_SHARD, axes_of, group_mesh
from ..ir import Plan
from . import loss as ls
from . import offload as off
from . import recompute as rc
from . import ring
from . import schedule as sched
from .params import StageParams, chunk_layers, dtype_bytes, local_tokens, stage_params  # noqa: F401 (mem.stage_params for the other stages)
from .routing import expert_capacity, routed_slots, routed_tokens  # noqa: F401 (mem.routed_slots for the other stages)


@dataclass(frozen=True)
class Settings:
    """``attention="paper"``: the setting of Korthikanti et al. (softmax scores of s² stored,
    dropout on). ``"sdpa"`` (default, what the generated script runs): a fused attention
    kernel keeps only its output and log-sum-exp. ``dropout=None`` follows model.dropout > 0.
    ``sp_inputs``: under sequence parallelism, what the column-parallel linears (q/k/v, MLP
    in, head) keep of their all-gathered input: ``"gathered"`` (default, what the generated
    script does: autograd saves the gathered T·h·e) or ``"shard"`` (Megatron, the paper:
    only the T·h·e/t shard, all-gathered again in backward). ``imbalance``: the MoE load
    imbalance r (max/mean tokens per expert) the time and activations are costed at: without
    a capacity factor the busiest ep rank routes, receives and computes r× the uniform
    :func:`routed_slots`; with one the buffers are padded and r changes nothing. Traffic
    (what ``--measure`` compares) always assumes uniform routing."""

    attention: str = "sdpa"
    dropout: bool | None = None
    sp_inputs: str = "gathered"
    imbalance: float = 1.0
    loss: str = "chunked"  # "whole": a script that holds the logits whole (torchtitan's)


DEFAULT = Settings()
PAPER = Settings(attention="paper", dropout=True, sp_inputs="shard")


def grad_group(plan: Plan, expert: bool) -> tuple[str, ...]:
    """Mesh axes that average the grads, and that ZeRO shards over: dp×cp×ep for dense
    params, dp×cp for experts; under HSDP the shard group, dp_shard in place of dp
    (:func:`dslc.groups.replica_group` then sums the reduced shards). Experts under tp (always
    with sequence parallelism, E076) hold partial sums over tp, each tp rank having routed its
    own tokens: tp joins their group, their buckets and ZeRO shards, whenever the dense
    group has ranks (the script has buckets; without them the sums join the tp-replicated
    weights' all-reduce)."""
    dense = axes_of(group_mesh(plan), ("dp", DP_SHARD, "cp", "ep"))
    if not expert:
        return dense
    partial = bool(dense) and bool(plan.tensor_parallel.sequence_parallel)
    return axes_of(group_mesh(plan), ("dp", DP_SHARD, "cp") + ("tp",) * partial)


def group_size(plan: Plan, axes: tuple[str, ...]) -> int:
    return prod(group_mesh(plan).size(a) for a in axes)


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


BUCKET_BYTES = 25 * 2**20  # the generated script's gradient buckets (DDP's default size)


@dataclass(frozen=True)
class Zero3Units:
    """ZeRO-3's units on a rank of a stage, as the script builds them, in elements, each flat
    buffer padded to a multiple of its group's size: per block (in the stage's order) its
    dense unit over the dense group (n ranks) and its experts' unit over theirs (n_expert
    ranks; 0 without experts), and the outer unit (embeddings, final norm, head; 0 on a
    middle stage). With n_expert = 1 the experts' unit is whole on its rank, never gathered."""

    blocks: tuple[tuple[int, int], ...]
    outer: int
    n: int
    n_expert: int

    @property
    def shard(self) -> int:
        """Elements of this rank's shards (rank 0 of both groups: no padding in them)."""
        return sum(self.blocks.count(b) * (b[0] // self.n + b[1] // self.n_expert) for b in set(self.blocks)) + self.outer // self.n

    @property
    def largest_block(self) -> int:
        """The most elements one block gathers (and reduces): its dense and expert units."""
        return max((d + (x if self.n_expert > 1 else 0) for d, x in set(self.blocks)), default=0)


def zero3_units(plan: Plan, stage: int) -> Zero3Units:
    """The :class:`Zero3Units` of a rank of ``stage``, each kind of block (MoE or not) sized once."""
    n, n_expert, m = group_size(plan, grad_group(plan, False)), group_size(plan, grad_group(plan, True)), plan.model
    ids = rc.stage_layer_ids(plan, stage)
    kinds = [m.moe_layer(i) for i in ids] if m.is_moe and m.dense_layers else [m.is_moe] * len(ids)
    units = {k: (s + r, x // plan.ep) for k in set(kinds) for s, r, x in [arch.layer_params(arch.layer_model(m, m.dense_layers * k), plan.tp)]}
    padded = {k: (n * ceil(d / n), n_expert * ceil(x / n_expert)) for k, (d, x) in units.items()}
    dense = sum(d * kinds.count(k) for k, (d, _) in units.items())
    return Zero3Units(tuple(map(padded.get, kinds)), n * ceil((stage_params(plan)[stage].dense - dense) / n), n, n_expert)


def zero3_state(plan: Plan, stage: int, w: int, g: int, k: int) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of the worst rank: every unit's 1/N, padded per unit
    (the shards of weights and gradients are padded on every rank; the optimizer's
    pieces are not, so rank 0, whose shards hold no padding, is the worst)."""
    shard = zero3_units(plan, stage).shard
    return shard * w, shard * g, shard * k


def transient_bytes(plan: Plan, stage: int) -> int:
    """The most bytes of unsharded weights and gradients a rank holds at once, beyond its
    shards (ZeRO-2 and 3; ZeRO-0/1 keep the whole gradient, counted as grads).

    ZeRO-2: the buckets' gradients, while a bucket fills and the one before reduces (a
    bucket closes at BUCKET_BYTES, so it can exceed it by its last parameter: bounded by
    two of BUCKET_BYTES + the largest parameter), or all of them when micro-batches
    accumulate into them (m > 1, or a tied embedding over pp, whose buckets reduce after
    the last backward); the experts' buckets count as the dense ones. ZeRO-3: the outer
    unit's weights and gradient (held through the step) and :func:`zero3_peak_units`
    blocks, each its dense and its experts' unit (gathered, freed and reduced together),
    at the stage's largest block."""
    zero, e, sp = plan.data_parallel.zero, dtype_bytes(plan), stage_params(plan)[stage]
    n, n_expert = group_size(plan, grad_group(plan, False)), group_size(plan, grad_group(plan, True))
    if zero < 2 or n == 1:
        return 0
    if zero == 2:  # the experts' buckets too, unless no other rank holds them (their gradient is the shard)
        full = (n * ceil(sp.dense / n) + (n_expert * ceil(sp.expert / n_expert) if n_expert > 1 else 0)) * e
        accumulates = plan.microbatches > 1 or sp.tied
        largest = max(w.numel for w in arch.weights(plan.model, plan.tp)) * e
        return full if accumulates else min(full, 2 * (BUCKET_BYTES + largest))
    units = zero3_units(plan, stage)
    return (2 * units.outer + zero3_peak_units(plan, stage) * units.largest_block) * e


def zero3_peak_units(plan: Plan, stage: int) -> int:
    """Block units (weights or gradients, each one unit's flat buffer) held at once at the peak,
    replaying the rank's F and B actions (as :func:`dslc.cost.traffic.chunk_gathers`). Within a
    chunk of L blocks: a forward holds two gathered (the running one and the prefetched one; all
    L without resharding, by its end); a backward holds the weights of the block running and the
    prefetched one (all L still gathered without resharding) and the gradients accumulated by
    earlier micro-batches (all L), or, in the first backward, the gradient filling and the one
    reducing. Between actions a chunk keeps its weights when reshard_after_forward is false and
    a forward gathered them, and its gradients (all L) until its last backward reduces them (one
    left in flight). zb_h1: B frees each unit's weights as the 1f1b backward does, but the
    gradients are whole only after W (which gathers nothing), so the last W reduces them."""
    shape = schedule_shape(plan) if plan.pp > 1 else ("1f1b", 1, plan.microbatches, 1)
    return _peak_units(shape, stage, tuple(chunk_layers(plan)[stage]), plan.data_parallel.reshard_after_forward)


@functools.lru_cache(maxsize=4096)
def _peak_units(shape: tuple[str, int, int, int], stage: int, layers: tuple[int, ...], reshard: bool) -> int:
    acts = [a for a in sched.build(*shape)[stage] if a.kind in ("F", "B", "W")]
    done = "W" if any(a.kind == "W" for a in acts) else "B"  # the action after which a chunk's gradients are whole
    last = {a.chunk: i for i, a in enumerate(acts) if a.kind == done}
    gathered, grads, held, flying, peak = [0] * len(layers), [0] * len(layers), 0, None, 0  # held: both lists' units, kept (8,192 chunks); flying: the chunk reduced last

    def hold(kept: list[int], c: int, n: int, whole: bool = False) -> None:
        nonlocal held, flying
        held, kept[c] = held + n - kept[c], n
        if whole:  # c's gradients whole: reducing them waited for the one left in flight before
            if flying is not None:
                hold(grads, flying, 0)
            flying = c

    for i, a in enumerate(acts):
        c, L = a.chunk, layers[a.chunk]
        others = held - gathered[c] - grads[c]
        if a.kind == "W":  # the weight gradients into the held buffers
            during = grads[c]
            if i == last[c]:
                hold(grads, c, min(1, L), whole=True)
        elif a.kind == "F":
            during = (min(2, L) if reshard else L) + grads[c]
            hold(gathered, c, 0 if reshard else L)
        else:
            if grads[c]:
                during = (gathered[c] or min(2, L)) + L
            elif done == "W":  # never the chunk's last: its gradients grow to L beside one block's weights
                during = L + 1 if L else 0
            else:
                during = L + 1 if gathered[c] else {0: 0, 1: 2, 2: 3}.get(L, 4)
            hold(gathered, c, 0)
            whole = i == last[c] and done == "B"
            hold(grads, c, min(1, L) if whole else L, whole)
        peak = max(peak, others + during)
    return peak


def layer_activation_bytes(plan: Plan, settings: Settings = DEFAULT, layer: int | list[int] | None = None) -> float:
    """Bytes one layer keeps for backward, per rank per micro-batch (Korthikanti et al. 2022).

    Paper setting, 16-bit: s·b·h·(34 + 5as/h); with TP s·b·h·(10 + 24/t + 5as/(ht)); TP+SP
    s·b·h/t·(34 + 5as/h); selective recompute drops the 5as/h term. Term by term (e bytes per
    element, masks 1 byte, r = 1/t under SP else 1, r' = r for ``sp_inputs="shard"`` else 1):
    2 norm inputs 2·T·h·e·r; qkv input T·h·e·r'; q, k, v T·(q + 2kv)/t·e; attention scores
    a/t·s·T·(e + dropout (1 + e)); out-projection input T·q/t·e; MLP input T·h·e·r'; GELU
    input and output 2·T·f/t·e (SwiGLU: gate, up, silu(gate), product 4·T·f/t·e); 2 dropout
    masks T·h·r. SDPA keeps no scores, only a fp32 log-sum-exp (a/t·T·4; none under selective
    recompute, which re-runs the kernel). Context parallel: ring attention saves as SDPA does,
    and keeps its log-sum-exp under selective recompute too (its K/V passes are not re-run);
    Ulysses also keeps the attention output laid out by heads for SDPA's backward, T·q/t·e.
    MoE (experts whole on every tp rank, the MoE block outside the tp regions): its input is
    the router's, T·h·e·r whatever ``sp_inputs``; fp32 router logits T·E·4·r; per routed slot
    (:func:`routed_slots`) the experts' input and SwiGLU (h + 4f)·e with the full f; per choice
    (T·top_k/r) the expert output it weighs, h·e. Full keeps the layer input T·h·e·r (2sbh),
    selective_ops also :func:`~dslc.cost.recompute.kept_bytes`. ``layer``: that block's bytes
    under its policy (``full every N``); blocks: their mean (None: all; an int if all alike)."""
    plan = replace(plan, model=arch.layer_model(plan.model, layer)) if isinstance(layer, int) else plan  # its kind
    m, e, t, T = plan.model, dtype_bytes(plan), plan.tp, local_tokens(plan)
    r = t if plan.tensor_parallel.sequence_parallel else 1
    h, (q, kv, f) = m.hidden, arch.widths(m, t)
    mask = 1 if (settings.dropout if settings.dropout is not None else m.dropout > 0) else 0
    if not isinstance(layer, int) and (plan.train.recompute_every > 1 or len(arch.kinds(m)) > 1):
        ids = range(m.layers) if layer is None else layer
        alike: dict[tuple, list[int]] = {}  # blocks of one kind and one policy keep alike: one block costed for each
        for i in ids:
            alike.setdefault((m.is_moe and m.dense_layers and i < m.dense_layers, rc.layer_policy(plan, i)), []).append(i)
        return sum(len(b) * layer_activation_bytes(plan, settings, b[0]) for b in alike.values()) / max(1, len(ids))
    rec = rc.layer_policy(plan, layer if isinstance(layer, int) else None)
    if rec in rc.RERUNS:  # the block's input (and the ops selective_ops keeps)
        kept = rc.kept_bytes(plan, T, e, routed_tokens(plan), routed_slots(plan, settings.imbalance)) if rec == "selective_ops" else 0
        return T * h * e // r + kept
    heads = m.heads // t
    r_in = r if settings.sp_inputs == "shard" else 1
    mlp_in = T * h * e // (r if m.is_moe else r_in)  # the MoE routes this rank's tokens, no all-gather
    rep = 2 * T * h * e // r + T * h * e // r_in + mlp_in + 2 * T * h * mask // r  # norms, qkv in, mlp in, masks
    attn = T * (q + 2 * kv) * e + T * q * e
    cp = plan.context_parallel.method if plan.cp > 1 else None
    if settings.attention == "paper" and rec == "none":
        attn += heads * m.seq_len * T * (e + mask * (1 + e))
    elif settings.attention != "paper" and (rec == "none" or cp == "ring"):
        attn += heads * T * 4
    if cp == "ulysses" and rec == "none":
        attn += T * q * e  # the attention output twice: by heads (SDPA's), by sequence (o_proj's)
    if m.is_moe:
        slots, choices = routed_slots(plan, settings.imbalance), routed_tokens(plan) * m.top_k
        mlp = routed_tokens(plan) * (m.experts * 4 + 4 * m.shared_experts * m.ffn * e) + slots * (h + 4 * m.ffn) * e + choices * h * e
    else:
        mlp = T * f * e * (2 if arch.of(m).mlp == "gelu" else 4)  # GELU in, out; SwiGLU gate, up, silu, product
    return rep + attn + mlp


def edge_activation_bytes(plan: Plan, settings: Settings = DEFAULT) -> tuple[int, int]:
    """(embedding, head) per micro-batch: the embedding dropout mask T·h·r; the final norm
    input T·h·e·r and what the chunked loss saves (:func:`dslc.cost.loss.saved_bytes`), or
    with ``loss="whole"`` the head input T·h·e and fp32 logits 4·T·V/t (Korthikanti §4.3)."""
    m, e, T = plan.model, dtype_bytes(plan), local_tokens(plan)
    r = plan.tp if plan.tensor_parallel.sequence_parallel else 1
    mask = settings.dropout if settings.dropout is not None else m.dropout > 0
    head = T * m.hidden * e // r + 4 * T * arch.vocab_per_rank(m, plan.tp) if settings.loss == "whole" else ls.saved_bytes(plan)
    return (T * m.hidden // r if mask else 0), T * m.hidden * e // r + head


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by the worst rank of one pipeline stage at its peak.

    The peak is the larger of two moments: the backward of the last forward (model states, the
    activations in flight, ZeRO's unsharded weights and gradients, the loss's gradient buffers,
    ring attention's blocks: :func:`dslc.cost.ring.working_bytes`) and the optimizer step (model
    states and its temporaries; the activations are gone). PyTorch's caching allocator reserves
    ``allocator`` more than it hands out, and the process holds ``context`` outside it."""

    stage: int
    params: int
    grads: int
    optimizer: int
    activations: int
    inflight: int  # (micro-batch, chunk) activations held at the peak
    layers: int
    transient: int = 0  # unsharded weights and gradients of ZeRO-2/3 (transient_bytes)
    buffers: int = 0  # the loss's chunk of logits (dslc.cost.loss.buffer_bytes), last stage
    step_temp: int = 0  # the optimizer step's temporaries (foreach Adam: one fp32 tensor per parameter)
    allocator: float = 0.0
    context: int = 0
    ring: int = 0  # ring attention's accumulators and blocks in flight (ring.working_bytes)
    host_optimizer: off.Host = off.NONE  # train { offload }: what the host holds instead, and copies
    host_activations: off.Host = off.NONE

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def allocated(self) -> int:
        """What tensors hold at the peak: PyTorch's max_memory_allocated."""
        return self.states + max(self.activations + self.transient + self.buffers + self.ring, self.step_temp)

    @property
    def reserved(self) -> int:
        """What the caching allocator holds: PyTorch's max_memory_reserved."""
        return ceil(self.allocated * (1 + self.allocator))

    @property
    def total(self) -> int:
        """What the process needs of the device: reserved + the context."""
        return self.reserved + self.context


def schedule_shape(plan: Plan) -> tuple[str, int, int, int]:
    """(schedule, pp, microbatches, virtual stages): what sets a plan's action lists."""
    return plan.pipeline.schedule, plan.pp, plan.microbatches, plan.pipeline.virtual_stages


def actions(plan: Plan) -> sched.Schedule:
    return sched.build(*schedule_shape(plan))


def shards(plan: Plan, stage: int, sp, w: int, g: int, k: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The dense and the expert (params, grads, optimizer) bytes of a stage's rank."""
    if plan.data_parallel.zero == 3 and group_size(plan, grad_group(plan, False)) > 1:  # padded per unit, experts' too
        return zero3_state(plan, stage, w, g, k), (0, 0, 0)
    zero = plan.data_parallel.zero
    return (zero_state(sp.dense, group_size(plan, grad_group(plan, False)), zero, w, g, k),
            zero_state(sp.expert, group_size(plan, grad_group(plan, True)), zero, w, g, k))


def memory(plan: Plan, settings: Settings = DEFAULT, peaks: tuple[int, ...] | None = None) -> tuple[StageMemory, ...]:
    """Per stage: ZeRO model states of dense params over dp×cp×ep and expert params over
    dp×cp (ZeRO-3 padded per unit), the unsharded bytes of ZeRO-2/3 (:func:`transient_bytes`),
    plus activations × the schedule's peak in-flight count (1f1b: p on the first
    stage; gpipe: m; interleaved: p·v + p − 1 chunks on the first, i.e. ×(1 + (p−1)/(p·v)))."""
    w, g, k = state_bytes_per_param(plan)
    v = plan.pipeline.virtual_stages
    allow = catalog.allowance(plan.cluster.device.name)
    if peaks is None:
        peaks = sched.peaks(*schedule_shape(plan))  # the order alone sets it: no simulation
    emb, head = edge_activation_bytes(plan, settings)
    out = []
    for s, (sp, chunks) in enumerate(zip(stage_params(plan), chunk_layers(plan))):
        dense, expert = shards(plan, s, sp, w, g, k)
        held = peaks[s]
        per_layer = layer_activation_bytes(plan, settings, rc.stage_layer_ids(plan, s))  # full every N: per stage
        act = round(held * sum(chunks) / v * per_layer)
        moved = off.moved_per_layer(plan, per_layer)
        acts = off.activation_host(plan, round(held * sum(chunks) / v * moved), round(plan.microbatches * sum(chunks) * moved))
        if acts.d2h:  # on the host, but for the blocks being written or read
            act += round(min(off.PREFETCHED, sum(chunks)) * moved) - acts.activations
        if s == 0:
            act += ceil(held / v) * emb
        if s == plan.last_stage:
            act += ceil(held / v) * head
        whole = (4 + dtype_bytes(plan)) * local_tokens(plan) * arch.vocab_per_rank(plan.model, plan.tp)  # the logits' gradient
        buffers = (whole if settings.loss == "whole" else ls.buffer_bytes(plan)) if s == plan.last_stage else 0
        n = sum(part[2] for part in shards(plan, s, sp, 0, 0, 1))  # the parameters the rank's optimizer steps
        opt = off.optimizer_host(plan, n, w, k - 4 * (w == 2))  # k less the master copy
        on_device = 0 if opt.d2h else 1  # the optimizer's state and its step's temporaries (one fp32 each, if it has state)
        out.append(StageMemory(s, dense[0] + expert[0], dense[1] + expert[1], on_device * (dense[2] + expert[2]), act, held, sum(chunks),
                               transient_bytes(plan, s), buffers, on_device * 4 * n * (k > 0), allow.allocator, allow.context, ring.working_bytes(plan), opt, acts))
    return tuple(out)
