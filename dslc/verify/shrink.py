"""The shrunk plan that ``dslc verify`` runs, and its serial twin.

:func:`shrink` keeps what decides *how* a plan computes — its mesh axes in their order,
the schedule and virtual stages, the ZeRO stage, HSDP, the context-parallel method, the
experts and their router, the recompute policy, the optimizer and its schedule, tying,
the architecture — and makes everything that only decides *how much* tiny: widths chosen
so that every divisibility rule of :mod:`dslc.check` still holds, a few layers, a short
sequence, one or two sequences a micro-batch, fp32, synthetic data, on one CPU node of
gloo processes. A mesh larger than the processes allowed becomes the largest sub-mesh of
the same axes that fits (each degree a divisor of the plan's); where that leaves ZeRO no
ranks to shard over, the notes say so and how many processes would keep it, and
:func:`describe` names no ZeRO stage: the report describes what ran.

The shrunk model is small whatever the plan, within the language's bounds: every dimension
that scales its parameters is bounded here — the width by the processes (at most
:data:`MAX_PROCS`: tp and cp decide the heads), the layers by pp × virtual stages (at most
:data:`MAX_VIRTUAL`), `full every N` (N at most :data:`MAX_EVERY`) and one dense layer, the
routed experts (at most :data:`MAX_EXPERTS` beyond one per ep rank) and the shared ones
(:data:`MAX_SHARED`), the vocab (:data:`VOCAB`, rounded up to tp) — so that it has at most
:data:`MAX_PARAMS` parameters (tests/test_verify.py holds it over the extremes of every
bound). A plan within those keeps them as it writes them. :func:`serial_twin` is the
same model and training on one process: no axes, the same global batch, as many
micro-batches as the global batch holds (golden tests/golden/*_serial plans are made so).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from ..catalog import DEVICES
from ..codegen.grads import zero_stage
from ..ir import Cluster, Data, DataParallel, Link, Mesh, Model, Pipeline, Plan
from ..units import divisors

LINK = "shm"  # every axis on one node link: the processes talk gloo through shared memory
# which axes a shrunk mesh keeps first when it cannot keep all: the pipeline and the kernels
# of tp, cp and ep are what a layout gets wrong; dp is the plainest
IMPORTANCE = {"pp": 5, "tp": 4, "cp": 3, "ep": 3, "dp": 1}
HEAD_DIM = 8  # even: RoPE rotates pairs
SEQ_MIN = 16
VOCAB = 128
MAX_PROCS = 16  # CPU processes a verify may run (--max-procs): the width grows with tp and cp
MAX_VIRTUAL = 8  # interleaved_1f1b's virtual stages kept: the layers grow with pp × virtual stages
MAX_EVERY = 4  # `full every N` kept up to N: the layers grow with it
MAX_EXPERTS = 8  # routed experts kept (more only to give each ep rank one)
MAX_SHARED = 2  # shared experts kept
MAX_PARAMS = 2**24  # parameters of a shrunk model at most (about 16.8M, 64 MiB in fp32)


@dataclass(frozen=True)
class Shrunk:
    """The plan to run, its serial twin, and what was changed, in sentences for the report."""

    plan: Plan
    serial: Plan
    notes: tuple[str, ...]


def shrink(plan: Plan, max_procs: int = 8, steps: int = 3) -> Shrunk:
    """``plan`` made tiny (see the module docstring), with at most ``max_procs`` processes
    (at most :data:`MAX_PROCS`), training ``steps`` steps."""
    if not 1 <= max_procs <= MAX_PROCS:
        raise ValueError(f"max_procs must be between 1 and {MAX_PROCS}, got {max_procs}")
    notes: list[str] = []
    degrees = sub_mesh({a.name: a.size for a in plan.mesh.axes}, max_procs)
    reduced = [f"{a.name} {a.size} → {degrees[a.name]}" for a in plan.mesh.axes if degrees[a.name] != a.size]
    if reduced:
        notes.append(f"the mesh ({plan.world_size} ranks) does not fit in {max_procs} processes: "
                     + ", ".join(reduced) + f" ({math.prod(degrees.values())} processes)")
    mesh, dpo = _data_layout(plan, degrees)
    if dpo.shard != plan.data_parallel.shard:
        notes.append(f"HSDP shard {plan.data_parallel.shard} → {dpo.shard} with dp {degrees['dp']}")
    if zero_stage(plan) and not zero_stage(replace(plan, mesh=mesh, data_parallel=dpo)):
        notes.append(_zero_not_run(plan, max_procs))
    size = {n: degrees.get(n, 1) for n in ("dp", "tp", "pp", "cp", "ep")}
    world = mesh.world_size

    pl = plan.pipeline
    v = min(pl.virtual_stages, MAX_VIRTUAL) if size["pp"] > 1 else 1
    if size["pp"] > 1 and v != pl.virtual_stages:
        notes.append(f"virtual stages {pl.virtual_stages} → {v}")
    every = min(plan.train.recompute_every, MAX_EVERY)
    if every != plan.train.recompute_every:
        notes.append(f"recompute full every {plan.train.recompute_every} → every {every}")
    schedule = pl.schedule if size["pp"] > 1 or pl.schedule != "interleaved_1f1b" else "1f1b"
    if schedule != pl.schedule:
        notes.append(f"schedule {pl.schedule} → {schedule}: the pp axis was left out")
    split = _layers_per_stage(pl.layers_per_stage, size["pp"] * v) if size["pp"] > 1 else None
    model = _model(plan, size, v, split, every, notes)
    tp_opts = plan.tensor_parallel
    if tp_opts.sequence_parallel and size["tp"] == 1:
        tp_opts = replace(tp_opts, sequence_parallel=False)
        notes.append("sequence parallel left out with the tp axis")

    micro = min(plan.train.micro_batch, 2)
    m = _microbatches(schedule, size["pp"], pl.microbatches)
    pipeline = replace(pl, schedule=schedule, virtual_stages=v, microbatches=m, layers_per_stage=split)

    train = replace(_train(plan, steps, micro, micro * m * size["dp"] * size["ep"], notes), recompute_every=every)
    cluster = cpu_cluster(world, plan.cluster.span)
    small = replace(plan, name=f"{plan.name}_verify", model=model, cluster=cluster, mesh=mesh, tensor_parallel=tp_opts,
                    data_parallel=dpo, pipeline=pipeline, train=train)
    return Shrunk(small, serial_twin(small), tuple(notes))


def serial_twin(plan: Plan) -> Plan:
    """The same model and training on one process, computing the same thing: no axes,
    the same global batch in global_batch / micro_batch micro-batches, recompute none
    (the plainest computation of the model), ZeRO and the axes' options off."""
    t = plan.train
    m = t.global_batch // t.micro_batch
    pipeline = Pipeline("1f1b", 1, m, None, None)
    return replace(
        plan, name=f"{plan.name}_serial", cluster=cpu_cluster(1, plan.cluster.span), mesh=Mesh((), plan.mesh.span),
        tensor_parallel=replace(plan.tensor_parallel, sequence_parallel=False),
        data_parallel=replace(plan.data_parallel, zero=0, shard=0, reshard_after_forward=True),
        pipeline=pipeline, context_parallel=replace(plan.context_parallel, span=None),
        train=replace(t, recompute="none", recompute_every=1), spans={},
    )


def cpu_cluster(processes: int, span) -> Cluster:
    """One node of ``processes`` CPU processes joined by one shared-memory link (as the
    golden clusters of tests/golden/clusters.plan)."""
    link = Link(LINK, "node", 10e9, 10e-6, span)
    return Cluster(f"cpu{processes}", 1, processes, DEVICES["cpu"], (link,), span)


def sub_mesh(sizes: dict[str, int], limit: int) -> dict[str, int]:
    """The degrees of the largest sub-mesh of ``sizes`` (axis → degree) with at most
    ``limit`` processes: each degree a divisor of the plan's; most axes kept (above 1),
    the more important first (:data:`IMPORTANCE`), then the most processes, then the
    evenest reduction (the smallest largest factor any axis lost)."""
    if math.prod(sizes.values()) <= limit:
        return dict(sizes)
    names = list(sizes)
    best, best_key = None, None
    for choice in itertools.product(*(divisors(sizes[n]) for n in names)):
        n = math.prod(choice)
        if n > limit:
            continue
        kept = [name for name, d in zip(names, choice) if d > 1]
        losses = [math.log(sizes[name] / d) for name, d in zip(names, choice)]
        key = (len(kept), sum(IMPORTANCE[k] for k in kept), n, -max(losses), -sum(losses))
        if best_key is None or key > best_key:
            best, best_key = dict(zip(names, choice)), key
    return best


def _data_layout(plan: Plan, degrees: dict[str, int]) -> tuple[Mesh, DataParallel]:
    """The mesh of the sub-mesh ``degrees`` (every axis on the one link, the axes cut to 1
    left out) and the data-parallel options on it (HSDP's shard group scaled with dp)."""
    mesh = Mesh(tuple(replace(a, size=degrees[a.name], link=LINK) for a in plan.mesh.axes if degrees[a.name] > 1), plan.mesh.span)
    dpo = plan.data_parallel
    if dpo.hsdp(plan.dp):
        dpo = replace(dpo, shard=_shard(dpo.shard, plan.dp, degrees.get("dp", 1)))
    return mesh, dpo


def _zero_not_run(plan: Plan, max_procs: int) -> str:
    """The note for a plan whose ZeRO the shrunk mesh leaves no ranks to shard over (dp,
    or HSDP's shard group, cp and ep each of one rank: the script runs no ZeRO, and
    :func:`describe` names none), with the fewest processes whose sub-mesh keeps it: the
    axes kept for the pipeline and the kernels are not traded for it."""
    note = f"ZeRO-{plan.data_parallel.zero} not run: its shard group on the shrunk mesh is one rank, nothing to shard"
    sizes = {a.name: a.size for a in plan.mesh.axes}
    for limit in range(max_procs + 1, MAX_PROCS + 1):
        mesh, dpo = _data_layout(plan, sub_mesh(sizes, limit))
        if zero_stage(replace(plan, mesh=mesh, data_parallel=dpo)):
            return note + f" (--max-procs {limit} keeps it)"
    return note


def _shard(shard: int, dp: int, new_dp: int) -> int:
    """An HSDP shard group for ``new_dp`` dp ranks: scaled with dp, a divisor of it, and
    smaller than it where dp ≥ 2 (shard groups and replicas both)."""
    if new_dp == dp:
        return shard
    want = max(1, shard * new_dp // dp)
    fits = [d for d in divisors(new_dp) if d <= want and (d < new_dp or new_dp == 1)]
    return max(fits) if fits else 1


def _microbatches(schedule: str, pp: int, plan_m: int) -> int:
    """The fewest micro-batches that keep the plan's structure: one if it has one, else
    two, and as the schedule needs (≥ pp; a multiple of pp for interleaved_1f1b; ≥ 2·pp for
    dualpipe_v)."""
    m = 1 if plan_m == 1 else 2
    if pp > 1 and schedule != "gpipe":
        m = max(m, 2 * pp if schedule == "dualpipe_v" else pp)
    if pp > 1 and schedule == "interleaved_1f1b":
        m = -(-m // pp) * pp
    return m


def _layers_per_stage(split: tuple[int, ...] | None, chunks: int) -> tuple[int, ...] | None:
    """An explicit split kept in shape: one layer a chunk, none where the plan's first or
    last chunk has none (the only chunks that may be empty)."""
    if split is None:
        return None
    out = [1] * chunks
    if split[0] == 0:
        out[0] = 0
    if split[-1] == 0:
        out[-1] = 0
    if len(split) == chunks:  # the same chunks: keep the empty ones where they are
        out = [0 if n == 0 else 1 for n in split]
    return tuple(out)


def _model(plan: Plan, size: dict[str, int], v: int, split, every: int, notes: list[str]) -> Model:
    m, tp, cp = plan.model, size["tp"], size["cp"]
    ulysses = cp > 1 and plan.context_parallel.method == "ulysses"
    kv = math.lcm(2, tp * (cp if ulysses else 1))  # split over tp, then (Ulysses) over cp; 2 at least
    heads = kv * (2 if m.kv_heads < m.heads else 1)  # grouped-query attention kept
    hidden = heads * HEAD_DIM
    head_dim = HEAD_DIM if m.heads * m.head_dim == m.hidden else HEAD_DIM + 4  # an explicit head_dim kept
    if cp > 1 and plan.context_parallel.method == "ring" and plan.context_parallel.load_balance:
        chunks = 2 * cp
    else:
        chunks = cp
    unit = math.lcm(chunks, cp * tp)  # seq_len / cp divisible by tp for sequence parallel
    seq = unit * -(-SEQ_MIN // unit)
    dense_layers = min(m.dense_layers, 1)
    if split is not None:
        layers = sum(split)
    else:
        layers = max(2, size["pp"] * v, dense_layers + 1, every)
    ffn = hidden if m.is_moe else 2 * hidden
    dense_ffn = 2 * hidden if m.dense_ffn != m.ffn else ffn
    vocab = tp * -(-VOCAB // tp)
    if m.dropout:
        notes.append(f"dropout {m.dropout} → 0: the layouts draw their masks differently")
    experts, top_k, shared = _experts(m, size["ep"], notes)
    return replace(
        m, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn, dense_ffn=dense_ffn,
        vocab=vocab, seq_len=seq, max_positions=seq, dropout=0.0, dense_layers=dense_layers,
        experts=experts, top_k=top_k, shared_experts=shared,
    )


def _experts(m: Model, ep: int, notes: list[str]) -> tuple[int, int, int]:
    """(experts, top_k, shared experts) of the shrunk model: the plan's up to
    :data:`MAX_EXPERTS` routed (a multiple of ``ep``, one a rank at least) and
    :data:`MAX_SHARED` shared; top_k as the plan's, below the experts if it is there."""
    if not m.is_moe:
        return m.experts, m.top_k, m.shared_experts
    experts, top_k, shared = m.experts, m.top_k, min(m.shared_experts, MAX_SHARED)
    if experts > MAX_EXPERTS:
        experts = ep * max(1, MAX_EXPERTS // ep)
        top_k = min(top_k, experts if top_k == m.experts else max(1, experts - 1))
        notes.append(f"experts {m.experts} → {experts}" + (f", top_k {m.top_k} → {top_k}" if top_k != m.top_k else ""))
    if shared != m.shared_experts:
        notes.append(f"shared experts {m.shared_experts} → {shared}")
    return experts, top_k, shared


def _train(plan: Plan, steps: int, micro: int, global_batch: int, notes: list[str]):
    t = plan.train
    if t.precision != "fp32":
        notes.append(f"precision {t.precision} run in fp32: the 1e-5 bound is fp32's (the golden tests check the mixed-precision rules)")
    if t.float8:  # fp8 rounding tips over where a layout sums in another order: not 1e-5
        notes.append(f"float8 {t.float8} left out: the 1e-5 bound is fp32's (the golden tests check float8's scales)")
    if t.data.kind != "synthetic":
        notes.append(f"data {t.data.kind} replaced by synthetic tokens")
    dropped = [what for what, there in (("checkpoint", t.checkpoint), ("init = hf(...)", t.init), ("eval", t.eval)) if there]
    if dropped:
        notes.append(", ".join(dropped) + " left out")
    warmup = min(t.lr_schedule.warmup, 1)
    schedule = replace(t.lr_schedule, warmup=warmup, decay_steps=steps)
    return replace(
        t, steps=steps, micro_batch=micro, global_batch=global_batch, precision="fp32", lr_schedule=schedule,
        data=Data("synthetic", None, None, t.data.span), checkpoint=None, init=None, eval=None,
        timeout=min(t.timeout, 120.0), compile=None, float8=None,
    )


def describe(plan: Plan) -> str:
    """``dp 2 × pp 2 × tp 2, interleaved_1f1b (v 2, 4 micro-batches), zero 1``: the layout."""
    axes = " × ".join(f"{a.name} {a.size}" for a in plan.mesh.axes) or "one process"
    pl, m = plan.pipeline, plan.model
    parts = [axes]
    if plan.pp > 1:
        parts.append(f"{pl.schedule} (" + (f"v {pl.virtual_stages}, " if pl.virtual_stages > 1 else "")
                     + f"{pl.microbatches} micro-batches)")
    if zero_stage(plan):  # as the script runs it: none without ranks to shard over
        parts.append(f"zero {plan.data_parallel.zero}" + (f" (HSDP shard {plan.data_parallel.shard})" if plan.data_parallel.hsdp(plan.dp) else ""))
    if plan.tensor_parallel.sequence_parallel:
        parts.append("sequence parallel")
    if plan.cp > 1:
        cpo = plan.context_parallel
        parts.append(cpo.method + (" load-balanced" if cpo.method == "ring" and cpo.load_balance else ""))
    if m.is_moe:
        parts.append(f"{m.experts} experts top-{m.top_k}")
    if plan.train.recompute != "none":
        parts.append(f"recompute {plan.train.recompute_label}")
    dims = f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads, seq {m.seq_len}, vocab {m.vocab}"
    return ", ".join(parts) + f"; {dims}"


__all__ = ["Shrunk", "cpu_cluster", "describe", "serial_twin", "shrink", "sub_mesh"]
