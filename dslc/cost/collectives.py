"""A collective as the cost model sees it: NCCL's ring factors and step counts
(nccl-tests PERFORMANCE.md) turn a payload into wire bytes and a call time on the route
of its group (:class:`dslc.cost.topology.Topology`).

Per-rank wire bytes for a payload S on n ranks: all-reduce 2(n−1)/n·S, all-gather and
reduce-scatter (n−1)/n·S (S the full tensor), all-to-all (n−1)/n·S, send S.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Topology

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
# when a collective runs against compute: on the critical path, or hidden behind the
# backward (dp grads, ZeRO-3 backward gathers), the forward (ZeRO-3 forward gathers) or
# the attention core (ring attention's K/V passes) or the shared experts (ep's dispatch)
OVERLAPS = ("exposed", "backward", "forward", "attention", "shared")
PATTERNS = ("ring", "pairwise", "chain")

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "send": lambda n: 1.0}
STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
         "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1, "send": lambda n: 1}


@dataclass(frozen=True)
class Comm:
    """A collective (or p2p send) that one rank calls ``calls`` times per step on its group;
    one row of the traffic table. NCCL ring factors (nccl-tests PERFORMANCE.md) turn the
    payload S into wire bytes per rank and ring steps."""

    axis: str  # the group: "tp", "pp", "cp", "ep", "dp", "dp+ep", …
    axes: tuple[str, ...]
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send
    what: str
    calls: int  # per step per rank
    bytes_per_call: int  # payload S
    group: int  # ranks in the group
    per: str = "micro-batch"  # micro-batch (inside the pipeline) | step (once, outside it)
    overlap: str = "exposed"  # one of OVERLAPS
    members: tuple[int, ...] | None = None  # positions of the group taking part (default all)
    back: bool = False  # chain only: sent to the previous stage (gradients)

    @property
    def pattern(self) -> str:
        """How NCCL lays it on links: pairwise all-to-all, chain of pp sends, else a ring."""
        return "pairwise" if self.kind == "all_to_all" else "chain" if self.axis == "pp" and self.kind == "send" else "ring"

    @property
    def payload(self) -> int:
        return self.calls * self.bytes_per_call

    @property
    def wire(self) -> float:
        return self.calls * FACTOR[self.kind](self.group) * self.bytes_per_call

    def route(self, topo: Topology):
        """The route its groups take (a chain of sends routes like a ring); None for a
        group of one rank."""
        return topo.route(self.axes, "pairwise" if self.pattern == "pairwise" else "ring", self.members)

    def call_seconds(self, topo: Topology) -> float:
        """latency × ring steps + wire bytes / bandwidth of the slowest link crossed."""
        route = self.route(topo)
        if route is None:
            return 0.0
        n, wire = self.group, FACTOR[self.kind](self.group) * self.bytes_per_call
        return STEPS[self.kind](n) * route.latency + (wire / route.bandwidth if route.bandwidth > 0 else float("inf"))

    def seconds(self, topo: Topology) -> float:
        return self.calls * self.call_seconds(topo)
