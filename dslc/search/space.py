"""What a layout search may choose, one knob at a time: the degrees and orders of the mesh
axes on the cluster's links, schedules, micro-batch sizes, ZeRO stages, recompute policies,
sequence parallelism and the cp method; a plan with a layout put in, and what a layout
changes of another (the ``differs`` column of ``dslc search``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from ..front.defaults import MAX_RANKS
from ..groups import axis_crossing
from ..ir import Cluster, MeshAxis, Plan
from ..knobs import knobs
from ..units import divisors

AXIS_ORDER = ("dp", "pp", "cp", "ep", "tp")  # the plans' usual order, outermost first
RECOMPUTE = (("none", 1), ("selective", 1), ("selective_ops", 1), ("full", 2), ("full", 1))  # the least recomputed (most activations kept) first
VIRTUAL = (2, 3, 4, 6, 8)  # interleaved_1f1b's virtual stages tried
MAX_MICRO_BATCH = 16


class SearchError(Exception):
    """The search cannot start (a GPU count the cluster cannot be cut to): one line."""


# ---------------------------------------------------------------------------- the cluster


def resize(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster with ``gpus`` GPUs of the same nodes and links: whole nodes, or part of
    one node (whose cluster-scope links then go unused)."""
    g = cluster.gpus_per_node
    if gpus < 1:
        raise SearchError(f"--gpus must be at least 1, got {gpus}")
    if gpus > MAX_RANKS:  # the language's bound, which lint holds a plan's cluster to
        raise SearchError(f"--gpus {gpus} is more than a cluster may have: at most {MAX_RANKS} GPUs (2¹⁸, E037)")
    if gpus % g == 0:
        return replace(cluster, nodes=gpus // g)
    if gpus < g:
        return replace(cluster, nodes=1, gpus_per_node=gpus)
    raise SearchError(f"--gpus {gpus} is not a whole number of {cluster.name}'s nodes of {g} GPUs")


def _links(cluster: Cluster) -> tuple[str | None, str | None]:
    """The fastest node-scope and cluster-scope links (either may be absent)."""
    best = {}
    for scope in ("node", "cluster"):
        links = [lk for lk in cluster.links if lk.scope == scope]
        best[scope] = max(links, key=lambda lk: lk.bandwidth).name if links else None
    return best["node"], best["cluster"]


# ---------------------------------------------------------------------------- shapes


def degrees(plan: Plan, world: int) -> Iterator[dict[str, int]]:
    """{axis: size} with the product ``world``, dp·ep dividing the global batch, tp inside
    a node, pp at most the layers, ep dividing the experts (1 for a dense model)."""
    m, gpn = plan.model, plan.cluster.gpus_per_node
    ds = divisors(world)
    for tp in (d for d in ds if d <= gpn):
        for pp in (d for d in ds if d <= m.layers and world % (tp * d) == 0):
            for cp in (d for d in ds if world % (tp * pp * d) == 0 and m.seq_len % d == 0):
                for ep in (d for d in ds if world % (tp * pp * cp * d) == 0 and (d == 1 or (m.is_moe and m.experts % d == 0))):
                    dp = world // (tp * pp * cp * ep)
                    if plan.train.global_batch % (dp * ep) == 0:
                        yield {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}


def meshes(plan: Plan, sizes: dict[str, int]) -> Iterator:
    """The meshes of ``sizes``: tp innermost, the other axes in every order, each axis on
    the node link when all its groups stay in a node, else on the cluster link; orders
    that place every axis on the same link once."""
    node, cluster = _links(plan.cluster)
    gpn = plan.cluster.gpus_per_node
    outer = [a for a in AXIS_ORDER if a != "tp" and sizes[a] > 1]
    seen = set()
    for order in itertools.permutations(outer):
        names = [*order, "tp"] if sizes["tp"] > 1 else list(order)
        axes = tuple(MeshAxis(n, sizes[n], "", plan.mesh.span) for n in names)
        mesh = replace(plan.mesh, axes=axes)
        placed = []
        for a in axes:
            inside = axis_crossing(mesh, gpn, a.name) is None
            link = node if inside and node else cluster
            if link is None:
                break
            placed.append(replace(a, link=link))
        else:
            key = tuple(sorted((a.name, a.link) for a in placed))
            if key not in seen:
                seen.add(key)
                yield replace(mesh, axes=tuple(placed))


# ---------------------------------------------------------------------------- variants


def without_layout_spans(plan: Plan) -> dict:
    """The plan's spans without those of what a search changes (a warning about a key the
    user wrote, such as W057's pipeline options without pp, is about their plan)."""
    changed = ("mesh.", "pipeline", "data_parallel", "tensor_parallel", "context_parallel", "train.micro_batch", "train.recompute")
    return {k: s for k, s in plan.spans.items() if not k.startswith(changed)}


def with_layout(plan: Plan, mesh, schedule: str, v: int, mb: int, sp: bool, method: str, zero: int = 0,
          shard: int = 0, recompute: tuple[str, int] = ("none", 1)) -> Plan:
    dp_ranks = 1
    for a in mesh.axes:
        if a.name in ("dp", "ep"):
            dp_ranks *= a.size
    micro = plan.train.global_batch // (dp_ranks * mb)
    return replace(
        plan,
        mesh=mesh,
        pipeline=replace(plan.pipeline, schedule=schedule, virtual_stages=v, microbatches=micro, layers_per_stage=None),
        tensor_parallel=replace(plan.tensor_parallel, sequence_parallel=sp),
        data_parallel=replace(plan.data_parallel, zero=zero, shard=shard),
        context_parallel=replace(plan.context_parallel, method=method),
        train=replace(plan.train, micro_batch=mb, recompute=recompute[0], recompute_every=recompute[1]),
    )


FIXABLE = ("mesh", "schedule", "micro_batch", "zero", "recompute", "sp", "cp", "offload")  # what --fix keeps as written


def schedules(plan: Plan, pp: int, fixed=()) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try at ``pp``: 1f1b, zb_h1 and interleaved 1f1b at
    the virtual stages the layers allow (gpipe is 1f1b's bubble with more held)."""
    if pp == 1:
        return [("1f1b", 1)]
    if "schedule" in fixed:
        return [(plan.pipeline.schedule, plan.pipeline.virtual_stages)]
    return [("1f1b", 1), ("zb_h1", 1)] + [("interleaved_1f1b", v) for v in VIRTUAL if pp * v <= plan.model.layers]


def micro_batches(plan: Plan, per_rank: int, fixed=()) -> list[int]:
    """Micro-batch sizes: the powers of two that divide a data-parallel rank's sequences."""
    if "micro_batch" in fixed:
        return [plan.train.micro_batch] if per_rank % plan.train.micro_batch == 0 else []
    return [b for b in (1, 2, 4, 8, 16) if b <= min(per_rank, MAX_MICRO_BATCH) and per_rank % b == 0]


def zero_stages(plan: Plan, mesh, fixed=()) -> list[tuple[int, int]]:
    """(zero, HSDP shard): 0 when no rank shares the dense weights, else every stage and, for
    zero = 3, shards of the dp ranks of one node and of 8 nodes (HSDP)."""
    if "zero" in fixed:
        return [(plan.data_parallel.zero, plan.data_parallel.shard)]
    sizes = {a.name: a.size for a in mesh.axes}
    dp = sizes.get("dp", 1)
    if dp * sizes.get("cp", 1) * sizes.get("ep", 1) == 1:
        return [(0, 0)]
    out = [(0, 0), (1, 0), (2, 0), (3, 0)]
    stride = 1
    for a in reversed(mesh.axes):
        if a.name == "dp":
            break
        stride *= a.size
    in_node = max(1, plan.cluster.gpus_per_node // stride)
    out += [(3, s) for s in sorted({in_node, 8 * in_node}) if 1 < s < dp and dp % s == 0]
    return out


def recompute_policies(plan: Plan, fixed=()) -> list[tuple[str, int]]:
    """(policy, every) to try, the least recomputed first: `full every 2` needs 2 layers."""
    if "recompute" in fixed:
        return [(plan.train.recompute, plan.train.recompute_every)]
    return [r for r in RECOMPUTE if not (r[0] == "full" and r[1] == 2 and plan.model.layers < 2)]


def methods(plan: Plan, cp: int, fixed=()) -> list[str]:
    """The cp methods to try (ring and Ulysses; the rules say which a model takes)."""
    if cp == 1 or "cp" in fixed:
        return [plan.context_parallel.method]
    return ["ring", "ulysses"]


def sp_choices(plan: Plan, tp: int, fixed=()) -> list[bool]:
    """Sequence parallelism under tp: on (the same bytes, less memory), and off too only
    where the plan turns it off itself."""
    if tp == 1:
        return [False]
    if "sp" in fixed:
        return [plan.tensor_parallel.sequence_parallel]
    return [True, False] if not plan.tensor_parallel.sequence_parallel and "tensor_parallel.sequence_parallel" in plan.spans else [True]


# ---------------------------------------------------------------------------- differences


def changes(before: Plan, after: Plan) -> tuple[str, ...]:
    """What ``after`` changes of ``before``'s layout, shortly: ``tp 8→4``, ``cp 1→2``,
    ``axis order``, ``v5→v4``, ``zero 1→3``, ``recompute selective→none``."""
    out = [f"{n} {before.mesh.size(n)}→{after.mesh.size(n)}" for n in AXIS_ORDER if before.mesh.size(n) != after.mesh.size(n)]
    if not out and [(a.name, a.link) for a in before.mesh.axes if a.size > 1] != [(a.name, a.link) for a in after.mesh.axes if a.size > 1]:
        out.append("axis order")
    a, b = knobs(before), knobs(after)
    for k in ("schedule", "micro_batch", "zero", "recompute", "sp", "cp", "offload"):
        if a.get(k) != b.get(k) and k in b and (k != "cp" or k in a):  # a new cp's method is in its layout
            old, new = a.get(k, "-"), b[k]
            if k == "schedule" and old.split()[0] == new.split()[0] == "interleaved_1f1b":
                old, new, k = old.split()[1], new.split()[1], "interleaved"
            out.append(f"{k} {old}→{new}")
    return tuple(out)
