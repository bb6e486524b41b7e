"""The view of the generated health.py: what the plan's cluster promises, for the health
check before the first step and the stragglers' log (plan.py's AXIS_LINKS, GEMM_FLOPS,
GEMM_DTYPE), and whether the check runs unless a flag says otherwise."""

from __future__ import annotations

from ..cost.compute import rates
from ..cost.topology import Topology
from ..ir import Plan
from .literals import comment_safe, float_literal, number


def health_view(plan: Plan, param_dtype: str, multi_node: bool) -> dict:
    """AXIS_LINKS: each mesh axis of more than one rank (HSDP's dp_replicate and dp_shard
    too) -> (the link its groups cross, the slowest on their route, as dslc explain
    times them; its bandwidth in bytes/s each way). GEMM_FLOPS: a large GEMM's rate on
    one device, the device's peak times the calibrated (or the cluster's) efficiency."""
    topo = Topology.of(plan)
    names = [a.name for a in plan.mesh.axes if a.size > 1]
    names += [a.name for a in topo.mesh.axes if a.size > 1 and a.name not in names]
    links = {}
    for a in names:
        route = topo.route((a,))
        if route:
            links[a] = f"({route.link!r}, {float_literal(float(route.bandwidth))})"
    r = rates(plan)
    return {
        "axis_links": "{" + ", ".join(f'"{a}": {link}' for a, link in links.items()) + "}",
        "gemm_flops": number(r.peak * r.gemm, "expected GEMM FLOP/s"),
        "gemm_efficiency": f"{r.gemm:.0%}",
        "gemm_device": comment_safe(plan.cluster.device.name),
        "gemm_dtype": param_dtype,
        # a multi-node job's start is where a bad GPU or link hides, and its few seconds
        # are nothing beside the job; one node is the user's own machine, seen already
        "health_check_default": multi_node,
    }
