"""``dslc explain``: the estimates of a plan (:mod:`dslc.cost.estimate`) with its fit
diagnostic (E090, :mod:`dslc.fit`), for a person (:func:`render_text`) or a tool
(:func:`to_json`: the same numbers as a JSON-safe dict, no NaN or Infinity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from .. import fit
from ..cost import memory as mem
from ..cost import offload as off
from ..cost.collectives import OVERLAPS, Comm
from ..cost.estimate import Estimate, estimate, route_link
from ..cost.flops import batch_tokens
from ..cost.time import timing
from ..diagnostics import Diagnostic, printable
from ..ir import Data, Plan
from ..knobs import knobs, offload_label
from ..units import count, seconds, si, size

HIDDEN = tuple(o for o in OVERLAPS if o != "exposed")  # overlapped with compute


IMBALANCES = (1.5, 2.0)  # the load imbalances a dropless MoE plan is also costed at


@dataclass(frozen=True)
class Imbalanced:
    """The step at a load imbalance r, for the busiest ep rank."""

    imbalance: float
    step: float  # seconds: its expert FLOPs and ep all-to-all bytes r×
    all_to_all: int  # ep all-to-all bytes per step in its busier direction, r× the uniform payload


@dataclass(frozen=True)
class Routing:
    """The routing the estimate assumes for a mixture of experts."""

    mode: str  # "dropless" | "capacity"
    capacity_factor: float | None
    capacity: int | None  # C: slots per expert per sequence
    slots: int  # token slots per rank per MoE layer per micro-batch (mem.routed_slots)
    all_to_all: int  # ep all-to-all payload per step of the busiest stage's ranks
    imbalance: float  # the one the estimate assumes: 1.0, uniform
    at: tuple[Imbalanced, ...]  # dropless with ep > 1: the step at IMBALANCES


@dataclass(frozen=True)
class Explanation(Estimate):
    diagnostics: tuple[Diagnostic, ...] = ()
    routing: Routing | None = None  # MoE plans only


def explain(plan: Plan, settings: mem.Settings = mem.DEFAULT, topo=None) -> Explanation:
    """:func:`dslc.cost.estimate.estimate` of a checked plan, and E090 if it does not fit."""
    est = estimate(plan, settings, topo)
    diags = tuple(fit.fit_diagnostics(plan, settings, est.memory))
    return Explanation(**{f.name: getattr(est, f.name) for f in fields(Estimate)}, diagnostics=diags, routing=routing(est))


def routing(est: Estimate) -> Routing | None:
    """What a MoE plan's estimate assumes about routing and, when dropless over ep > 1, what
    a load imbalance r costs: the busiest ep rank runs r× the uniform token slots, so its
    expert FLOPs grow r×, and so do the bytes of each of its ep all-to-alls in the busier
    direction (received in the dispatch and in the combine's backward, sent in the combine
    and in the dispatch's backward); everything else is the same, and
    :func:`dslc.cost.time.timing` re-run at r gives the step. With a capacity factor the
    buffers are padded: r drops more tokens but changes no bytes and no time."""
    p, m = est.plan, est.plan.model
    if not m.is_moe:
        return None
    cap = mem.expert_capacity(p)
    a2a = max((sum(c.payload for c in rows if c.axis == "ep" and c.kind == "all_to_all") for rows in est.traffic), default=0)
    at: tuple[Imbalanced, ...] = ()
    if cap is None and p.ep > 1:
        acts = mem.actions(p)
        at = tuple(Imbalanced(r, timing(p, est.topo, replace(est.settings, imbalance=r), est.traffic, acts)[0].step, math.ceil(r * a2a))
                   for r in IMBALANCES)
    return Routing("dropless" if cap is None else "capacity", m.capacity_factor or None, cap, mem.routed_slots(p), a2a,
                   est.settings.imbalance, at)


# ---------------------------------------------------------------------------- text


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]

    def fmt(r: list[str]) -> str:
        cells = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        return ("  " + "  ".join(cells)).rstrip()

    return [fmt(head)] + [fmt(r) for r in rows]


def _routing_lines(ex: Explanation) -> list[str]:
    r, p, m = ex.routing, ex.plan, ex.plan.model
    if r is None:
        return []
    per = "per rank per MoE layer per micro-batch"
    counts = ([f"  under SP each rank all-gathers its per-sequence expert counts ({p.train.micro_batch}×{m.top_k}×{m.experts} int64) "
               "over tp: bookkeeping, not counted"] if p.tp > 1 and p.tensor_parallel.sequence_parallel else [])
    if r.capacity is None:
        sp = "/tp" if p.tp > 1 and p.tensor_parallel.sequence_parallel else ""
        out = ["", "Routing (mixture of experts)",
               f"  dropless, uniform routing assumed (r = {r.imbalance:g}): {r.slots} token slots {per} "
               f"(tokens{sp} × top-{m.top_k})",
               *([f"  the per-expert token counts ({m.experts} int64) all-to-all-exchanged before each dispatch are bookkeeping, not counted"]
                 if p.ep > 1 else []), *counts]
        if r.at:
            tokens = batch_tokens(p)
            out += ["  at a load imbalance r (max/mean tokens per expert, taken as the busiest ep rank's: exact with one expert per rank,",
                    "  an upper bound with more) that rank's expert compute and its all-to-all bytes (received in the dispatch, sent",
                    "  in the combine, the reverse backward) grow r×; the rest of the step is unchanged:"]
            out += _table(["r", "step", "tokens/s", "all-to-all per step"],
                          [[f"{x.imbalance:g}", seconds(x.step), count(tokens / x.step if x.step else 0.0), size(x.all_to_all)]
                           for x in (Imbalanced(r.imbalance, ex.timing.step, r.all_to_all), *r.at)], {1, 2, 3})
        else:
            out.append("  ep = 1: every rank holds all experts, so an imbalance changes no rank's load")
        return out
    return ["", "Routing (mixture of experts)",
            f"  capacity factor {r.capacity_factor:g}: C = {r.capacity} slots per expert per sequence, buffers padded: "
            f"{r.slots} token slots {per} ({m.experts} experts × micro-batch {p.train.micro_batch} × C)",
            "  slots past C are dropped (the token skips the MoE through the residual): an imbalance drops more tokens "
            "but changes no bytes and no time", *counts]


def overview(ex: Explanation) -> list[str]:
    """What the plan is, a line each: its model, cluster, mesh, training and data."""
    p, m, c = ex.plan, ex.plan.model, ex.plan.cluster
    dev = c.device
    mesh = " × ".join(f"{a.name}={a.size} on {a.link}" for a in p.mesh.axes) or "one rank"
    pipe = p.pipeline
    return [
        f"  model    {m.name}{f' ({m.arch})' if m.name != m.arch else ''}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv)"
        + (f" of {m.head_dim}" if m.heads * m.head_dim != m.hidden else "") + f", ffn {m.ffn}"
        + (f", {m.experts} experts top-{m.top_k}" if m.is_moe else "") + (f" + {m.shared_experts} shared" if m.is_moe and m.shared_experts else "")
        + (f", the first {m.dense_layers} layers dense (ffn {m.dense_ffn})" if m.is_moe and m.dense_layers else "") + f", vocab {m.vocab}, seq {m.seq_len}: {count(ex.params.total)} params",
        f"  cluster  {c.name}: {_n(c.nodes, 'node')} × {c.gpus_per_node} {dev.name} ({si(dev.peak_flops, 'FLOP/s')}"
        + (f", fp8 {si(dev.fp8_flops, 'FLOP/s')}" if p.train.float8 and dev.fp8_flops else "") + f", {size(dev.memory)}); "
        + ", ".join(f"{lk.name} {lk.bandwidth / 1e9:g} GB/s ({lk.scope})" for lk in c.links),
        f"  mesh     {mesh} = {p.world_size} ranks",
        f"  train    {p.train.precision}" + (f" with {p.train.float8} float8 GEMMs" if p.train.float8 else "") + f", zero {p.data_parallel.zero}"
        + (f" (HSDP: shards over {p.data_parallel.shard} dp ranks, {p.dp // p.data_parallel.shard} replicas)" if p.data_parallel.zero and p.data_parallel.hsdp(p.dp) else "")
        + f", recompute {p.train.recompute_label}"
        + (", sequence parallel" if p.tensor_parallel.sequence_parallel and p.tp > 1 else "")
        + (f", cp {p.context_parallel.method}" if p.cp > 1 else "")
        + (f", offload {offload_label(p.train.offload)} to host memory" if offload_label(p.train.offload) else "")
        + (f"; pipeline {pipe.schedule}" + (f" (v={pipe.virtual_stages})" if pipe.virtual_stages > 1 else "") if p.pp > 1 else "")
        + f"; {_n(p.microbatches, 'micro-batch')} of {p.train.micro_batch} × {m.seq_len} tokens",
        f"  data     {_data(p.train.data)}"
        + (f"; validation {_data(p.train.eval.data)}, {_n(p.train.eval.batches, 'global batch')} "
           + (f"every {p.train.eval.every} steps and " if p.train.eval.every else "") + "after the last" if p.train.eval else ""),
    ]


def step_line(ex: Explanation) -> str:
    t = ex.timing
    return (f"step {seconds(t.step)} · {count(t.tokens_per_s)} tokens/s · MFU {t.mfu:.1%} (HFU {t.hfu:.1%}) · "
            f"{si(ex.flops.model, 'FLOP')} model, {si(ex.flops.hardware, 'FLOP')} with recompute per step")


def summary(ex: Explanation) -> list[str]:
    """The report in a few lines (the language server's hover of a plan): what the plan is,
    the memory of each stage's worst rank against the device's, and the step."""
    p, dev = ex.plan, ex.plan.cluster.device
    worst = max(ex.memory, key=lambda s: s.total)
    stages = ", ".join(size(s.total) for s in ex.memory) if len(ex.memory) <= 8 else f"at most {size(worst.total)} (stage {worst.stage})"
    fits = (f"fits, {size(dev.memory - worst.total)} to spare" if worst.total <= dev.memory
            else f"does NOT fit: stage {worst.stage} needs {size(worst.total)}")
    return [*overview(ex), f"  memory   per GPU, worst rank of {'each stage' if p.pp > 1 else 'the plan'}: {stages} of {size(dev.memory)}: {fits}",
            f"  time     {step_line(ex)}"]


def render_text(ex: Explanation) -> str:
    """The report: what the plan is, memory per stage, traffic, busiest links, time."""
    p, t, dev = ex.plan, ex.timing, ex.plan.cluster.device
    pipe = p.pipeline
    out = [f"plan {p.name} ({p.file})", *overview(ex), "", f"Memory per GPU, worst rank of each pipeline stage (device: {size(dev.memory)})"]
    unsharded = any(s.transient for s in ex.memory)  # ZeRO-2/3: gathered weights, unsharded grads
    ring = any(s.ring for s in ex.memory)  # ring attention's accumulators and blocks in flight
    rows = [[str(s.stage), str(s.layers), size(s.params), size(s.grads), size(s.optimizer), size(s.activations)]
            + [size(s.transient)] * unsharded + [size(s.ring)] * ring
            + [size(s.buffers), size(s.step_temp), f"{s.inflight}", size(s.allocated), size(s.reserved), size(s.total),
               "yes" if s.total <= dev.memory else "NO"] for s in ex.memory]
    heads = (["stage", "layers", "params", "grads", "optimizer", "activations"] + ["unsharded"] * unsharded + ["ring"] * ring
             + ["loss chunk", "step temps", "in flight", "allocated", "reserved", "process", "fits"])
    out += _table(heads, rows, set(range(1, len(heads) - 1)))
    w, g, k = mem.state_bytes_per_param(p)
    s0 = ex.memory[0]
    out.append(f"  bytes per parameter {w}+{g}+{k} (weights+grads+optimizer) before ZeRO; activations with "
               + ("the paper's stored attention scores" if ex.settings.attention == "paper" else "fused attention (no s² scores)"))
    out.append("  allocated: the larger of the backward's peak (states + activations" + (" + unsharded" if unsharded else "") + (" + ring" if ring else "")
               + " + loss chunk) and the optimizer step's (states + step temps);"
               + (f" reserved: +{s0.allocator:.0%} for the caching allocator; process: + {size(s0.context)} of CUDA context, "
                  "cuBLAS and NCCL buffers" if s0.context or s0.allocator else " no allocator or context allowance on this device"))
    if unsharded:
        out.append("  unsharded: the most " + ("gathered weights and " if p.data_parallel.zero == 3 else "")
                   + "unsharded gradients held at once" + (" (accumulated over the micro-batches)" if p.microbatches > 1 else ""))
    if ring:
        out.append("  ring: ring attention's fp32 accumulators and the K, V blocks in flight, one layer at a time "
                   "(each block a fused attention call: no score tile)")
    for d in ex.diagnostics:
        out += [f"  error[{d.code}]: {d.message}", f"  help: {d.hint}"]
    out += _offload_lines(ex)
    out += ["", "Traffic per GPU per step (the busiest stage's ranks; payload = tensor bytes, wire = NCCL ring bytes)"]
    trows = [[r.comm.axis, r.comm.kind, r.comm.what, str(r.stage) if p.pp > 1 else "-", f"{r.comm.calls}", size(r.comm.payload), size(r.comm.wire),
              r.link, seconds(r.seconds), "overlapped" if r.comm.overlap in HIDDEN else "exposed"]
             for r in sorted(ex.rows, key=lambda r: -r.seconds)]
    out += _table(["axis", "collective", "what", "stage", "calls", "payload", "wire", "link", "time", ""], trows, {4, 5, 6, 8}) if trows else ["  (none: a single rank)"]
    if ex.busiest:
        out += ["", "Busiest link of each type"]
        out += _table(["link", "edge", "per step", "busy"], [[b.link, f"{_vertex(b.edge[0])} ↔ {_vertex(b.edge[1])}", size(b.bytes), seconds(b.seconds)] for b in ex.busiest], {2, 3})
    out += [
        "",
        "Time per step",
        f"  {t.rates.summary}",
        f"  one layer forward per micro-batch: GEMMs {seconds(t.kernels.gemm)}, attention {seconds(t.kernels.attention)}, "
        f"elementwise {seconds(t.kernels.elementwise)}",
        f"  per chunk per micro-batch (with exposed tp/cp/ep collectives): forward {_spread(t.chunks, 0)}, backward {_spread(t.chunks, 1)}"
        + (f", weight-grad {_spread(t.chunks, 2)}" if t.t_w else "") + (f"; pp send {seconds(t.t_comm)}" if p.pp > 1 else ""),
        ((f"  pipeline {seconds(t.pipeline)} ({pipe.schedule}" + (f", {pipe.virtual_stages} chunks per stage" if pipe.virtual_stages > 1 else "")
          + f", bubble {t.bubble_fraction:.3f} of compute), ") if p.pp > 1 else f"  forward and backward {seconds(t.pipeline)}, ")
        + f"exposed step communication {seconds(t.exposed)}, overlapped {seconds(t.overlapped)}, optimizer step {seconds(t.optimizer)}"
        + (f", offload {seconds(t.offload.added)} (host step {seconds(t.offload.host_step)}, copies exposed {seconds(t.offload.exposed)})"
           if offload_label(p.train.offload) else ""),
        f"  {step_line(ex)}",
        "  assumed exposed: tp, Ulysses and ep collectives, pp sends, ZeRO param all-gathers after the step, the optimizer step;",
        "  overlapped: dp grad reduction with the last backward, ZeRO-3 gathers by prefetch, ring-attention K/V passes with attention"
        + (", ep's forward dispatch with the shared experts" if ex.plan.ep > 1 and ex.plan.model.shared_experts else ""),
    ] + _routing_lines(ex)
    return "\n".join(out) + "\n"


def _offload_lines(ex: Explanation) -> list[str]:
    """Host memory per rank and node, and the PCIe bytes each way, of an offloading plan."""
    p = ex.plan
    if not offload_label(p.train.offload):
        return []
    c, lk = p.cluster, off.link(p)
    rows = [[str(s.stage), size(o.master), size(o.moments), size(o.grads + o.staging), size(a.activations), size(o.total + a.total),
             size((o.total + a.total) * c.gpus_per_node), size(o.d2h + a.d2h), size(o.h2d + a.h2d)]
            for s, o, a in ((s, s.host_optimizer, s.host_activations) for s in ex.memory)]
    t = ex.timing.offload
    return ["", f"Host memory (train {{ offload {offload_label(p.train.offload)} }}; node: {size(c.host_memory) if c.host_memory else 'not given'})",
            *_table(["stage", "master", "moments", "grads", "activations", "per rank", "per node", "to host", "to device"], rows, set(range(1, 9))),
            f"  per step over {lk.name} ({lk.bandwidth / 1e9:g} GB/s a direction per GPU): {seconds(t.d2h)} to the host, {seconds(t.h2d)} back, "
            f"{seconds(t.exposed)} of them exposed; the optimizer step on the host {seconds(t.host_step)}",
            "  " + "; ".join(f"{k}: {', '.join(v)}" for k, v in _windows(p).items() if v)]


def _windows(p: Plan) -> dict[str, list[str]]:
    """What of an offloading plan's copies compute hides, and what it does not."""
    o, buckets = p.train.offload, bool(mem.grad_group(p, False))
    out: dict[str, list[str]] = {"hidden": [], "exposed": []}
    if o.optimizer:
        out["hidden" if buckets else "exposed"].append("the gradients " + ("behind the last backward, each bucket's once reduced" if buckets else "out after the backward"))
        out["exposed"].append("the weights back after the host step, before the device runs on")
    if o.activations:
        out["hidden"].append("the activations behind the next block's forward and the later block's backward")
        out["exposed"].append("each forward's last block, out and back")
    return out


def _spread(chunks: tuple[tuple[float, float, float], ...], i: int) -> str:
    """One chunk's time, or the lightest and heaviest chunk's when they differ."""
    lo, hi = min(c[i] for c in chunks), max(c[i] for c in chunks)
    return seconds(hi) if hi - lo <= 1e-9 * hi else f"{seconds(lo)}–{seconds(hi)}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("es" if noun.endswith("h") else "s") * (count != 1)


def _vertex(v: tuple) -> str:
    return {"gpu": lambda: f"gpu {v[1]}", "hub": lambda: f"{v[1]} node {v[2]}", "nic": lambda: f"{v[1]} NIC node {v[2]}",
            "switch": lambda: f"{v[1]} switch"}[v[0]]()


# ---------------------------------------------------------------------------- json


def _safe(x):
    """JSON-safe copy: non-finite floats become None (``json.dumps(allow_nan=False)`` passes)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_safe(v) for v in x]
    return x


def _row(c: Comm, stage: int, link: str, secs: float) -> dict:
    return {"axis": c.axis, "collective": c.kind, "calls_per_step": c.calls, "payload_bytes_per_step": c.payload,
            "wire_bytes_per_rank_per_step": c.wire, "link": link, "seconds_per_step": secs, "what": c.what, "stage": stage,
            "group_size": c.group, "bytes_per_call": c.bytes_per_call, "overlap": c.overlap}


def to_json(ex: Explanation) -> dict:
    """The report for tools. Bytes are integers, per GPU and per step unless named otherwise."""
    p, t, pr = ex.plan, ex.timing, ex.params
    topo = ex.topo
    by_stage = [[_row(c, s, route_link(topo, c), c.seconds(topo))
                 for c in rows] for s, rows in enumerate(ex.traffic)]
    doc = {
        "plan": p.name,
        "file": p.file,
        "world_size": p.world_size,
        "layout": knobs(p),  # the settings dslc search varies, as the plan writes them
        "mesh": [{"axis": a.name, "size": a.size, "link": a.link} for a in p.mesh.axes],
        "device": p.cluster.device.name,
        "params": {"total": pr.total, "embedding": pr.embedding, "positions": pr.positions, "per_layer": pr.layer,
                   "experts_per_layer": pr.experts, "final_norm": pr.final_norm, "head": pr.head,
                   "dense_layers": pr.dense_layers, "per_dense_layer": pr.dense_layer},  # a dense prefix (per_layer: the MoE ones)
        "device_memory": p.cluster.device.memory,
        "memory": [{"stage": s.stage, "params": s.params, "grads": s.grads, "optimizer": s.optimizer, "activations": s.activations,
                    "unsharded": s.transient, "loss_chunk": s.buffers, "ring_attention": s.ring, "optimizer_temporaries": s.step_temp,
                    "allocated": s.allocated, "reserved": s.reserved, "total": s.total, "layers": s.layers, "inflight": s.inflight, "fits": s.total <= p.cluster.device.memory} for s in ex.memory],
        "flops_per_step": ex.flops.model,
        "hardware_flops_per_step": ex.flops.hardware,
        "traffic": [_row(r.comm, r.stage, r.link, r.seconds) for r in ex.rows],
        "traffic_by_stage": by_stage,
        "busiest_links": [{"link": b.link, "edge": [list(b.edge[0]), list(b.edge[1])], "bytes_per_step": b.bytes,
                           "bandwidth": b.bandwidth, "seconds_per_step": b.seconds} for b in ex.busiest],
        "pipeline": {"schedule": p.pipeline.schedule, "stages": p.pp, "virtual_stages": p.pipeline.virtual_stages,
                     "microbatches": p.microbatches, "bubble_fraction": t.bubble_fraction, "makespan_s": t.pipeline,
                     "peak_inflight": list(ex.peak_inflight)},
        "time": {"peak_flops": t.peak, "calibration": {"row": t.rates.row, "gemm": t.rates.gemm, "gemm_half": t.rates.gemm_half,
                                                        "attention": t.rates.attention, "bandwidth": t.rates.bandwidth, "source": t.rates.source},
                 "layer_forward_s": {"gemm": t.kernels.gemm, "attention": t.kernels.attention, "elementwise": t.kernels.elementwise},
                 "t_forward_s": t.t_f, "t_backward_s": t.t_b, "t_weight_grad_s": t.t_w,
                 "chunks_s": [{"forward": f, "backward": b, "weight_grad": w} for f, b, w in t.chunks],
                 "t_p2p_s": t.t_comm, "exposed_comm_s": t.exposed, "overlapped_comm_s": t.overlapped, "optimizer_s": t.optimizer},
        "step_time_s": t.step,
        "tokens_per_s": t.tokens_per_s,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "diagnostics": [{"code": d.code, "message": d.message, "hint": d.hint} for d in ex.diagnostics],
        "routing": _routing_json(ex.routing),
        "offload": _offload_json(ex),
    }
    return _safe(doc)


def _data(d: Data) -> str:
    """The data as the plan writes it: synthetic, text("f.txt"), tokens("f.bin"), or a
    blend's parts with their weights summing to 1."""
    if d.kind == "blend":
        return "blend " + " + ".join(f"{w:.3g} {_data(s)}" for w, s in d.parts)
    if d.kind == "synthetic":
        return d.kind
    return f'{d.kind}("{printable(d.path)}"' + (f", dtype = {d.dtype})" if d.dtype else ")")


def _routing_json(r: Routing | None) -> dict | None:
    """MoE plans: mode "dropless" | "capacity", capacity_per_sequence C (null when
    dropless), token slots per rank per MoE layer per micro-batch, the imbalance assumed
    (1.0) and, dropless over ep > 1, the step and the busiest rank's ep bytes at r = 1.5 and 2."""
    if r is None:
        return None
    return {"mode": r.mode, "capacity_factor": r.capacity_factor, "capacity_per_sequence": r.capacity,
            "slots_per_rank_per_layer_per_microbatch": r.slots, "all_to_all_bytes_per_step": r.all_to_all,
            "imbalance": r.imbalance, "at_imbalance": [{"imbalance": x.imbalance, "step_time_s": x.step,
                                                        "all_to_all_bytes_per_step": x.all_to_all} for x in r.at]}


def _offload_json(ex: Explanation) -> dict | None:
    """Offloading plans: per stage the host bytes held (master weights, optimizer moments,
    gradients, staging buffers, activations) and copied each way per step, per rank; the
    node's host memory; the seconds the copies and the host's optimizer step take."""
    if not offload_label(ex.plan.train.offload):
        return None
    t = ex.timing.offload
    stages = [{"stage": s.stage, **{f"{k}_host_bytes": getattr(o, k) for k in ("master", "moments", "grads", "staging")},
               "activations_host_bytes": a.activations, "host_bytes_per_rank": o.total + a.total, "d2h_bytes_per_step": o.d2h + a.d2h,
               "h2d_bytes_per_step": o.h2d + a.h2d} for s, o, a in ((s, s.host_optimizer, s.host_activations) for s in ex.memory)]
    return {"optimizer": bool(ex.plan.train.offload.optimizer), "activations": bool(ex.plan.train.offload.activations),
            "link": off.link(ex.plan).name, "host_memory_per_node": ex.plan.cluster.host_memory, "stages": stages,
            "d2h_s": t.d2h, "h2d_s": t.h2d, "exposed_s": t.exposed, "host_step_s": t.host_step}
