"""The cluster graph and the routes the communication groups of a mesh take on it.

Graph (networkx, :func:`build_graph`). Vertices: ``("gpu", rank)``; for every node-scope
link L and node n a hub ``("hub", L, n)`` (the NVSwitch of that node); for every
cluster-scope link L a NIC ``("nic", L, n)`` per node and one ``("switch", L)``. Edges:
GPU–hub and GPU–NIC carry the link's per-GPU bandwidth (``Link.bandwidth`` is per
direction per GPU); NIC–switch is the node's uplink, ``gpus_per_node × bandwidth``.
A hop between two GPUs of one node is GPU → hub → GPU; between nodes it is
GPU → NIC → switch → NIC → GPU.

Groups of ranks and their classes are :mod:`dslc.groups`.

Links used by a hop. Inside a node NCCL takes the fastest node-scope link (the axis's own
link if it is node-scope); between nodes the axis's cluster-scope link (else the cluster's
fastest). The slowest link a group crosses sets its bandwidth (NCCL's ring runs at the
speed of its slowest hop).

What a collective costs is :mod:`dslc.cost.collectives`; the bytes it puts on every
link, :mod:`dslc.cost.links`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx

from ..groups import GroupClass, axes_of, group_classes, group_mesh
from ..ir import Cluster, Link, Mesh, Plan

# ---------------------------------------------------------------------------- graph


def build_graph(cluster: Cluster) -> nx.Graph:
    """The physical graph of ``cluster`` (see the module docstring). Linear in GPUs."""
    g, n_nodes = cluster.gpus_per_node, cluster.nodes
    graph = nx.Graph(name=cluster.name, gpus_per_node=g)
    graph.add_nodes_from((("gpu", r), {"kind": "gpu", "node": r // g}) for r in range(g * n_nodes))
    for lk in cluster.links:
        attrs = {"link": lk.name, "scope": lk.scope, "bandwidth": lk.bandwidth, "latency": lk.latency}
        if lk.scope == "node":
            graph.add_edges_from(((("gpu", r), ("hub", lk.name, r // g)) for r in range(g * n_nodes)), **attrs)
        else:
            graph.add_edges_from(((("gpu", r), ("nic", lk.name, r // g)) for r in range(g * n_nodes)), **attrs)
            up = dict(attrs, bandwidth=lk.bandwidth * g)
            graph.add_edges_from(((("nic", lk.name, n), ("switch", lk.name)) for n in range(n_nodes)), **up)
    return graph


def hop_path(cluster: Cluster, a: int, b: int, link: Link) -> tuple[tuple, ...]:
    """Vertices of the graph a message from rank ``a`` to rank ``b`` crosses on ``link``."""
    g = cluster.gpus_per_node
    na, nb = a // g, b // g
    if link.scope == "node" and na == nb:
        return (("gpu", a), ("hub", link.name, na), ("gpu", b))
    if link.scope == "node":
        raise ValueError(f"ranks {a} and {b} are on different nodes; {link.name} has node scope")
    if na == nb:  # loopback through the node's NIC (a cluster without a node-scope link)
        return (("gpu", a), ("nic", link.name, na), ("gpu", b))
    return (("gpu", a), ("nic", link.name, na), ("switch", link.name), ("nic", link.name, nb), ("gpu", b))


@dataclass(frozen=True)
class Route:
    """How the groups of an axis set reach each other: the slowest link any of their
    hops crosses sets ``bandwidth``; ``latency`` is that of the slowest-latency link."""

    link: str
    bandwidth: float
    latency: float
    crosses_nodes: bool
    links: tuple[str, ...]  # every physical link used, intra-node first


@dataclass
class Topology:
    """A plan's mesh laid onto its cluster. The networkx graph is built on first use."""

    cluster: Cluster
    mesh: Mesh
    _routes: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mesh.world_size != self.cluster.world_size:
            raise ValueError(f"mesh has {self.mesh.world_size} ranks but cluster '{self.cluster.name}' has {self.cluster.world_size} GPUs")

    @classmethod
    def of(cls, plan: Plan) -> Topology:
        """The plan's groups' mesh (:func:`dslc.groups.group_mesh`: HSDP splits dp)."""
        return cls(plan.cluster, group_mesh(plan))

    @cached_property
    def graph(self) -> nx.Graph:
        return build_graph(self.cluster)

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    def hop_links(self, axes: tuple[str, ...]) -> tuple[Link | None, Link | None]:
        """(link inside a node, link between nodes) for groups over ``axes``."""
        declared = [lk for a in axes_of(self.mesh, axes) if (lk := self.cluster.link(self.mesh.axis(a).link))]
        node = [lk for lk in self.cluster.links if lk.scope == "node"]
        wide = [lk for lk in self.cluster.links if lk.scope == "cluster"]

        def fast(links):
            return max(links, key=lambda lk: lk.bandwidth) if links else None

        intra = fast([lk for lk in declared if lk.scope == "node"]) or fast(node) or fast(declared) or fast(wide)
        inter = fast([lk for lk in declared if lk.scope == "cluster"]) or fast(wide)
        return intra, inter

    def classes(self, axes, members: tuple[int, ...] | None = None) -> tuple[GroupClass, ...]:
        return group_classes(self.mesh, self.gpus_per_node, axes, members)

    def route(self, axes, pattern: str = "ring", members: tuple[int, ...] | None = None) -> Route | None:
        """The route of the slowest class of groups over ``axes``; None when groups have one rank."""
        names = axes_of(self.mesh, axes)
        key = (names, pattern, members)
        if key in self._routes:
            return self._routes[key]
        classes = self.classes(names, members)
        if not names or not classes or classes[0].size < 2:
            return None
        intra, inter = self.hop_links(names)
        used: list[Link] = []
        for cls in classes:
            # an all-to-all joins every pair of members; a ring or chain only neighbours
            has_intra = cls.intra_hops > 0 or (pattern == "pairwise" and cls.nodes < cls.size)
            if has_intra and intra is not None and intra not in used:
                used.append(intra)
            if cls.crosses_nodes:
                if inter is None:
                    raise ValueError(f"groups over {'×'.join(names)} span nodes but cluster '{self.cluster.name}' has no cluster-scope link")
                if inter not in used:
                    used.append(inter)
        if not used:
            raise ValueError(f"cluster '{self.cluster.name}' has no link for groups over {'×'.join(names)}")
        slow = min(used, key=lambda lk: lk.bandwidth)
        route = Route(slow.name, slow.bandwidth, max(lk.latency for lk in used), any(c.crosses_nodes for c in classes), tuple(lk.name for lk in used))
        self._routes[key] = route
        return route
