"""The communication groups of a device mesh, without listing them.

rank = Σ coordinate × stride (last axis stride 1, :class:`dslc.ir.Mesh`). A group
over a set of axes A is ``base + offsets`` where the offsets are Σ iₐ·strideₐ in row-major
order (this is also NCCL's ring order: ranks ascending) and a base is a rank whose
A-coordinates are all 0. Whether a group crosses nodes depends only on
``base mod gpus_per_node``: node(base + off) − node(base) = ⌊(base mod g + off)/g⌋. So
every axis has at most ``gpus_per_node`` *classes* of identical groups, enumerated here
from residues without listing groups (:func:`group_classes`); times and the slowest link
are computed per class, never per pair of ranks.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, replace
from math import gcd

import numpy as np

from .ir import Mesh, Plan

# HSDP's halves of the dp axis (data_parallel.shard): FSDP inside a shard group, replicas across
DP_SHARD, DP_REPLICATE = "dp_shard", "dp_replicate"


def axes_of(mesh: Mesh, axes: tuple[str, ...] | str) -> tuple[str, ...]:
    """The axes of ``axes`` that the mesh has with size > 1, in mesh order."""
    want = {axes} if isinstance(axes, str) else set(axes)
    return tuple(a.name for a in mesh.axes if a.name in want and a.size > 1)


def group_mesh(plan: Plan) -> Mesh:
    """The mesh the communication groups are taken over: the plan's, except under HSDP
    (``data_parallel.shard`` below dp, with ZeRO) its dp axis is two, on dp's link:
    dp_replicate (dp / shard, outer) × dp_shard (shard consecutive dp coordinates, dp's
    stride), as torchtitan's dp_replicate × dp_shard. Every rank keeps its place."""
    dp, mesh = plan.data_parallel, plan.mesh
    if not (dp.zero and dp.hsdp(plan.dp)):
        return mesh
    axes = []
    for a in mesh.axes:
        split = (replace(a, name=DP_REPLICATE, size=a.size // dp.shard), replace(a, name=DP_SHARD, size=dp.shard))
        axes += split if a.name == "dp" else (a,)
    return replace(mesh, axes=tuple(axes))


def replica_group(plan: Plan) -> tuple[str, ...]:
    """HSDP's replicas, dp_replicate: each holds the same ZeRO shards and all-reduces its
    reduced gradient shard with the others once per step; () without HSDP."""
    return axes_of(group_mesh(plan), (DP_REPLICATE,))


def offsets(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """Offsets of a group's members from its base, row-major (ascending ranks)."""
    off = np.zeros(1, dtype=np.int64)
    for name in axes_of(mesh, axes):
        off = (off[:, None] + np.arange(mesh.size(name), dtype=np.int64) * mesh.stride(name)).ravel()
    return off


def _bases_by_residue(mesh: Mesh, axes: tuple[str, ...], g: int) -> dict[int, tuple[int, int]]:
    """residue mod g → (number of bases, smallest base). O(g²·axes), no list of groups:
    bases are sums of i·stride over the other axes, and i·stride mod g has period g/gcd."""
    table: dict[int, tuple[int, int]] = {0: (1, 0)}
    inside = set(axes_of(mesh, axes))
    for ax in mesh.axes:
        if ax.name in inside or ax.size == 1:
            continue
        st = mesh.stride(ax.name)
        period = g // gcd(st % g or g, g)
        new: dict[int, list[int]] = defaultdict(lambda: [0, 1 << 62])
        for k in range(min(ax.size, period)):
            mult = ax.size // period + (k < ax.size % period)
            for res, (cnt, low) in table.items():
                slot = new[(res + k * st) % g]
                slot[0] += cnt * mult
                slot[1] = min(slot[1], low + k * st)
        table = {r: (c, lo) for r, (c, lo) in new.items()}
    return table


@dataclass(frozen=True)
class GroupClass:
    """Groups of one axis set that cross node boundaries identically.

    ``example`` is the group of this class with the lowest base (ring order); ``count``
    how many groups share the pattern; ``nodes`` how many nodes one group spans;
    ``cross_hops`` how many hops of its ring go between nodes (of ``len(example)``)."""

    axes: tuple[str, ...]
    example: tuple[int, ...]
    count: int
    nodes: int
    cross_hops: int

    @property
    def size(self) -> int:
        return len(self.example)

    @property
    def intra_hops(self) -> int:
        return (self.size if self.size > 1 else 0) - self.cross_hops

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


@functools.lru_cache(maxsize=4096)
def group_classes(mesh: Mesh, gpus_per_node: int, axes: tuple[str, ...] | str, members: tuple[int, ...] | None = None) -> tuple[GroupClass, ...]:
    """Classes of identical groups along ``axes`` (positions ``members`` of each group
    only, e.g. the first and last pipeline stage), lowest example first; kept for the next
    plan of the same mesh (the layout search asks for thousands)."""
    g = gpus_per_node
    names = axes_of(mesh, axes)
    off = offsets(mesh, names)
    if members is not None:
        off = off[list(members)]
    found: dict[bytes, list] = {}
    for res, (cnt, low) in sorted(_bases_by_residue(mesh, names, g).items()):
        pattern = (res + off) // g
        key = pattern.tobytes()
        if key in found:
            found[key][0] += cnt
            found[key][1] = min(found[key][1], low)
        else:
            cross = int(np.count_nonzero(pattern != np.roll(pattern, -1))) if len(off) > 1 else 0
            found[key] = [cnt, low, len(np.unique(pattern)), cross]
    out = [GroupClass(names, tuple(int(low + o) for o in off), cnt, nodes, cross) for cnt, low, nodes, cross in found.values()]
    return tuple(sorted(out, key=lambda c: c.example[0]))


def axis_crossing(plan_or_mesh: Plan | Mesh, gpus_per_node: int, axis: str) -> tuple[tuple[int, ...], int, int] | None:
    """None if every group of ``axis`` lies inside one node; else (ranks of the lowest
    group that spans nodes, the axis's stride, the first rank of the second node it
    touches — the node boundary it crosses)."""
    mesh = plan_or_mesh.mesh if isinstance(plan_or_mesh, Plan) else plan_or_mesh
    if mesh.size(axis) <= 1:
        return None
    for cls in group_classes(mesh, gpus_per_node, axis):
        if cls.crosses_nodes:
            first = cls.example[0] // gpus_per_node
            other = next(r for r in cls.example if r // gpus_per_node != first)
            return cls.example, mesh.stride(axis), (other // gpus_per_node) * gpus_per_node
    return None
