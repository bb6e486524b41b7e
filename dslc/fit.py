"""Whether a plan fits in device memory, and if not, which single change would make it fit
(E090 and its hint), whether its experts alone fit (E091) and ZeRO-3's largest unit (E092):
lint's rules that need the cost model, so they come after :mod:`dslc.cost`.

Every candidate is a plan like a user's: it is proposed only if it passes the same
checks (:func:`dslc.check.check_plan`) — a hint never suggests a plan that lint would
reject, such as a tp that does not divide kv_heads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from .check import check_plan
from .cost import memory as mem
from .cost import offload as off
from .diagnostics import Diagnostic, error
from .ir import MeshAxis, Plan
from .knobs import offload_text
from .units import gib

KNOBS = ("zero", "recompute", "micro_batch", "tp", "pp", "offload")


@dataclass(frozen=True)
class Candidate:
    knob: str  # one of KNOBS
    label: str  # the change, as a plan would write it: "tp = 8 with dp = 1"
    plan: Plan


def variants(plan: Plan) -> Iterator[Candidate]:
    """Single changes that lower memory, smallest change first, before any check: a higher
    zero stage, more recompute, a smaller micro-batch, or a larger tp or pp taken from dp.
    The global batch is kept (fewer samples per micro-batch or fewer dp ranks → more
    micro-batches)."""
    tr, mesh, pipe = plan.train, plan.mesh, plan.pipeline
    if mem.group_size(plan, mem.grad_group(plan, False)) > 1:
        for z in range(plan.data_parallel.zero + 1, 4):
            yield Candidate("zero", f"zero = {z}", replace(plan, data_parallel=replace(plan.data_parallel, zero=z)))
    for train in _more_recompute(plan):
        yield Candidate("recompute", f"recompute = {train.recompute_label}", replace(plan, train=train))
    k = 2
    while tr.micro_batch // k >= 1:
        mb = replace(pipe, microbatches=pipe.microbatches * k)
        yield Candidate("micro_batch", f"micro_batch = {tr.micro_batch // k}",
                        replace(plan, train=replace(tr, micro_batch=tr.micro_batch // k), pipeline=mb))
        k *= 2
    dp = mesh.axis("dp")
    for name in ("tp", "pp"):
        k = 2
        while dp is not None and dp.size % k == 0:
            size = mesh.size(name) * k
            axes = [replace(a, size=a.size // k if a.name == "dp" else size if a.name == name else a.size) for a in mesh.axes]
            axes += [] if mesh.axis(name) else [replace(dp, name=name, size=size)]
            new = replace(pipe, layers_per_stage=None, microbatches=pipe.microbatches * k)
            yield Candidate(name, f"{name} = {size} with dp = {dp.size // k}",
                            replace(plan, mesh=replace(mesh, axes=tuple(axes)), pipeline=new))
            k *= 2
    for o in off.choices(plan):  # to host memory: the optimizer's state, the activations, both
        yield Candidate("offload", offload_text(o), replace(plan, train=replace(tr, offload=o)))


def _more_recompute(plan: Plan) -> list:
    """The recompute policies that keep fewer activation bytes than the plan's, the fewest
    saved first: of selective, full every 2, selective_ops and full, in the order their
    bytes give."""
    tr, m = plan.train, plan.model
    options = [replace(tr, recompute=p, recompute_every=1) for p in ("selective", "selective_ops", "full")]
    options += [replace(tr, recompute="full", recompute_every=2)] * (m.layers >= 2)
    held = {t: mem.layer_activation_bytes(replace(plan, train=t)) for t in options}
    now = mem.layer_activation_bytes(plan)
    return sorted((t for t in options if held[t] < now), key=lambda t: -held[t])


def candidates(plan: Plan) -> Iterator[Candidate]:
    """:func:`variants` that pass every check a user's plan must pass."""
    for c in variants(plan):
        if not any(d.is_error for d in check_plan(c.plan, files=False)):
            yield c


def peak(plan: Plan, settings: mem.Settings = mem.DEFAULT) -> int:
    """Bytes of the worst rank of ``plan`` (a plan that passed the checks)."""
    return max(s.total for s in mem.memory(plan, settings))


def diagnostics(plan: Plan) -> list[Diagnostic]:
    """Every diagnostic of a lowered plan, as ``dslc lint`` reports it: the rules of
    :mod:`dslc.check`, then, for a plan whose shapes are sound, whether it fits (E090)."""
    diags = check_plan(plan)
    if not any(d.is_error for d in diags):
        diags += fit_diagnostics(plan)
    return diags


def fits(plan: Plan, settings: mem.Settings = mem.DEFAULT) -> tuple[bool, int]:
    """Whether the worst rank of ``plan`` fits in its device's memory (E090's test) and what
    it offloads in its nodes' host memory (E093's), and the worst rank's device bytes."""
    stages = mem.memory(plan, settings)
    need = max(s.total for s in stages)
    return need <= plan.cluster.device.memory and host_fits(plan, stages), need


def host_per_node(stages: tuple[mem.StageMemory, ...], gpus_per_node: int) -> int:
    """Host bytes a node holds for what its ranks offload, each rank taken as the worst."""
    return max(s.host_optimizer.total + s.host_activations.total for s in stages) * gpus_per_node


def host_fits(plan: Plan, stages: tuple[mem.StageMemory, ...]) -> bool:
    """A cluster that does not say its host memory (N111) takes any."""
    host = plan.cluster.host_memory
    return host is None or host_per_node(stages, plan.cluster.gpus_per_node) <= host


@dataclass(frozen=True)
class Fixes:
    """For a plan that does not fit: per knob, the smallest change that passes the checks
    and fits (with its peak bytes), and, when none fits, the closest candidate."""

    fits: tuple[tuple[Candidate, int], ...]
    closest: tuple[Candidate, int] | None


def fixes(plan: Plan, settings: mem.Settings = mem.DEFAULT) -> Fixes:
    found: dict[str, tuple[Candidate, int]] = {}
    closest: tuple[Candidate, int] | None = None
    for c in candidates(plan):
        if c.knob in found:
            continue
        ok, need = fits(c.plan, settings)
        if ok:
            found[c.knob] = (c, need)
        elif closest is None or need < closest[1]:
            closest = (c, need)
    return Fixes(tuple(found.values()), closest)


def fit_diagnostics(plan: Plan, settings: mem.Settings = mem.DEFAULT,
                    stages: tuple[mem.StageMemory, ...] | None = None) -> list[Diagnostic]:
    """E090 at the plan when its worst rank needs more than the device memory, with the
    breakdown and, for each of zero, recompute, micro_batch, tp and pp, the smallest change
    that passes the checks and fits, with the memory it would reach (:func:`fixes`)."""
    cap, dev = plan.cluster.device.memory, plan.cluster.device.name
    try:
        stages = stages if stages is not None else mem.memory(plan, settings)
    except ValueError:  # no schedule for these numbers: the pipeline checks report why
        return []
    worst = max(stages, key=lambda s: s.total)
    if worst.total <= cap:
        return host_fit(plan, stages)
    who = f"pipeline stage {worst.stage}" if plan.pp > 1 else "the plan"
    msg = (f"{who} needs {gib(worst.total)} per GPU but {dev} has {gib(cap)}: params "
           f"{gib(worst.params)}, grads {gib(worst.grads)}, optimizer {gib(worst.optimizer)}, activations "
           f"{gib(worst.activations)} ({in_flight(plan, worst)})"
           + (f", unsharded {gib(worst.transient)}" if worst.transient else "")
           + (f", loss chunk {gib(worst.buffers)}" if worst.buffers else "")
           + (f" (the optimizer step's {gib(worst.step_temp)} of temporaries come after the activations are freed)" if worst.step_temp else "")
           + (f"; + {worst.allocator:.0%} for the caching allocator and {gib(worst.context)} of CUDA context"
              if worst.allocator or worst.context else ""))
    found = fixes(plan, settings)
    if found.fits:
        hint = "it fits with any one of: " + ", ".join(f"{c.label} ({gib(need)})" for c, need in found.fits)
    else:
        close = found.closest
        hint = ("no single change of zero, recompute, micro_batch, tp, pp or offload fits"
                + (f"; closest: {close[0].label} ({gib(close[1])})" if close else "") + "; combine them or add GPUs")
    return [error("E090", plan.span, msg, hint), *expert_fit(plan), *unit_fit(plan), *host_fit(plan, stages)]


def host_fit(plan: Plan, stages: tuple[mem.StageMemory, ...]) -> list[Diagnostic]:
    """E093 at the offload block when what a node's ranks offload exceeds its host memory."""
    if host_fits(plan, stages):
        return []
    c, need = plan.cluster, host_per_node(stages, plan.cluster.gpus_per_node)
    worst = max(stages, key=lambda s: s.host_optimizer.total + s.host_activations.total)
    o, a = worst.host_optimizer, worst.host_activations
    msg = (f"offload needs {gib(need)} of host memory per node ({c.gpus_per_node} ranks × {gib(o.total + a.total)}: "
           + ", ".join(f"{k} {gib(v)}" for k, v in (("master weights", o.master), ("optimizer state", o.moments),
                                                     ("gradients", o.grads + o.staging), ("activations", a.activations)) if v)
           + f") but cluster '{c.name}' has {gib(c.host_memory)}")
    return [error("E093", plan.where("train.offload"), msg, "offload less (only the optimizer or the activations), "
                  "shard more (a higher zero stage), or spread the model over more nodes")]


def in_flight(plan: Plan, worst: mem.StageMemory) -> str:
    """What E090's activations count: micro-batches × the stage's layers; interleaved, a
    stage holds v chunks of its layers and what is in flight is chunks (of L/v layers)."""
    n, layers = worst.inflight, worst.layers
    chunks = mem.chunk_layers(plan)[worst.stage]
    if len(chunks) == 1:
        return f"{n} micro-batch{'es' * (n != 1)} in flight × {_layers(layers)}"
    if len(set(chunks)) == 1:
        return f"{n} micro-batch chunks in flight × {_layers(chunks[0])} each: the stage's {_layers(layers)} in {len(chunks)} chunks"
    sizes = ", ".join(map(str, chunks[:-1])) + f" and {chunks[-1]}"
    return f"{n} micro-batch chunks in flight × {layers / len(chunks):g} layers each on average: the stage's {_layers(layers)} in chunks of {sizes}"


def _layers(n: int) -> str:
    return f"{n} layer{'s' * (n != 1)}"


def unit_fit(plan: Plan) -> list[Diagnostic]:
    """E092, beside E090, when ZeRO-3 cannot hold one unit gathered with its gradient:
    sharding does not help there, only splitting the unit (tp, or pp for the outer one)."""
    if plan.data_parallel.zero != 3 or mem.group_size(plan, mem.grad_group(plan, False)) == 1:
        return []
    cap, e = plan.cluster.device.memory, mem.dtype_bytes(plan)
    for stage in range(plan.pp):
        units = mem.zero3_units(plan, stage)
        block, outer = units.largest_block, units.outer
        ends = (("the embeddings", stage == 0), ("the final norm and head", stage == plan.last_stage))  # both on rank 0 in a V
        rest = " and ".join(what for what, here in ends if here)
        name, numel = max((("a block", block), (rest, outer)), key=lambda u: u[1])
        if 2 * numel * e > cap:
            return [error("E092", plan.where("data_parallel.zero"),
                          f"zero = 3 gathers {name} whole on every rank: {gib(numel * e)} of weights and as much gradient "
                          f"(stage {stage}), more than the {gib(cap)} of {plan.cluster.device.name}",
                          "a larger tp splits every unit (a larger pp spreads the embeddings and head over two stages)")]
    return []


def expert_state(plan: Plan, ep: int) -> int:
    """Bytes of the expert parameters, their grads and optimizer state on the worst rank with
    the experts split over ``ep`` ranks: the expert part of :func:`mem.memory`."""
    if ep != plan.ep:  # only the sizes matter here, not the world size or the links
        axes = tuple(a for a in plan.mesh.axes if a.name != "ep") + (MeshAxis("ep", ep, "", plan.mesh.span),)
        plan = replace(plan, mesh=replace(plan.mesh, axes=axes))
    w, g, k = mem.state_bytes_per_param(plan)
    group = mem.group_size(plan, mem.grad_group(plan, True))
    return max(sum(mem.zero_state(sp.expert, group, plan.data_parallel.zero, w, g, k)) for sp in mem.stage_params(plan))


def expert_fit(plan: Plan) -> list[Diagnostic]:
    """E091, beside E090, when the experts of one rank alone do not fit: no change of
    activations or dense layout helps, only more ranks for the experts (ep), a higher zero
    stage, more pipeline stages or smaller experts. The hint names the smallest ep (a divisor
    of the expert count) at which they fit, and what they would need there."""
    m, ep, cap = plan.model, plan.ep, plan.cluster.device.memory
    need = expert_state(plan, ep) if m.is_moe else 0
    if need <= cap:
        return []
    msg = (f"the experts alone need {gib(need)} per GPU, more than the {gib(cap)} of {plan.cluster.device.name}: "
           f"{m.experts // ep} of {m.experts} experts per layer on each rank (ep={ep}), with their gradients and optimizer state")
    sizes = [(d, expert_state(plan, d)) for d in range(ep + 1, m.experts + 1) if m.experts % d == 0]
    fit = next(((d, b) for d, b in sizes if b <= cap), None)
    if fit is not None:
        d, b = fit
        hint = (f"raise ep to {d} (it must divide experts={m.experts}): {m.experts // d} expert{'s' * (d != m.experts)} per layer on each rank, "
                f"{gib(b)} of expert state per GPU")
    else:
        most = f"even ep={m.experts} leaves {gib(sizes[-1][1])} of expert state per GPU" if sizes else "each rank already holds one expert per layer"
        hint = most + ": use more pp stages, a higher zero stage, or smaller experts"
    return [error("E091", plan.where("mesh.ep", "model.experts"), msg, hint)]
