"""Step time: chunk compute from FLOPs at a stated efficiency of the device peak, the
exposed collectives on top, the pipeline schedule simulated over them
(:func:`dslc.cost.schedule.simulate`), and the once-per-step communication that the
backward or forward does not hide.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from .. import arch
from ..ir import Plan
from . import memory as mem
from . import schedule as sched
from . import traffic
from .collectives import Comm
from .flops import batch_tokens, flops, layer_rank_flops, peak_flops
from .topology import Topology


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


def timing(plan: Plan, topo: Topology, settings: mem.Settings = mem.DEFAULT, stages=None, acts=None) -> tuple[Timing, sched.Simulation]:
    """Chunk times t_f, t_b (t_w for zb_h1) from FLOPs at ``peak × efficiency`` (per rank:
    :func:`~dslc.cost.flops.layer_rank_flops`) plus the exposed collectives, simulated over
    the schedule; step = makespan + exposed step comm. A dropless MoE at
    ``settings.imbalance`` r costs the busiest ep rank r× its expert FLOPs and ep bytes.
    MFU = model FLOPs / (step × GPUs × peak) (Chowdhery et al. 2022); HFU counts recompute."""
    m, p, v, T = plan.model, plan.pp, plan.pipeline.virtual_stages, mem.local_tokens(plan)
    stages = stages if stages is not None else traffic.traffic(plan)
    rate = peak_flops(plan) * settings.efficiency or 1e-300  # no peak: infinite times (null in JSON)
    dense, core, experts = layer_rank_flops(plan, settings.imbalance)  # per layer per micro-batch
    mm = dense + experts
    rec = {"none": 0.0, "selective": core, "full": mm + core}[plan.train.recompute]
    zb = plan.pipeline.schedule == "zb_h1"

    def secs(specs, attr: str, overlap: str) -> float:
        return sum(traffic.to_comm(plan, sp, getattr(sp, attr)).seconds(topo) for sp in specs if sp.overlap == overlap and getattr(sp, attr))

    specs = traffic.layer_specs(plan)
    if settings.imbalance != 1.0 and mem.expert_capacity(plan) is None:  # the busiest ep rank receives r×
        specs = [replace(sp, nbytes=ceil(sp.nbytes * settings.imbalance)) if sp.axes == ("ep",) else sp for sp in specs]
    lay_f = secs(specs, "fwd", "exposed") + max(0.0, secs(specs, "fwd", "attention") - core / rate)
    lay_b = secs(specs, "bwd", "exposed") + max(0.0, secs(specs, "bwd", "attention") - 2 * core / rate)
    t_f = t_b = t_w = 0.0
    for g, n in enumerate(plan.stage_layers()):
        last = g == p * v - 1
        head = 2 * T * m.hidden * arch.vocab_per_rank(m, plan.tp) if last else 0
        fwd = n * (mm + core) + head
        edge = traffic.edge_specs(plan, g == 0, last)
        t_f = max(t_f, fwd / rate + n * lay_f + secs(edge, "fwd", "exposed"))
        # zb_h1 (as the generated script splits it): W is the linear layers' dW, as many
        # FLOPs as their forward; B is everything else, the attention core's backward too
        w = n * mm + head if zb else 0.0
        t_b = max(t_b, (2 * fwd - w + n * rec) / rate + n * lay_b + secs(edge, "bwd", "exposed"))
        t_w = max(t_w, w / rate)
    t_comm = Comm("pp", ("pp",), "send", "", 1, traffic.pp_bytes(plan), p).call_seconds(topo) if p > 1 else 0.0
    sim = sched.simulate(acts if acts is not None else mem.actions(plan), t_f, t_b, t_w, t_comm)
    exposed = overlapped = 0.0
    for rows in stages:
        step_rows = [(c, c.seconds(topo)) for c in rows if c.per == "step"]
        late = sum(s for c, s in step_rows if c.overlap == "backward")
        early = sum(s for c, s in step_rows if c.overlap == "forward")
        out = sum(s for c, s in step_rows if c.overlap == "exposed")
        ring = sum(c.seconds(topo) for c in rows if c.overlap == "attention")
        ex = max(0.0, late - v * t_b) + max(0.0, early - v * t_f) + out
        exposed, overlapped = max(exposed, ex), max(overlapped, late + early + out - ex + ring)
    step = sim.makespan + exposed
    fl, tokens = flops(plan), batch_tokens(plan)
    denom = step * plan.world_size * peak_flops(plan) or 1.0
    return Timing(peak_flops(plan), settings.efficiency, t_f, t_b, t_w, t_comm, sim.makespan, sim.bubble_fraction, exposed,
                  overlapped, step, tokens / step if step else 0.0, fl.model / denom, fl.hardware / denom), sim
