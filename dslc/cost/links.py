"""The bytes a step puts on every physical link of the cluster graph.

Traffic charged to links (:func:`charge`): a ring puts each rank's wire bytes on
the hop to its successor; an all-to-all sends 1/(n−1) of them to every peer; a pipeline
chain sends forward to the next stage and backward to the previous one. Per-link bytes
are accumulated with numpy over ranks (linear), then reduced to the busiest edge of each
link (the per-GPU edges and the node uplinks).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from ..groups import axes_of, offsets
from ..ir import Link
from .topology import Topology


@dataclass(frozen=True)
class Flow:
    """Wire bytes one rank sends per step for one collective, for :func:`charge`.

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


def charge_comms(topo: Topology, stages) -> LinkLoads:
    """Charge traffic rows, one sequence of :class:`Comm` per pipeline stage."""
    p = len(stages)
    keyed: dict[tuple, tuple[list[float], list[float]]] = {}
    for s, rows in enumerate(stages):
        for c in rows:
            fw, bw = keyed.setdefault((c.axes, c.pattern, c.members), ([0.0] * p, [0.0] * p))
            (bw if c.back else fw)[s] += c.wire
    return charge(topo, [Flow(axes, pat, tuple(fw), tuple(bw) if pat == "chain" else (), mem) for (axes, pat, mem), (fw, bw) in keyed.items()])


def charge(topo: Topology, flows: list[Flow]) -> LinkLoads:
    """Charge every flow to the physical links its hops cross (numpy over ranks)."""
    n, g = topo.mesh.world_size, topo.gpus_per_node
    ranks = np.arange(n, dtype=np.int64)
    node = ranks // g
    stage = (ranks // topo.mesh.stride("pp")) % topo.mesh.size("pp") if topo.mesh.size("pp") > 1 else np.zeros(n, dtype=np.int64)
    loads = LinkLoads(topo, {}, {}, {}, {})
    for fl in flows:
        names = axes_of(topo.mesh, fl.axes)
        if not names:
            continue
        off = offsets(topo.mesh, names)
        size = len(off)
        pos = np.zeros(n, dtype=np.int64)
        for a in names:
            pos = pos * topo.mesh.size(a) + (ranks // topo.mesh.stride(a)) % topo.mesh.size(a)
        base = ranks - off[pos]
        sel = list(range(size)) if fl.members is None else list(fl.members)
        index = np.full(size, -1, dtype=np.int64)
        index[sel] = np.arange(len(sel))
        part = index[pos] >= 0
        src, k = ranks[part], index[pos[part]]
        w = np.asarray(fl.bytes_by_stage, dtype=np.float64)[stage[src] if len(fl.bytes_by_stage) > 1 else 0] * np.ones(len(src))
        sel_off = off[sel]
        intra, inter = topo.hop_links(names)
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

