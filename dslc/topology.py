"""The cluster graph, the communication groups of a mesh, and the links they load.

Graph (networkx, :func:`build_graph`). Vertices: ``("gpu", rank)``; for every node-scope
link L and node n a hub ``("hub", L, n)`` (the NVSwitch of that node); for every
cluster-scope link L a NIC ``("nic", L, n)`` per node and one ``("switch", L)``. Edges:
GPU–hub and GPU–NIC carry the link's per-GPU bandwidth (``Link.bandwidth`` is per
direction per GPU); NIC–switch is the node's uplink, ``gpus_per_node × bandwidth``.
A hop between two GPUs of one node is GPU → hub → GPU; between nodes it is
GPU → NIC → switch → NIC → GPU.

Groups. rank = Σ coordinate × stride (last axis stride 1, :class:`dslc.ir.Mesh`). A group
over a set of axes A is ``base + offsets`` where the offsets are Σ iₐ·strideₐ in row-major
order (this is also NCCL's ring order: ranks ascending) and a base is a rank whose
A-coordinates are all 0. Whether a group crosses nodes depends only on
``base mod gpus_per_node``: node(base + off) − node(base) = ⌊(base mod g + off)/g⌋. So
every axis has at most ``gpus_per_node`` *classes* of identical groups, enumerated here
from residues without listing groups (:func:`group_classes`); times and the slowest link
are computed per class, never per pair of ranks.

Links used by a hop. Inside a node NCCL takes the fastest node-scope link (the axis's own
link if it is node-scope); between nodes the axis's cluster-scope link (else the cluster's
fastest). The slowest link a group crosses sets its bandwidth (NCCL's ring runs at the
speed of its slowest hop).

Traffic charged to links (:meth:`Topology.charge`): a ring puts each rank's wire bytes on
the hop to its successor; an all-to-all sends 1/(n−1) of them to every peer; a pipeline
chain sends forward to the next stage and backward to the previous one. Per-link bytes
are accumulated with numpy over ranks (linear), then reduced to the busiest edge of each
link (the per-GPU edges and the node uplinks).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from math import gcd

import networkx as nx
import numpy as np

from .ir import Cluster, Link, Mesh, Plan

PATTERNS = ("ring", "pairwise", "chain")


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


# ---------------------------------------------------------------------------- groups


def axes_of(mesh: Mesh, axes: tuple[str, ...] | str) -> tuple[str, ...]:
    """The axes of ``axes`` that the mesh has with size > 1, in mesh order."""
    want = {axes} if isinstance(axes, str) else set(axes)
    return tuple(a.name for a in mesh.axes if a.name in want and a.size > 1)


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


def group_classes(mesh: Mesh, gpus_per_node: int, axes: tuple[str, ...] | str, members: tuple[int, ...] | None = None) -> tuple[GroupClass, ...]:
    """Classes of identical groups along ``axes`` (positions ``members`` of each group
    only, e.g. the first and last pipeline stage), lowest example first."""
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


# ---------------------------------------------------------------------------- links

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
    overlap: str = "exposed"  # exposed | backward | attention | prefetch
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

    def call_seconds(self, topo: Topology) -> float:
        """latency × ring steps + wire bytes / bandwidth of the slowest link crossed."""
        route = topo.route(self.axes, "pairwise" if self.kind == "all_to_all" else "ring", self.members)
        if route is None:
            return 0.0
        n, wire = self.group, FACTOR[self.kind](self.group) * self.bytes_per_call
        return STEPS[self.kind](n) * route.latency + (wire / route.bandwidth if route.bandwidth > 0 else float("inf"))

    def seconds(self, topo: Topology) -> float:
        return self.calls * self.call_seconds(topo)


@dataclass(frozen=True)
class Route:
    """How the groups of an axis set reach each other: the slowest link any of their
    hops crosses sets ``bandwidth``; ``latency`` is that of the slowest-latency link."""

    link: str
    bandwidth: float
    latency: float
    crosses_nodes: bool
    links: tuple[str, ...]  # every physical link used, intra-node first


@dataclass(frozen=True)
class Flow:
    """Wire bytes one rank sends per step for one collective, for :meth:`Topology.charge`.

    ``bytes_by_stage[i]``: bytes a rank of pipeline stage i sends (one entry: every rank);
    for ``chain`` these go to the next stage and ``back_by_stage`` to the previous one;
    ``members``: the positions of each group that take part (default: all)."""

    axes: tuple[str, ...]
    pattern: str  # ring | pairwise | chain
    bytes_by_stage: tuple[float, ...]
    back_by_stage: tuple[float, ...] = ()
    members: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BusiestLink:
    link: str
    edge: tuple[tuple, tuple]  # graph vertices of the busiest edge
    bytes: float  # per step, in its busier direction
    bandwidth: float  # of that edge, per direction
    seconds: float  # bytes / bandwidth: time the edge is busy per step


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
        return cls(plan.cluster, plan.mesh)

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

    # ------------------------------------------------------------------ charging

    def charge_comms(self, stages) -> LinkLoads:
        """Charge traffic rows, one sequence of :class:`Comm` per pipeline stage."""
        p = len(stages)
        keyed: dict[tuple, tuple[list[float], list[float]]] = {}
        for s, rows in enumerate(stages):
            for c in rows:
                fw, bw = keyed.setdefault((c.axes, c.pattern, c.members), ([0.0] * p, [0.0] * p))
                (bw if c.back else fw)[s] += c.wire
        return self.charge([Flow(axes, pat, tuple(fw), tuple(bw) if pat == "chain" else (), mem) for (axes, pat, mem), (fw, bw) in keyed.items()])

    def charge(self, flows: list[Flow]) -> LinkLoads:
        """Charge every flow to the physical links its hops cross (numpy over ranks)."""
        n, g = self.mesh.world_size, self.gpus_per_node
        ranks = np.arange(n, dtype=np.int64)
        node = ranks // g
        stage = (ranks // self.mesh.stride("pp")) % self.mesh.size("pp") if self.mesh.size("pp") > 1 else np.zeros(n, dtype=np.int64)
        loads = LinkLoads(self, {}, {}, {}, {})
        for fl in flows:
            names = axes_of(self.mesh, fl.axes)
            if not names:
                continue
            off = offsets(self.mesh, names)
            size = len(off)
            pos = np.zeros(n, dtype=np.int64)
            for a in names:
                pos = pos * self.mesh.size(a) + (ranks // self.mesh.stride(a)) % self.mesh.size(a)
            base = ranks - off[pos]
            sel = list(range(size)) if fl.members is None else list(fl.members)
            index = np.full(size, -1, dtype=np.int64)
            index[sel] = np.arange(len(sel))
            part = index[pos] >= 0
            src, k = ranks[part], index[pos[part]]
            w = np.asarray(fl.bytes_by_stage, dtype=np.float64)[stage[src] if len(fl.bytes_by_stage) > 1 else 0] * np.ones(len(src))
            sel_off = off[sel]
            intra, inter = self.hop_links(names)
            if fl.pattern == "pairwise":
                key = base[part] * (n // g + 1) + node[src]
                _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
                same = cnt[inv] - 1
                per_peer = w / max(len(sel) - 1, 1)
                loads.add(intra, src, per_peer * same, node, cross=False)
                loads.add(inter, src, per_peer * (len(sel) - 1 - same), node, cross=True)
                continue
            dst = base[part] + sel_off[(k + 1) % len(sel)]
            loads.hop(intra, inter, src, dst, w, node)
            if fl.pattern == "chain" and fl.back_by_stage:
                back = np.asarray(fl.back_by_stage, dtype=np.float64)[stage[src]]
                prev = base[part] + sel_off[(k - 1) % len(sel)]
                loads.hop(intra, inter, src, prev, back, node)
        return loads


@dataclass
class LinkLoads:
    """Bytes per step on every edge direction: ``gpu_out/gpu_in[link][rank]`` (the GPU's
    edge to its hub or NIC), ``node_up/node_down[link][node]`` (NIC–switch)."""

    topo: Topology
    gpu_out: dict[str, np.ndarray]
    gpu_in: dict[str, np.ndarray]
    node_up: dict[str, np.ndarray]
    node_down: dict[str, np.ndarray]

    def _arr(self, table: dict, link: str, size: int) -> np.ndarray:
        if link not in table:
            table[link] = np.zeros(size)
        return table[link]

    def add(self, link: Link | None, src: np.ndarray, w: np.ndarray, node: np.ndarray, cross: bool) -> None:
        """Symmetric traffic (all-to-all): what a rank sends on ``link`` it also receives."""
        if link is None or not np.any(w):
            return
        n, nodes = len(node), self.topo.cluster.nodes
        np.add.at(self._arr(self.gpu_out, link.name, n), src, w)
        np.add.at(self._arr(self.gpu_in, link.name, n), src, w)
        if cross:
            up = np.bincount(node[src], weights=w, minlength=nodes)
            self._arr(self.node_up, link.name, nodes)[:] += up
            self._arr(self.node_down, link.name, nodes)[:] += up

    def hop(self, intra: Link | None, inter: Link | None, src: np.ndarray, dst: np.ndarray, w: np.ndarray, node: np.ndarray) -> None:
        """Point-to-point hops src[i] → dst[i] carrying w[i] bytes."""
        n, nodes = len(node), self.topo.cluster.nodes
        same = node[src] == node[dst]
        for link, mask, cross in ((intra, same, False), (inter, ~same, True)):
            if link is None or not np.any(mask & (w > 0)):
                continue
            s, d, x = src[mask], dst[mask], w[mask]
            np.add.at(self._arr(self.gpu_out, link.name, n), s, x)
            np.add.at(self._arr(self.gpu_in, link.name, n), d, x)
            if cross:
                np.add.at(self._arr(self.node_up, link.name, nodes), node[s], x)
                np.add.at(self._arr(self.node_down, link.name, nodes), node[d], x)

    def edge_bytes(self, u: tuple, v: tuple) -> tuple[float, float]:
        """(bytes u→v, bytes v→u) per step on the graph edge u–v."""
        for a, b, flip in ((u, v, False), (v, u, True)):
            if a[0] == "gpu" and b[0] in ("hub", "nic"):
                out, inn = self.gpu_out.get(b[1]), self.gpu_in.get(b[1])
                pair = (float(out[a[1]]) if out is not None else 0.0, float(inn[a[1]]) if inn is not None else 0.0)
                return pair[::-1] if flip else pair
            if a[0] == "nic" and b[0] == "switch":
                up, down = self.node_up.get(a[1]), self.node_down.get(a[1])
                pair = (float(up[a[2]]) if up is not None else 0.0, float(down[a[2]]) if down is not None else 0.0)
                return pair[::-1] if flip else pair
        raise KeyError(f"no edge {u}–{v} in the cluster graph")

    def annotate(self, graph: nx.Graph) -> nx.Graph:
        """Write ``bytes`` (busier direction) on every edge of ``graph``; returns it."""
        for u, v, data in graph.edges(data=True):
            data["bytes"] = max(self.edge_bytes(u, v))
        return graph

    def busiest(self) -> list[BusiestLink]:
        """The busiest edge of every link (per-GPU edges and, for cluster links, node uplinks)."""
        g = self.topo.gpus_per_node
        out: list[BusiestLink] = []
        for lk in self.topo.cluster.links:
            kind = "hub" if lk.scope == "node" else "nic"
            best = None
            if lk.name in self.gpu_out or lk.name in self.gpu_in:
                both = np.maximum(self.gpu_out.get(lk.name, 0.0), self.gpu_in.get(lk.name, 0.0))
                r = int(np.argmax(both))
                best = BusiestLink(lk.name, (("gpu", r), (kind, lk.name, r // g)), float(both[r]), lk.bandwidth, float(both[r]) / lk.bandwidth)
            if lk.name in self.node_up:
                both = np.maximum(self.node_up[lk.name], self.node_down[lk.name])
                nd = int(np.argmax(both))
                up = BusiestLink(lk.name, (("nic", lk.name, nd), ("switch", lk.name)), float(both[nd]), lk.bandwidth * g, float(both[nd]) / (lk.bandwidth * g))
                if best is None or up.seconds > best.seconds:
                    best = up
            if best is not None and best.bytes > 0:
                out.append(best)
        return out

