"""Step time: each pipeline chunk's compute from its own kernels (:mod:`dslc.cost.compute`:
GEMMs, attention and elementwise work, each at its calibrated rate) with the exposed
collectives on top, the pipeline schedule simulated over them
(:func:`dslc.cost.schedule.simulate`), then the once-per-step communication that the
backward or forward does not hide and the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from .. import arch
from ..ir import Plan
from . import memory as mem
from . import offload as off
from . import schedule as sched
from . import traffic
from .collectives import Comm
from .compute import Kernels, Rates, edge_kernels, layer_kernels, rates, shared_experts_seconds
from .flops import batch_tokens, flops
from .recompute import shares
from .topology import Topology


@dataclass(frozen=True)
class Timing:
    """Step time. Exposed (on the critical path): tp, Ulysses and ep collectives inside each
    chunk, pp sends, ZeRO-1/2 param all-gathers after the step, SP and tied-embedding grad
    all-reduces, the optimizer step. Overlapped: ring-attention KV passes with the
    attention core; the dp grad reduction (and ZeRO-3 backward gathers) with the backward
    of the last micro-batch, ZeRO-3 forward gathers with the first forward — only what
    exceeds those windows is exposed."""

    peak: float  # FLOP/s per GPU in the plan's dtype (fp32 runs TF32 at half the bf16 peak)
    rates: Rates
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
    chunks: tuple[tuple[float, float, float], ...] = ()  # (t_f, t_b, t_w) of each global chunk
    optimizer: float = 0.0  # the optimizer step, worst stage
    kernels: Kernels = Kernels()  # one layer's forward by class
    offload: off.Copies = off.NO_COPIES  # train { offload }: the PCIe copies and the host's step, worst stage


def recompute_kernels(plan: Plan, k: Kernels) -> float:
    """Forward seconds one layer re-runs in backward, averaged over the layers: selective the
    attention core, selective_ops the elementwise kernels and every other GEMM (by FLOPs; the
    others' outputs are saved), full the whole forward (``full every N``: on 1/N of the
    layers) — the shares of :func:`dslc.cost.recompute.shares`, as the HFU's FLOPs."""
    gemm, attention, elementwise = shares(plan)
    return gemm * k.gemm + attention * k.attention + elementwise * k.elementwise


def optimizer_seconds(plan: Plan, states: mem.StageMemory, r: Rates) -> float:
    """The optimizer step of a rank: memory-bound, it reads its weights, optimizer state
    and gradients and writes the weights and the state back."""
    return r.bytes_seconds(2 * (states.params + states.optimizer) + states.grads)


def timing(plan: Plan, topo: Topology, settings: mem.Settings = mem.DEFAULT, stages=None, acts=None) -> tuple[Timing, sched.Simulation]:
    """Each chunk's t_f, t_b (t_w for zb_h1) from its layers' and edges' kernels
    (:func:`~dslc.cost.compute.layer_kernels`) plus the exposed collectives, simulated
    over the schedule; step = makespan + exposed step comm + optimizer step (each the worst stage's). A dropless
    MoE at ``settings.imbalance`` r costs the busiest ep rank r× its expert work and ep
    bytes. MFU = model FLOPs / (step × GPUs × peak) (Chowdhery et al. 2022); HFU counts
    recompute."""
    p, v = plan.pp, plan.pipeline.virtual_stages
    stages = stages if stages is not None else traffic.traffic(plan)
    r = rates(plan)
    zb = plan.pipeline.schedule in sched.SPLIT_BACKWARD

    def secs(specs, attr: str, overlap: str) -> float:
        return sum(traffic.to_comm(plan, sp, getattr(sp, attr)).seconds(topo) for sp in specs if sp.overlap == overlap and getattr(sp, attr))

    def layer(km) -> tuple[Kernels, float, float, float]:
        """One block of a kind (a dense-prefix block or a MoE block, or the model's one
        kind): its kernels, the seconds it re-runs, its exposed forward and backward comm."""
        kp = replace(plan, model=km)
        k = layer_kernels(kp, r, settings)
        specs = traffic.layer_specs(kp)
        if settings.imbalance != 1.0 and mem.expert_capacity(kp) is None:  # the busiest ep rank receives r×
            specs = [replace(sp, nbytes=ceil(sp.nbytes * settings.imbalance)) if sp.axes == ("ep",) else sp for sp in specs]
        lay_f = secs(specs, "fwd", "exposed") + max(0.0, secs(specs, "fwd", "attention") - k.attention)
        lay_f += max(0.0, secs(specs, "fwd", "shared") - shared_experts_seconds(kp, r))
        lay_b = secs(specs, "bwd", "exposed") + max(0.0, secs(specs, "bwd", "attention") - k.attention_backward * k.attention)
        return k, recompute_kernels(plan, k), lay_f, lay_b

    kinds = {km: layer(km) for _, km in arch.kinds(plan.model)}
    chunks, start = [], 0
    for g, n in enumerate(plan.stage_layers()):
        first, last = g == 0, g == p * v - 1
        work, extra_f, extra_b = edge_kernels(plan, r, first, last), 0.0, 0.0
        for count, km in arch.kinds(plan.model, range(start, start + n)):
            k, rec, lay_f, lay_b = kinds[km]
            work, extra_f, extra_b = work + k * count, extra_f + count * lay_f, extra_b + count * (rec + lay_b)
        start += n
        edge = traffic.edge_specs(plan, first, last)
        # zb_h1 (as the generated script splits it): W is the linear layers' weight
        # gradients, one GEMM per forward GEMM; B is everything else
        w = work.gemm if zb else 0.0
        chunks.append((work.forward + extra_f + secs(edge, "fwd", "exposed"),
                       work.backward - w + extra_b + secs(edge, "bwd", "exposed"), w))
    k = kinds[arch.kinds(plan.model)[-1][1]][0]  # the report's layer: the last kind (a MoE block)
    t_f, t_b, t_w = (tuple(c[i] for c in chunks) for i in range(3))
    t_comm = Comm("pp", ("pp",), "send", "", 1, traffic.pp_bytes(plan), p).call_seconds(topo) if p > 1 else 0.0
    acts = acts if acts is not None else mem.actions(plan)
    sim = sched.simulate(acts, t_f, t_b, t_w, t_comm, timeline=False)
    states = mem.memory(plan, settings, sim.peak_inflight)
    exposed = overlapped = opt = 0.0
    offload = off.NO_COPIES  # train { offload }: the worst stage's
    for s, rows in enumerate(stages):
        step_rows = [(c, c.seconds(topo)) for c in rows if c.per == "step"]
        late = sum(t for c, t in step_rows if c.overlap == "backward")
        early = sum(t for c, t in step_rows if c.overlap == "forward")
        out = sum(t for c, t in step_rows if c.overlap == "exposed")
        ring = sum(c.seconds(topo) for c in rows if c.overlap in ("attention", "shared"))
        # the last backward and first forward of the stage's chunks hide the step's comm
        window_b = sum(t_b[g] for g in plan.placement.ids(s))
        window_f = sum(t_f[g] for g in plan.placement.ids(s))
        ex = max(0.0, late - window_b) + max(0.0, early - window_f) + out
        exposed, overlapped = max(exposed, ex), max(overlapped, late + early + out - ex + ring)
        opt = max(opt, optimizer_seconds(plan, states[s], r) if not states[s].host_optimizer.d2h else 0.0)
        m = plan.microbatches
        st = states[s]
        copies = off.copies(plan, st.host_optimizer, st.host_activations, m * window_f, m * window_b, window_b,
                            bool(mem.grad_group(plan, False)), st.layers / plan.pipeline.virtual_stages)
        offload = max(offload, copies, key=lambda c: c.added)
    step = sim.makespan + exposed + opt + offload.added
    fl, tokens = flops(plan), batch_tokens(plan)
    denom = step * plan.world_size * r.peak or 1.0
    return Timing(r.peak, r, max(t_f), max(t_b), max(t_w), t_comm, sim.makespan, sim.bubble_fraction, exposed,
                  overlapped, step, tokens / step if step else 0.0, fl.model / denom, fl.hardware / denom,
                  tuple(chunks), opt, k, offload), sim
