"""A mixture of experts: ep over the experts (E070, E073), top_k, the dense prefix, tp
without sequence parallelism (E071, E076, E077) and ep's link (W075)."""

from __future__ import annotations

from ..diagnostics import error, warning
from ..groups import axis_crossing
from ..ir import Plan
from ..unknown import unless_unknown


def experts(plan: Plan):
    m, ep = plan.model, plan.ep
    if not m.is_moe:
        if plan.mesh.axis("ep") is not None:
            yield error("E073", plan.where("mesh.ep"), f"the mesh has an ep axis but {m.arch} is a dense model with no experts", "remove ep, or use arch = mixtral")
        return
    if m.experts % ep:
        yield error("E070", plan.where("mesh.ep", "model.experts"), f"experts={m.experts} are not divisible by ep={ep}", f"use an ep that divides {m.experts}")
    if m.top_k > m.experts:
        yield error("E071", plan.where("model.top_k"), f"top_k={m.top_k} is larger than experts={m.experts}")
    with unless_unknown():  # the layers: the rest reads none
        if m.dense_layers >= m.layers:
            yield error("E077", plan.where("model.dense_layers"), f"dense_layers={m.dense_layers} leaves none of the {m.layers} layers a mixture of experts",
                        f"use dense_layers < {m.layers}, or a dense arch (llama)")
    if plan.tp > 1 and not plan.tensor_parallel.sequence_parallel:
        # The generated script replicates the experts over tp (it does not split them): with
        # sequence parallelism each tp rank routes its own slice of the sequence.
        yield error("E076", plan.where("tensor_parallel.sequence_parallel", "mesh.tp"),
                    f"{m.arch} with tp={plan.tp} needs sequence parallelism: the experts are replicated over tp, not split, "
                    f"and without it every tp rank holds every token, so each token would be dispatched {plan.tp} times",
                    "set tensor_parallel { sequence_parallel = true }")
    yield from _ep_placement(plan)


def _ep_placement(plan: Plan):
    """W075: ep on a cluster-scope link although its groups lie inside a node, where a
    node-scope link could carry its all-to-all (the layout already keeps them there: moving
    ep to that link passes E034)."""
    c, ax = plan.cluster, plan.mesh.axis("ep")
    link = c.link(ax.link) if ax is not None and ax.size > 1 else None
    if link is None or link.scope != "cluster" or plan.world_size != c.world_size:
        return
    inside = [lk for lk in c.links if lk.scope == "node"]
    if not inside or axis_crossing(plan.mesh, c.gpus_per_node, "ep") is not None:
        return
    best, stride = max(inside, key=lambda lk: lk.bandwidth), plan.mesh.stride("ep")
    yield warning("W075", ax.span,
                  f"ep={ax.size} is placed on {link.name} (scope: cluster) although each of its groups lies inside one node: "
                  f"the expert all-to-all is the heaviest collective of each layer",
                  f"put ep on the node link {best.name} (`ep = {ax.size} on {best.name}`): with stride {stride} a group spans "
                  f"{ax.size * stride} ranks, within the {c.gpus_per_node} GPUs of a node")
