"""Semantic checks of a lowered plan: one function per rule, each returning
diagnostics that name the numbers involved and point at the key they are
about (``plan.where("model.heads")``). See dslc/codes.py for the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .. import arch
from ..arch import vocab_per_rank
from ..chunks import Placement
from ..diagnostics import Diagnostic, error, warning
from ..front.defaults import MAX_SCHEDULE
from ..front.recompute import EAGER_POLICIES
from ..groups import axis_crossing
from ..ir import SCHEDULES, V_SHAPED, Cluster, Model, Plan
from ..source import Span
from .data import checkpoint_dir, data_file

Check = Callable[[Plan], Iterator[Diagnostic]]
CHECKS: list[Check] = []


def rule(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def check_plan(plan: Plan, files: bool = True) -> list[Diagnostic]:
    """Every rule's diagnostics. Whether the plan fits in memory (E090) is decided after
    the checks, by :mod:`dslc.search`, for plans that pass them. ``files=False`` leaves
    out the rule that reads the data files (search's variants of a checked plan differ
    from it only in their layout)."""
    out: list[Diagnostic] = []
    for fn in CHECKS:
        if files or fn is not data_file:
            out.extend(fn(plan))
    return out


def _axes_desc(plan: Plan) -> str:
    return " × ".join(f"{a.name}={a.size}" for a in plan.mesh.axes) or "no axes"


# -- mesh and placement -----------------------------------------------------


@rule
def mesh_matches_cluster(plan: Plan):
    c = plan.cluster
    if plan.world_size != c.world_size:
        yield error(
            "E030",
            plan.where("mesh"),
            f"mesh has {plan.world_size} ranks ({_axes_desc(plan)}) but cluster '{c.name}' has "
            f"{c.world_size} GPUs ({c.nodes} node{'s' * (c.nodes != 1)} × {c.gpus_per_node})",
            "make the product of the mesh axes equal nodes × gpus_per_node",
        )


@rule
def placement(plan: Plan):
    c = plan.cluster
    if plan.world_size != c.world_size:
        return
    for ax in plan.mesh.axes:
        link = c.link(ax.link)
        if link is None or ax.size == 1:
            continue
        if link.scope == "node":
            crossing = axis_crossing(plan.mesh, c.gpus_per_node, ax.name)
            if crossing is not None:
                group, stride, boundary = crossing
                g = c.gpus_per_node
                nodes = sorted({r // g for r in group})
                shown = ", ".join(map(str, group[:8])) + (", …" if len(group) > 8 else "")
                yield error(
                    "E034",
                    ax.span,
                    f"{ax.name}={ax.size} spans {len(nodes)} nodes but is placed on {link.name} (scope: node)",
                    f"with stride {stride} its group [{shown}] crosses the node boundary at rank "
                    f"{boundary} ({g} GPUs per node); move {ax.name} later in the mesh (smaller "
                    f"stride) or place it on a cluster-scope link",
                )
        elif ax.name == "tp":
            yield warning(
                "W035",
                ax.span,
                f"tp={ax.size} is placed on {link.name} (scope: cluster): tensor parallelism "
                f"all-reduces every layer and is usually confined to a node",
                "put tp last in the mesh on a node-scope link",
            )


# -- model shapes -----------------------------------------------------------


def check_definition(d: Cluster | Model, spans: dict[str, Span]) -> list[Diagnostic]:
    """The rules of a model or cluster defined in a file without plans (a library): those of
    the model alone (a cluster's are the lowering's). ``spans``: its keys' (``model.heads``)."""
    if not isinstance(d, Model):
        return []

    def where(*keys: str) -> Span:
        return next((spans[k] for k in keys if k in spans), d.span)

    return list(_model_alone(d, where, "model.head_dim" in spans))


@rule
def model_shapes(plan: Plan):
    m, tp = plan.model, plan.tp
    yield from _model_alone(m, plan.where, "model.head_dim" in plan.spans)
    if tp == 1:
        return
    if m.heads % tp:
        yield error("E041", plan.where("mesh.tp"), f"heads={m.heads} is not divisible by tp={tp}", f"use a tp that divides {m.heads}")
    elif m.kv_heads % tp:
        yield error("E042", plan.where("mesh.tp"), f"kv_heads={m.kv_heads} is not divisible by tp={tp}", f"grouped-query attention splits the kv heads over tp; use tp ≤ {m.kv_heads} dividing it")
    if m.ffn % tp and not m.is_moe:  # experts are whole on every tp rank
        yield error("E043", plan.where("model.ffn", "mesh.tp"), f"ffn={m.ffn} is not divisible by tp={tp}", f"use an ffn that is a multiple of {tp}")
    elif m.is_moe and m.dense_layers and m.dense_ffn % tp:  # the dense prefix's MLP is split
        yield error("E043", plan.where("model.dense_ffn", "model.dense_layers", "mesh.tp"), f"dense_ffn={m.dense_ffn} (the MLP of the first {m.dense_layers} blocks, split over tp) is not divisible by tp={tp}", f"use a dense_ffn that is a multiple of {tp}")
    per_rank = vocab_per_rank(m, tp)
    if (tp - 1) * per_rank >= m.vocab:
        yield error("E047", plan.where("model.vocab", "mesh.tp"), f"vocab={m.vocab} is too small to split over tp={tp}: the last rank would hold no ids", f"use a vocab of at least {(tp - 1) * per_rank + 1}, or a smaller tp")
    elif m.vocab % tp:
        yield warning("W044", plan.where("model.vocab"), f"vocab={m.vocab} is not divisible by tp={tp}; it is padded to {per_rank * tp}", f"set vocab = {per_rank * tp} to make the padding explicit")


def _model_alone(m: Model, where: Callable[..., Span], given: bool):
    """The rules of the model whatever its layout; ``given``: head_dim is written (else it
    is hidden / heads)."""
    if m.hidden % m.heads and not given:
        yield error("E040", where("model.hidden", "model.heads"), f"hidden={m.hidden} is not divisible by heads={m.heads}, and head_dim is not given",
                    "set head_dim (q is heads × head_dim wide, as in Gemma and Qwen3), or use heads that divide hidden")
    if m.heads % m.kv_heads:
        yield error("E042", where("model.kv_heads"), f"heads={m.heads} is not divisible by kv_heads={m.kv_heads}", "each key/value head serves a whole group of query heads")
    if arch.of(m).positions == "rope" and m.head_dim % 2:
        what = f"head_dim = {m.head_dim}" if given else f"head_dim = hidden/heads = {m.head_dim}"
        yield error("E046", where(*(("model.head_dim",) if given else ("model.hidden", "model.heads"))), f"RoPE rotates pairs of dimensions but {what} is odd",
                    "choose an even head_dim" if given else "choose hidden and heads with an even quotient, or set an even head_dim")


# -- pipeline ---------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """Why action lists of a shape cannot be built: a diagnostic code, the plan keys it is
    about (most specific first), the message naming the numbers, and a hint."""

    code: str
    keys: tuple[str, ...]
    message: str
    hint: str | None = None


def shape_problems(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> list[Problem]:
    """The one statement of which (schedule, pp, microbatches, virtual_stages) can be built:
    :func:`dslc.cost.schedule.build` refuses these, and :func:`pipeline` reports them at the
    plan's keys.
    1f1b, zb_h1, interleaved_1f1b and zb_v need microbatches ≥ pp, interleaved_1f1b also
    microbatches % pp == 0, dualpipe_v microbatches ≥ 2·pp (as torch's ScheduleDualPipeV);
    only interleaved_1f1b takes v > 1, and zb_v and dualpipe_v need v = 2 (their V: the
    front end implies it); pp × v × microbatches is at most MAX_SCHEDULE (E058)."""
    p, m, v = pp, microbatches, virtual_stages
    if schedule not in SCHEDULES:
        return [Problem("E019", ("pipeline.schedule",), f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")]
    if p < 1 or m < 1 or v < 1:
        return [Problem("E015", ("pipeline",), f"pp, microbatches and virtual_stages must be ≥ 1 (got {p}, {m}, {v})")]
    if p * v * m > MAX_SCHEDULE:  # what explain, schedule and compile handle in seconds
        return [Problem("E058", ("pipeline.microbatches", "train.global_batch", "pipeline.virtual_stages", "mesh.pp"),
                        f"the schedule has pp={p} × virtual_stages={v} × microbatches={m} = {p * v * m} chunk forwards per step, more than the {MAX_SCHEDULE} dslc plans for",
                        "use fewer, larger micro-batches")]
    out = []
    if schedule in V_SHAPED and v != 2:
        out.append(Problem("E056", ("pipeline.virtual_stages",), f"{schedule} places two chunks per rank in a V: virtual_stages must be 2, got {v}",
                           "leave virtual_stages out (it is implied) or set it to 2"))
    elif v > 1 and schedule not in ("interleaved_1f1b", *V_SHAPED):
        out.append(Problem("E056", ("pipeline.virtual_stages",), f"virtual_stages={v} needs schedule = interleaved_1f1b, not {schedule}"))
    if schedule == "dualpipe_v" and m < 2 * p:
        out.append(Problem("E053", ("pipeline.microbatches", "train.global_batch"), f"dualpipe_v needs microbatches ≥ 2·pp, got microbatches={m} < {2 * p}",
                           f"raise microbatches to at least {2 * p} (global_batch = micro_batch × microbatches × dp)"))
    elif schedule in ("1f1b", "zb_h1", "interleaved_1f1b", "zb_v") and m < p:
        out.append(Problem("E053", ("pipeline.microbatches", "train.global_batch"), f"{schedule} needs microbatches ≥ pp, got microbatches={m} < pp={p}",
                           f"raise microbatches to at least {p} (global_batch = micro_batch × microbatches × dp)"))
    elif schedule == "interleaved_1f1b" and m % p:
        out.append(Problem("E054", ("pipeline.microbatches",), f"interleaved_1f1b needs microbatches divisible by pp, got microbatches={m}, pp={p} (remainder {m % p})",
                           f"use {m - m % p or p} or {m + p - m % p}"))
    return out


@rule
def pipeline(plan: Plan):
    p, pl, layers = plan.pp, plan.pipeline, plan.model.layers
    v, m = pl.virtual_stages, pl.microbatches
    if pl.schedule == "interleaved_1f1b" and p > 1 and v < 2:
        yield error("E056", plan.where("pipeline.virtual_stages", "pipeline.schedule"), f"interleaved_1f1b needs virtual_stages ≥ 2, got {v}", "set virtual_stages = 2 or use schedule = 1f1b")
    for pr in shape_problems(pl.schedule, p, m, v):  # build() refuses the same
        yield error(pr.code, plan.where(*pr.keys), pr.message, pr.hint)
    if p == 1:
        if any(k in plan.spans for k in ("pipeline.schedule", "pipeline.virtual_stages", "pipeline.layers_per_stage")):
            yield warning("W057", plan.where("pipeline"), "pipeline options have no effect: the mesh has no pp axis", "add `pp = N on <link>` to the mesh, or remove them")
        return
    chunks = p * v
    if pl.layers_per_stage is not None:
        where = plan.where("pipeline.layers_per_stage")
        if len(pl.layers_per_stage) != chunks:
            yield error("E051", where, f"layers_per_stage lists {len(pl.layers_per_stage)} stages but the plan has {chunks} (pp={p} × virtual_stages={v})")
        elif sum(pl.layers_per_stage) != layers:
            yield error("E051", where, f"layers_per_stage sums to {sum(pl.layers_per_stage)} but the model has {layers} layers")
        empty = _empty_chunks(pl.layers_per_stage, p, v, plan.v_shape)
        if empty:
            hint = "in a V any chunk may have 0 layers, but every pp rank but rank 0 (the embedding and the loss) must hold one" if plan.v_shape else "only the first chunk (it holds the embedding) and the last (the final norm, head and loss) may have 0 layers"
            yield error("E052", where, empty, hint)
    elif chunks > layers:
        yield error("E050", plan.where("mesh.pp", "pipeline.virtual_stages"), f"pp={p} × virtual_stages={v} = {chunks} stages but the model has only {layers} layers", f"use at most {layers} stages in all")
    if pl.schedule == "gpipe" and (p - 1) / m > 0.25:  # the bubble over the compute, (p−1)/m
        yield warning("W055", plan.where("pipeline.schedule"), f"gpipe with pp={p} and microbatches={m}: the pipeline bubble is {(p - 1) / m:.3g}× the compute ((p−1)/m), so each rank idles {(p - 1) / (m + p - 1):.0%} of the step", f"use ≥ {4 * (p - 1)} micro-batches, or schedule = 1f1b")


def _empty_chunks(split: tuple[int, ...], p: int, v: int, v_shape: bool = False) -> str:
    """Every chunk of ``layers_per_stage`` (chunk g on pp rank g % p, in a V on rank g or
    2p−1−g) with fewer than 0 layers, or none but the first (the embedding) and the last
    (the loss), in one message. In a V any chunk may be empty (its forward is the
    identity), but every rank but the first (the embedding and head) must hold a layer."""
    at = Placement(p, v, v_shape)
    names = [f"chunk {g}" + (f" (pp rank {at.rank(g)})" if v > 1 else "") for g in range(len(split))]
    bad = [f"{names[g]} has {'no' if n == 0 else n} layers" for g, n in enumerate(split) if n < 0 or (n == 0 and 0 < g < len(split) - 1 and not v_shape)]
    if v_shape and len(split) == at.chunks:
        bad += [f"pp rank {r} (chunks {' and '.join(map(str, at.ids(r)))}) has no layers" for r in range(1, p) if not any(split[g] for g in at.ids(r))]
    return "layers_per_stage: " + ", ".join(bad) if bad else ""


# -- sequence and context parallel ------------------------------------------


@rule
def sequence_context(plan: Plan):
    s, tp, cp = plan.model.seq_len, plan.tp, plan.cp
    if arch.of(plan.model).positions == "learned" and s > plan.model.max_positions:
        yield error("E066", plan.where("train.seq_len"), f"train.seq_len={s} is longer than the model's seq_len={plan.model.max_positions}: {plan.model.arch} learns a table of {plan.model.max_positions} positions",
                    f"train at most {plan.model.max_positions} tokens a sequence, or raise the model's seq_len (rotary models, such as llama, take any)")
    if plan.tensor_parallel.sequence_parallel:
        if tp == 1:
            yield error("E060", plan.where("tensor_parallel.sequence_parallel"), "sequence_parallel needs a tp axis larger than 1", "add `tp = N on <link>` to the mesh or remove sequence_parallel")
        elif (s // cp) % tp or s % cp:
            yield error("E061", plan.where("tensor_parallel.sequence_parallel"), f"sequence parallel splits the sequence over tp, but seq_len={s}" + (f" / cp={cp}" if cp > 1 else "") + f" is not divisible by tp={tp}")
    if cp > 1:
        cpo = plan.context_parallel
        chunks = 2 * cp if cpo.method == "ring" and cpo.load_balance else cp
        if s % chunks:
            why = f"2·cp={chunks} chunks (ring with load balancing)" if chunks != cp else f"cp={cp}"
            yield error("E062", plan.where("mesh.cp"), f"seq_len={s} is not divisible by {why}")
        m, method = plan.model, cpo.method
        if method not in arch.of(m).cp_methods:
            yield error("E065", plan.where("context_parallel.method", "mesh.cp"), f"context parallel ({method}) cannot run arch {m.arch}: {arch.of(m).cp_why}", "remove the cp axis")
        if method == "ulysses":
            heads, kv = (w // m.head_dim for w in arch.widths(m, tp)[:2])  # on one tp rank
            if heads % cp or kv % cp:
                per = f" per tp rank (tp={tp})" if tp > 1 else ""
                yield error("E045", plan.where("mesh.cp"), f"Ulysses all-to-all splits heads over cp, but heads={heads}, kv_heads={kv}{per} are not both divisible by cp={cp}", "use method = ring")
            link = plan.cluster.link(plan.mesh.axis("cp").link)
            if link is not None and link.scope == "cluster":
                yield warning("W064", plan.mesh.axis("cp").span, f"Ulysses cp={cp} is placed on {link.name} (scope: cluster): it all-to-alls q, k, v and the attention output of every layer, forward and backward, across nodes, with nothing to hide them behind", "use method = ring (its K/V passes overlap the attention), or put cp on a node-scope link")
    elif "context_parallel" in plan.spans:
        yield warning("W063", plan.where("context_parallel"), "context_parallel options have no effect: the mesh has no cp axis")


# -- experts ----------------------------------------------------------------


@rule
def experts(plan: Plan):
    m, ep = plan.model, plan.ep
    if not m.is_moe:
        if plan.mesh.axis("ep") is not None:
            yield error("E073", plan.where("mesh.ep"), f"the mesh has an ep axis but {m.arch} is a dense model with no experts", "remove ep, or use arch = mixtral")
        return
    if m.experts % ep:
        yield error("E070", plan.where("mesh.ep", "model.experts"), f"experts={m.experts} are not divisible by ep={ep}", f"use an ep that divides {m.experts}")
    if m.top_k > m.experts:
        yield error("E071", plan.where("model.top_k"), f"top_k={m.top_k} is larger than experts={m.experts}")
    if m.dense_layers >= m.layers:
        yield error("E077", plan.where("model.dense_layers"), f"dense_layers={m.dense_layers} leaves none of the {m.layers} layers a mixture of experts",
                    f"use dense_layers < {m.layers}, or a dense arch (llama)")
    if plan.tp > 1 and not plan.tensor_parallel.sequence_parallel:
        # The generated script replicates the experts over tp (it does not split them): with
        # sequence parallelism each tp rank routes its own slice of the sequence.
        yield error("E076", plan.where("tensor_parallel.sequence_parallel", "mesh.tp"),
                    f"{m.arch} with tp={plan.tp} needs sequence parallelism: the experts are replicated over tp, not split, "
                    f"and without it every tp rank holds every token, so each token would be dispatched {plan.tp} times",
                    "set tensor_parallel { sequence_parallel = true }")
    yield from _ep_placement(plan)


def _ep_placement(plan: Plan):
    """W075: ep on a cluster-scope link although its groups lie inside a node, where a
    node-scope link could carry its all-to-all (the layout already keeps them there: moving
    ep to that link passes E034)."""
    c, ax = plan.cluster, plan.mesh.axis("ep")
    link = c.link(ax.link) if ax is not None and ax.size > 1 else None
    if link is None or link.scope != "cluster" or plan.world_size != c.world_size:
        return
    inside = [lk for lk in c.links if lk.scope == "node"]
    if not inside or axis_crossing(plan.mesh, c.gpus_per_node, "ep") is not None:
        return
    best, stride = max(inside, key=lambda lk: lk.bandwidth), plan.mesh.stride("ep")
    yield warning("W075", ax.span,
                  f"ep={ax.size} is placed on {link.name} (scope: cluster) although each of its groups lies inside one node: "
                  f"the expert all-to-all is the heaviest collective of each layer",
                  f"put ep on the node link {best.name} (`ep = {ax.size} on {best.name}`): with stride {stride} a group spans "
                  f"{ax.size * stride} ranks, within the {c.gpus_per_node} GPUs of a node")


# -- training ---------------------------------------------------------------


@rule
def training(plan: Plan):
    t = plan.train
    ranks = plan.data_parallel_size
    expected = t.micro_batch * plan.microbatches * ranks
    if t.global_batch != expected:
        parts = f"micro_batch={t.micro_batch} × microbatches={plan.microbatches} × dp={plan.dp}" + (f" × ep={plan.ep}" if plan.ep > 1 else "")
        yield error("E080", plan.where("train.global_batch", "pipeline.microbatches"), f"global_batch={t.global_batch} but {parts} = {expected}", "ep ranks take their own data like dp ranks" if plan.ep > 1 else f"set global_batch = {expected} or change the micro-batch count")
    z = plan.data_parallel.zero
    if z not in (0, 1, 2, 3):
        yield error("E081", plan.where("data_parallel.zero"), f"zero must be 0, 1, 2 or 3, got {z}", "0 replicates, 1 shards optimizer state, 2 also gradients, 3 also parameters")
    yield from _zero(plan, z)
    if plan.model.dropout > 0 and plan.tp > 1:
        yield error("E100", plan.where("model.dropout", "mesh.tp"), f"dropout = {plan.model.dropout} with tp = {plan.tp} is not supported yet: "
                    "the tp ranks would need a shared dropout RNG", "set dropout = 0, or leave tp out")
    if t.precision == "fp16" and t.loss_scale == "none":
        yield warning("W082", plan.where("train.loss_scale", "train.precision"), "fp16 without loss scaling: small gradients underflow to zero", "use loss_scale = dynamic, or precision = bf16")
    if t.compile and t.recompute in EAGER_POLICIES:
        yield warning("W103", plan.where("train.compile"), f"compile = true with recompute = {t.recompute}: the script runs its blocks eagerly", "selective_ops picks the ops to keep as they are dispatched; selective or full recompute compiles")


def _zero(plan: Plan, z: int):
    """What the generated script cannot honour of a ZeRO stage, and sharding with no one to
    shard over (the group: dp × cp × ep, the ranks that hold the same dense weights)."""
    at = plan.where("data_parallel.zero")
    if z >= 2 and plan.dp * plan.cp * plan.ep == 1:
        yield warning("W089", at, f"zero = {z} over a data-parallel group of one rank: nothing is sharded", "ZeRO shards the model state over the dp ranks: add a dp axis, or use zero = 0")
    shard = plan.data_parallel.shard
    if shard and plan.dp % shard:
        yield error("E078", plan.where("data_parallel.shard"), f"shard = {shard} does not divide dp = {plan.dp}: ZeRO shards over groups of {shard} consecutive dp ranks and replicates over dp / shard",
                    f"use a divisor of {plan.dp}, or leave shard out to shard over every dp rank")
    elif shard and not z:
        yield warning("W079", plan.where("data_parallel.shard"), f"shard = {shard} with zero = 0: every rank holds the whole model state, there is nothing to shard", "set zero = 1, 2 or 3 (zero = 3 with shard is HSDP)")
    if z != 3 and "data_parallel.reshard_after_forward" in plan.spans:
        yield warning("W102", plan.where("data_parallel.reshard_after_forward"), f"reshard_after_forward has no effect with zero = {z}", "only zero = 3 gathers the weights before each unit's forward")


@rule
def init_checkpoint(plan: Plan):
    """The Hugging Face checkpoint a plan starts from (``init = hf("DIR")``): a folder with
    weights and a config.json, each file well-formed and inside it (E048), of this model
    (E049: the first key that differs, a tensor missing, of another shape or not floating)."""
    init = plan.train.init
    found = init and arch.hf.problem(arch.of(plan.model), plan.model, init.resolved_path)
    if found:
        kind, message = found
        yield error("E049" if kind == "model" else "E048", init.span, message, INIT_HINTS[kind])


INIT_HINTS = {  # by the kind of problem arch.hf.problem finds
    "read": "write its folder relative to the plan file",
    "file": "its files are not a Hugging Face checkpoint that can be read safely: download or export it again",
    "model": "start from a checkpoint of this model, or change the model to match it",
}


rule(checkpoint_dir)  # dslc/check/data.py: where the script writes its checkpoints
rule(data_file)  # dslc/check/data.py: reads the files, left out by check_plan(files=False)
