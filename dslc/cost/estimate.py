"""Every estimate of one plan in one value: what ``dslc explain`` reports and what the
search compares. Cost grows linearly with ranks: groups are handled per class, links
charged with numpy over ranks, the schedule simulated once per pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from .. import arch
from ..ir import Plan
from . import memory as mem
from . import traffic
from .collectives import Comm
from .flops import Flops, flops
from .links import BusiestLink, charge_comms
from .time import Timing, timing
from .topology import Topology


@dataclass(frozen=True)
class Row:
    """A traffic row as reported: the stage whose ranks send the most of it."""

    comm: Comm
    stage: int
    link: str
    seconds: float


@dataclass(frozen=True)
class Estimate:
    plan: Plan
    topo: Topology
    settings: mem.Settings
    params: arch.Params
    memory: tuple[mem.StageMemory, ...]
    traffic: tuple[tuple[Comm, ...], ...]  # per pipeline stage
    rows: tuple[Row, ...]
    flops: Flops
    timing: Timing
    peak_inflight: tuple[int, ...]
    busiest: tuple[BusiestLink, ...]


def route_link(topo: Topology, c: Comm) -> str:
    """The link that sets the speed of ``c``'s groups, "-" for a group of one."""
    route = c.route(topo)
    return route.link if route else "-"


def estimate(plan: Plan, settings: mem.Settings = mem.DEFAULT, topo: Topology | None = None) -> Estimate:
    """Memory, traffic, FLOPs and time of a plan that passed the checks."""
    topo = topo or Topology.of(plan)
    acts = mem.actions(plan)
    stages = traffic.traffic(plan)
    tm, sim = timing(plan, topo, settings, stages, acts)
    memory = mem.memory(plan, settings, sim.peak_inflight)
    best: dict[tuple, Row] = {}
    for s, rows in enumerate(stages):
        for c in rows:
            key = (c.axis, c.kind, c.what)
            if key not in best or c.payload > best[key].comm.payload:
                best[key] = Row(c, s, route_link(topo, c), c.seconds(topo))
    busiest = tuple(charge_comms(topo, stages).busiest())
    return Estimate(plan, topo, settings, arch.params(plan.model), memory, stages,
                    tuple(best.values()), flops(plan), tm, sim.peak_inflight, busiest)
