"""The mesh on the cluster: as many ranks as GPUs (E030), each axis on a link that can
carry its groups (E034: a node-scope link across nodes; W035: tp across nodes)."""

from __future__ import annotations

from ..diagnostics import error, warning
from ..groups import axis_crossing
from ..ir import Plan


def _axes_desc(plan: Plan) -> str:
    return " × ".join(f"{a.name}={a.size}" for a in plan.mesh.axes) or "no axes"


# -- mesh and placement -----------------------------------------------------


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
