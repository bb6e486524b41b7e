"""``dslc explain``: time one step from the estimates, and report it for a person or a tool.

:func:`explain` runs every estimate of :mod:`dslc.estimate` on the plan's
:class:`~dslc.topology.Topology` and times the step (:func:`timing`: chunk compute from
FLOPs at a stated efficiency of the device peak, the exposed collectives, the pipeline
schedule simulated by :mod:`dslc.schedule`); :func:`render_text` prints the report,
:func:`to_json` gives the same numbers as a JSON-safe dict (no NaN or Infinity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import ceil

from . import estimate as est
from . import schedule as sched
from . import traffic
from .diagnostics import Diagnostic
from .ir import Plan
from .topology import BusiestLink, Comm, Topology

GiB = 2**30


# ---------------------------------------------------------------------------- time


@dataclass(frozen=True)
class Timing:
    """Step time. Exposed (on the critical path): tp, Ulysses and ep collectives inside each
    chunk, pp sends, ZeRO-1/2 param all-gathers after the step, SP and tied-embedding grad
    all-reduces. Overlapped: ring-attention KV passes with the attention core; the dp grad
    reduction (and ZeRO-3 backward gathers) with the backward of the last micro-batch,
    ZeRO-3 forward gathers with the first forward — only what exceeds those windows is
    exposed. The optimizer step itself is not timed."""

    peak: float  # FLOP/s per GPU in the plan's dtype (fp32 runs TF32 at half the bf16 peak)
    efficiency: float
    t_f: float  # per chunk per micro-batch, slowest chunk, compute + exposed comm
    t_b: float
    t_w: float
    t_comm: float  # per pipeline send
    pipeline: float  # makespan of the simulated schedule
    bubble_fraction: float
    exposed: float  # per step outside the pipeline (dp, ZeRO, tied, SP grads), worst stage
    overlapped: float  # per step, communication hidden behind compute, worst stage
    step: float
    tokens_per_s: float
    mfu: float
    hfu: float


def peak_flops(plan: Plan) -> float:
    return plan.cluster.device.peak_flops * (0.5 if plan.train.precision == "fp32" else 1.0)


def timing(plan: Plan, topo: Topology, settings: est.Settings = est.DEFAULT, stages=None, acts=None) -> tuple[Timing, sched.Simulation]:
    """Chunk times t_f, t_b (t_w for zb_h1) from FLOPs at ``peak × efficiency`` plus the
    exposed collectives, simulated over the schedule; step = makespan + exposed step comm.
    MFU = model FLOPs / (step × GPUs × peak) (Chowdhery et al. 2022); HFU counts recompute."""
    m, p, v, T = plan.model, plan.pp, plan.pipeline.virtual_stages, est.local_tokens(plan)
    stages = stages if stages is not None else traffic.traffic(plan)
    rate = peak_flops(plan) * settings.efficiency or 1e-300  # no peak: infinite times (null in JSON)
    mm, core = est.layer_flops(m, m.seq_len, plan.tp)
    rec = {"none": 0.0, "selective": core, "full": mm + core}[plan.train.recompute]
    zb = plan.pipeline.schedule == "zb_h1"

    def secs(specs, attr: str, overlap: str) -> float:
        return sum(traffic.to_comm(plan, sp, getattr(sp, attr)).seconds(topo) for sp in specs if sp.overlap == overlap and getattr(sp, attr))

    specs = traffic.layer_specs(plan)
    lay_f = secs(specs, "fwd", "exposed") + max(0.0, secs(specs, "fwd", "attention") - T * core / rate)
    lay_b = secs(specs, "bwd", "exposed") + max(0.0, secs(specs, "bwd", "attention") - 2 * T * core / rate)
    t_f = t_b = t_w = 0.0
    for g, n in enumerate(plan.stage_layers()):
        last = g == p * v - 1
        head = 2 * T * m.hidden * ceil(m.vocab / plan.tp) if last else 0
        fwd = n * T * (mm + core) + head
        edge = traffic.edge_specs(plan, g == 0, last)
        t_f = max(t_f, fwd / rate + n * lay_f + secs(edge, "fwd", "exposed"))
        # zb_h1 (as the generated script splits it): W is the linear layers' dW, as many
        # FLOPs as their forward; B is everything else, the attention core's backward too
        w = n * T * mm + head if zb else 0.0
        t_b = max(t_b, (2 * fwd - w + n * T * rec) / rate + n * lay_b + secs(edge, "bwd", "exposed"))
        t_w = max(t_w, w / rate)
    t_comm = Comm("pp", ("pp",), "send", "", 1, traffic.pp_bytes(plan), p).call_seconds(topo) if p > 1 else 0.0
    sim = sched.simulate(acts if acts is not None else est.actions(plan), t_f, t_b, t_w, t_comm)
    exposed = overlapped = 0.0
    for rows in stages:
        step_rows = [(c, c.seconds(topo)) for c in rows if c.per == "step"]
        late = sum(s for c, s in step_rows if c.overlap in ("backward", "prefetch") and "forward" not in c.what)
        early = sum(s for c, s in step_rows if c.overlap == "prefetch" and "forward" in c.what)
        out = sum(s for c, s in step_rows if c.overlap == "exposed")
        ring = sum(c.seconds(topo) for c in rows if c.overlap == "attention")
        ex = max(0.0, late - v * t_b) + max(0.0, early - v * t_f) + out
        exposed, overlapped = max(exposed, ex), max(overlapped, late + early + out - ex + ring)
    step = sim.makespan + exposed
    fl, tokens = est.flops(plan), est.batch_tokens(plan)
    denom = step * plan.world_size * peak_flops(plan) or 1.0
    return Timing(peak_flops(plan), settings.efficiency, t_f, t_b, t_w, t_comm, sim.makespan, sim.bubble_fraction, exposed,
                  overlapped, step, tokens / step if step else 0.0, fl.model / denom, fl.hardware / denom), sim


# ---------------------------------------------------------------------------- explain


@dataclass(frozen=True)
class Row:
    """A traffic row as reported: the stage whose ranks send the most of it."""

    comm: Comm
    stage: int
    link: str
    seconds: float


@dataclass(frozen=True)
class Explanation:
    plan: Plan
    topo: Topology
    settings: est.Settings
    params: est.Params
    memory: tuple[est.StageMemory, ...]
    traffic: tuple[tuple[Comm, ...], ...]  # per pipeline stage
    rows: tuple[Row, ...]
    flops: est.Flops
    timing: Timing
    peak_inflight: tuple[int, ...]
    busiest: tuple[BusiestLink, ...]
    diagnostics: tuple[Diagnostic, ...]


def explain(plan: Plan, settings: est.Settings = est.DEFAULT, topo: Topology | None = None) -> Explanation:
    """Every estimate of ``plan``. Cost grows linearly with ranks: groups are handled per
    class, links charged with numpy over ranks, the schedule simulated per pipeline."""
    topo = topo or Topology.of(plan)
    acts = est.actions(plan)
    stages = traffic.traffic(plan)
    tm, sim = timing(plan, topo, settings, stages, acts)
    mem = est.memory(plan, settings, sim.peak_inflight)
    best: dict[tuple, Row] = {}
    for s, rows in enumerate(stages):
        for c in rows:
            key = (c.axis, c.kind, c.what)
            if key not in best or c.payload > best[key].comm.payload:
                route = topo.route(c.axes, "pairwise" if c.kind == "all_to_all" else "ring", c.members)
                best[key] = Row(c, s, route.link if route else "-", c.seconds(topo))
    busiest = tuple(topo.charge_comms(stages).busiest())
    return Explanation(plan, topo, settings, est.params(plan.model), mem, stages, tuple(best.values()), est.flops(plan), tm,
                       sim.peak_inflight, busiest, tuple(est.memory_diagnostics(plan, settings, mem)))


# ---------------------------------------------------------------------------- text


def size(n: float) -> str:
    """Binary units: 512 B, 3.0 KiB, 1.50 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs" if t > 0 else "0"


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]

    def fmt(r: list[str]) -> str:
        cells = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        return ("  " + "  ".join(cells)).rstrip()

    return [fmt(head)] + [fmt(r) for r in rows]


def _si(x: float, unit: str) -> str:
    """989 TFLOP/s, 15.2 PFLOP."""
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def render_text(ex: Explanation) -> str:
    """The report: what the plan is, memory per stage, traffic, busiest links, time."""
    p, m, c, t = ex.plan, ex.plan.model, ex.plan.cluster, ex.timing
    dev = c.device
    mesh = " × ".join(f"{a.name}={a.size} on {a.link}" for a in p.mesh.axes) or "one rank"
    pipe = p.pipeline
    out = [
        f"plan {p.name} ({p.file})",
        f"  model    {m.arch} {m.name}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), ffn {m.ffn}"
        + (f", {m.experts} experts top-{m.top_k}" if m.is_moe else "") + f", vocab {m.vocab}, seq {m.seq_len}: {_count(ex.params.total)} params",
        f"  cluster  {c.name}: {_n(c.nodes, 'node')} × {c.gpus_per_node} {dev.name} ({_si(dev.peak_flops, 'FLOP/s')}, {size(dev.memory)}); "
        + ", ".join(f"{lk.name} {lk.bandwidth / 1e9:g} GB/s ({lk.scope})" for lk in c.links),
        f"  mesh     {mesh} = {p.world_size} ranks",
        f"  train    {p.train.precision}, zero {p.data_parallel.zero}, recompute {p.train.recompute}"
        + (", sequence parallel" if p.tensor_parallel.sequence_parallel and p.tp > 1 else "")
        + (f", cp {p.context_parallel.method}" if p.cp > 1 else "")
        + f"; {pipe.schedule} (v={pipe.virtual_stages}), {_n(p.microbatches, 'micro-batch')} of {p.train.micro_batch} × {m.seq_len} tokens",
        "",
        f"Memory per GPU, worst rank of each pipeline stage (device: {size(dev.memory)})",
    ]
    rows = [[str(s.stage), str(s.layers), size(s.params), size(s.grads), size(s.optimizer), size(s.activations), f"{s.inflight}",
             size(s.total), "yes" if s.total <= dev.memory else "NO"] for s in ex.memory]
    out += _table(["stage", "layers", "params", "grads", "optimizer", "activations", "in flight", "total", "fits"], rows, {1, 2, 3, 4, 5, 6, 7})
    w, g, k = est.state_bytes_per_param(p)
    out.append(f"  bytes per parameter {w}+{g}+{k} (weights+grads+optimizer) before ZeRO; activations with "
               + ("the paper's stored attention scores" if ex.settings.attention == "paper" else "fused attention (no s² scores)"))
    for d in ex.diagnostics:
        out += [f"  error[{d.code}]: {d.message}", f"  help: {d.hint}"]
    out += ["", "Traffic per GPU per step (the busiest stage's ranks; payload = tensor bytes, wire = NCCL ring bytes)"]
    trows = [[r.comm.axis, r.comm.kind, r.comm.what, str(r.stage) if p.pp > 1 else "-", f"{r.comm.calls}", size(r.comm.payload), size(r.comm.wire),
              r.link, seconds(r.seconds), "overlapped" if r.comm.overlap in ("backward", "prefetch", "attention") else "exposed"]
             for r in sorted(ex.rows, key=lambda r: -r.seconds)]
    out += _table(["axis", "collective", "what", "stage", "calls", "payload", "wire", "link", "time", ""], trows, {4, 5, 6, 8}) if trows else ["  (none: a single rank)"]
    if ex.busiest:
        out += ["", "Busiest link of each type"]
        out += _table(["link", "edge", "per step", "busy"], [[b.link, f"{_vertex(b.edge[0])} ↔ {_vertex(b.edge[1])}", size(b.bytes), seconds(b.seconds)] for b in ex.busiest], {2, 3})
    out += [
        "",
        "Time per step",
        f"  compute at {t.efficiency:.0%} of {_si(t.peak, 'FLOP/s')}: forward {seconds(t.t_f)}, backward {seconds(t.t_b)}"
        + (f", weight-grad {seconds(t.t_w)}" if t.t_w else "") + " per chunk per micro-batch (with exposed tp/cp/ep collectives)"
        + (f"; pp send {seconds(t.t_comm)}" if p.pp > 1 else ""),
        (f"  pipeline {seconds(t.pipeline)} ({pipe.schedule}, bubble {t.bubble_fraction:.3f} of compute), "
        f"exposed step communication {seconds(t.exposed)}, overlapped {seconds(t.overlapped)}"),
        (f"  step {seconds(t.step)} · {_count(t.tokens_per_s)} tokens/s · MFU {t.mfu:.1%} (HFU {t.hfu:.1%}) · "
        f"{_si(ex.flops.model, 'FLOP')} model, {_si(ex.flops.hardware, 'FLOP')} with recompute per step"),
        "  assumed exposed: tp, Ulysses and ep collectives, pp sends, ZeRO param all-gathers after the step; overlapped:",
        "  dp grad reduction with the last backward, ZeRO-3 gathers by prefetch, ring-attention K/V passes with attention;",
        "  the optimizer step is not timed",
    ]
    return "\n".join(out) + "\n"


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
    by_stage = [[_row(c, s, r.link if (r := topo.route(c.axes, "pairwise" if c.kind == "all_to_all" else "ring", c.members)) else "-", c.seconds(topo))
                 for c in rows] for s, rows in enumerate(ex.traffic)]
    doc = {
        "plan": p.name,
        "file": p.file,
        "world_size": p.world_size,
        "params": {"total": pr.total, "embedding": pr.embedding, "positions": pr.positions, "per_layer": pr.layer,
                   "experts_per_layer": pr.experts, "final_norm": pr.final_norm, "head": pr.head},
        "device_memory": p.cluster.device.memory,
        "memory": [{"stage": s.stage, "params": s.params, "grads": s.grads, "optimizer": s.optimizer, "activations": s.activations,
                    "total": s.total, "layers": s.layers, "inflight": s.inflight, "fits": s.total <= p.cluster.device.memory} for s in ex.memory],
        "flops_per_step": ex.flops.model,
        "hardware_flops_per_step": ex.flops.hardware,
        "traffic": [_row(r.comm, r.stage, r.link, r.seconds) for r in ex.rows],
        "traffic_by_stage": by_stage,
        "busiest_links": [{"link": b.link, "edge": [list(b.edge[0]), list(b.edge[1])], "bytes_per_step": b.bytes,
                           "bandwidth": b.bandwidth, "seconds_per_step": b.seconds} for b in ex.busiest],
        "pipeline": {"schedule": p.pipeline.schedule, "stages": p.pp, "virtual_stages": p.pipeline.virtual_stages,
                     "microbatches": p.microbatches, "bubble_fraction": t.bubble_fraction, "makespan_s": t.pipeline,
                     "peak_inflight": list(ex.peak_inflight)},
        "time": {"peak_flops": t.peak, "efficiency": t.efficiency, "t_forward_s": t.t_f, "t_backward_s": t.t_b, "t_weight_grad_s": t.t_w,
                 "t_p2p_s": t.t_comm, "exposed_comm_s": t.exposed, "overlapped_comm_s": t.overlapped},
        "step_time_s": t.step,
        "tokens_per_s": t.tokens_per_s,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "diagnostics": [{"code": d.code, "message": d.message, "hint": d.hint} for d in ex.diagnostics],
    }
    return _safe(doc)
