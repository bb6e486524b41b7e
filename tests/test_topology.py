"""The cluster graph, communication groups and link charging on hand-checkable meshes."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from irbuild import groups

from dslc.cost.collectives import Comm
from dslc.cost.links import Flow, charge, charge_comms
from dslc.cost.topology import Topology, build_graph, hop_path
from dslc.groups import axis_crossing, group_classes
from dslc.ir import Cluster, Device, Link, Mesh, MeshAxis
from dslc.source import Span

SP = Span("x.plan", 1, 1, 1, 2)
NVLINK = Link("nvlink", "node", 450e9, 2e-6, SP)
IB = Link("ib", "cluster", 50e9, 8e-6, SP)


def cluster(nodes: int = 2, gpn: int = 8, links=(NVLINK, IB)) -> Cluster:
    return Cluster("c", nodes, gpn, Device("h100_sxm", 989e12, 80 * 2**30), tuple(links), SP)


def mesh(*axes: tuple[str, int, str]) -> Mesh:
    return Mesh(tuple(MeshAxis(n, s, lk, SP) for n, s, lk in axes), SP)


# ---------------------------------------------------------------------------- graph


def test_graph_has_gpus_hubs_nics_and_one_switch_per_cluster_link():
    g = build_graph(cluster(2, 8))
    kinds = Counter(v[0] for v in g.nodes)
    assert kinds == {"gpu": 16, "hub": 2, "nic": 2, "switch": 1}
    assert g.number_of_edges() == 16 + 16 + 2  # gpu–hub, gpu–nic, nic–switch
    assert g.edges[("gpu", 9), ("hub", "nvlink", 1)]["bandwidth"] == 450e9
    assert g.edges[("gpu", 9), ("nic", "ib", 1)]["bandwidth"] == 50e9
    assert g.edges[("nic", "ib", 1), ("switch", "ib")]["bandwidth"] == 8 * 50e9  # the node's uplink
    assert not g.has_edge(("gpu", 9), ("hub", "nvlink", 0))


def test_hop_paths_exist_in_the_graph():
    c = cluster(2, 8)
    g = build_graph(c)
    inside = hop_path(c, 1, 5, NVLINK)
    across = hop_path(c, 1, 9, IB)
    assert inside == (("gpu", 1), ("hub", "nvlink", 0), ("gpu", 5))
    assert across == (("gpu", 1), ("nic", "ib", 0), ("switch", "ib"), ("nic", "ib", 1), ("gpu", 9))
    for path in (inside, across):
        assert all(g.has_edge(a, b) for a, b in itertools.pairwise(path))
    with pytest.raises(ValueError, match="different nodes"):
        hop_path(c, 1, 9, NVLINK)


# ---------------------------------------------------------------------------- groups


def test_dp_groups_on_two_nodes_cross_at_every_hop():
    m = mesh(("dp", 2, "ib"), ("tp", 8, "nvlink"))
    (dp,) = group_classes(m, 8, "dp")
    assert dp.example == (0, 8) and dp.count == 8 and dp.nodes == 2 and dp.cross_hops == 2
    (tp,) = group_classes(m, 8, "tp")
    assert tp.example == tuple(range(8)) and tp.count == 2 and tp.nodes == 1 and tp.cross_hops == 0
    topo = Topology(cluster(), m)
    assert topo.route("dp").link == "ib" and topo.route("dp").crosses_nodes
    assert topo.route("tp").link == "nvlink" and not topo.route("tp").crosses_nodes


def _brute_force(m: Mesh, gpn: int, axis: str) -> Counter:
    """Every group's node pattern (relative to its first rank's node), counted."""
    return Counter(tuple(r // gpn - grp[0] // gpn for r in grp) for grp in groups(m, axis))


@pytest.mark.parametrize(
    "axes, gpn, axis",
    [
        ((("dp", 4, "ib"), ("tp", 6, "nvlink")), 8, "dp"),  # stride 6 on 8-GPU nodes: 3 patterns
        ((("dp", 3, "ib"), ("pp", 4, "ib"), ("tp", 2, "nvlink")), 4, "pp"),
        ((("dp", 6, "ib"), ("cp", 2, "ib"), ("tp", 2, "nvlink")), 8, "dp"),
        ((("tp", 2, "nvlink"), ("dp", 8, "ib")), 8, "tp"),
        ((("ep", 5, "ib"), ("tp", 3, "nvlink")), 4, "ep"),
    ],
)
def test_classes_agree_with_listing_every_group(axes, gpn, axis):
    m = mesh(*axes)
    classes = group_classes(m, gpn, axis)
    got = Counter()
    for cls in classes:
        got[tuple(r // gpn - cls.example[0] // gpn for r in cls.example)] += cls.count
        assert cls.example in groups(m, axis)
    assert got == _brute_force(m, gpn, axis)
    assert sum(c.count for c in classes) == len(groups(m, axis))


def test_stride_six_on_eight_gpu_nodes_has_three_classes():
    (a, b, c) = group_classes(mesh(("dp", 4, "ib"), ("tp", 6, "nvlink")), 8, "dp")
    # bases 0,1 → nodes 0,0,1,2; bases 2,3 → 0,1,1,2; bases 4,5 → 0,1,2,2
    assert [x.example for x in (a, b, c)] == [(0, 6, 12, 18), (2, 8, 14, 20), (4, 10, 16, 22)]
    assert [x.count for x in (a, b, c)] == [2, 2, 2]
    assert [x.cross_hops for x in (a, b, c)] == [3, 3, 3]  # two forward crossings + the wrap


def test_axis_crossing():
    assert axis_crossing(mesh(("dp", 2, "ib"), ("tp", 8, "nvlink")), 8, "tp") is None
    assert axis_crossing(mesh(("tp", 16, "nvlink"),), 8, "tp") == (tuple(range(16)), 1, 8)
    assert axis_crossing(mesh(("tp", 2, "nvlink"), ("dp", 8, "ib")), 8, "tp") == ((0, 8), 8, 8)
    # tp=4 with stride 3 on 8-GPU nodes: group (0,3,6,9) is the first to cross, at rank 8
    assert axis_crossing(mesh(("tp", 4, "nvlink"), ("dp", 3, "ib")), 8, "tp") == ((0, 3, 6, 9), 3, 8)
    assert axis_crossing(mesh(("dp", 2, "ib"),), 8, "pp") is None  # absent axis


def test_classes_of_a_large_mesh_stay_few():
    m = mesh(("dp", 1024, "ib"), ("pp", 16, "ib"), ("tp", 8, "nvlink"))
    for axis in ("dp", "pp", "tp"):
        classes = group_classes(m, 8, axis)
        assert len(classes) == 1
        assert classes[0].count * classes[0].size == 131072


# ---------------------------------------------------------------------------- charging


def test_dp_all_reduce_on_two_nodes_charges_ib_only():
    """dp=2 × tp=8: every dp pair (r, r+8) crosses; a ring all-reduce of S bytes puts
    2(n−1)/n·S = S on each GPU's NIC edge both ways and 8·S on each node uplink."""
    S = 1000.0
    topo = Topology(cluster(), mesh(("dp", 2, "ib"), ("tp", 8, "nvlink")))
    row = Comm("dp", ("dp",), "all_reduce", "grads", 1, int(S), 2)
    assert row.wire == S
    g = charge_comms(topo, [[row]]).annotate(topo.graph)
    for r in range(16):
        assert g.edges[("gpu", r), ("nic", "ib", r // 8)]["bytes"] == S
        assert g.edges[("gpu", r), ("hub", "nvlink", r // 8)]["bytes"] == 0
    for n in range(2):
        assert g.edges[("nic", "ib", n), ("switch", "ib")]["bytes"] == 8 * S
    assert row.call_seconds(topo) == pytest.approx(2 * 8e-6 + S / 50e9)


def test_tp_ring_across_two_nodes_crosses_twice():
    """tp=16 on 2 × 8: ring 0→1→…→15→0; hops 7→8 and 15→0 go over ib, the rest nvlink."""
    W = 10.0
    topo = Topology(cluster(), mesh(("tp", 16, "nvlink"),))
    loads = charge(topo, [Flow(("tp",), "ring", (W,))])
    for r in range(16):
        over_ib = r in (7, 15)
        assert loads.edge_bytes(("gpu", r), ("nic", "ib", r // 8))[0] == (W if over_ib else 0)
        assert loads.edge_bytes(("gpu", r), ("hub", "nvlink", r // 8))[0] == (0 if over_ib else W)
    assert loads.edge_bytes(("gpu", 8), ("nic", "ib", 1)) == (0, W)  # receives from 7
    assert loads.edge_bytes(("nic", "ib", 0), ("switch", "ib")) == (W, W)  # 7 out, 0 in
    route = topo.route("tp")
    assert route.link == "ib" and route.links == ("nvlink", "ib") and route.latency == 8e-6


def test_all_to_all_splits_bytes_between_node_and_cluster_links():
    """ep=4 with stride 2 on 2 nodes × 4: group {0,2,4,6} has one peer in the node and two
    outside; each rank's (n−1)/n·S wire bytes go 1/3 to nvlink and 2/3 to ib."""
    W = 3.0
    topo = Topology(cluster(2, 4), mesh(("ep", 4, "ib"), ("tp", 2, "nvlink")))
    loads = charge(topo, [Flow(("ep",), "pairwise", (W,))])
    for r in range(8):
        assert loads.edge_bytes(("gpu", r), ("hub", "nvlink", r // 4)) == (1.0, 1.0)
        assert loads.edge_bytes(("gpu", r), ("nic", "ib", r // 4)) == (2.0, 2.0)
    assert loads.edge_bytes(("nic", "ib", 0), ("switch", "ib")) == (8.0, 8.0)
    assert topo.route("ep", "pairwise").links == ("nvlink", "ib")


def test_pipeline_chain_sends_forward_and_backward():
    topo = Topology(cluster(), mesh(("pp", 2, "ib"), ("tp", 8, "nvlink")))
    loads = charge(topo, [Flow(("pp",), "chain", (5.0, 0.0), (0.0, 7.0))])
    assert loads.edge_bytes(("gpu", 3), ("nic", "ib", 0)) == (5.0, 7.0)
    assert loads.edge_bytes(("gpu", 11), ("nic", "ib", 1)) == (7.0, 5.0)
    assert loads.edge_bytes(("nic", "ib", 0), ("switch", "ib")) == (40.0, 56.0)
    # busiest = longest busy time; the uplink (56 B at 8 × 50 GB/s) ties with a GPU edge
    (busy,) = loads.busiest()
    assert busy.link == "ib" and busy.bytes == 7.0 and busy.seconds == pytest.approx(7.0 / 50e9)
    assert busy.edge == (("gpu", 0), ("nic", "ib", 0))


def test_members_restrict_a_ring_to_first_and_last_stage():
    topo = Topology(cluster(1, 8), mesh(("pp", 4, "nvlink"), ("tp", 2, "nvlink")))
    loads = charge(topo, [Flow(("pp",), "ring", (4.0, 0.0, 0.0, 4.0), members=(0, 3))])
    sent = [loads.edge_bytes(("gpu", r), ("hub", "nvlink", 0))[0] for r in range(8)]
    assert sent == [4.0, 4.0, 0, 0, 0, 0, 4.0, 4.0]
    assert [c.example for c in topo.classes("pp", (0, 3))] == [(0, 6)]


def test_without_a_node_link_intra_node_hops_loop_through_the_nic():
    topo = Topology(cluster(2, 2, links=(IB,)), mesh(("dp", 4, "ib"),))
    loads = charge(topo, [Flow(("dp",), "ring", (1.0,))])
    # ring 0→1 (same node), 1→2 (across), 2→3 (same), 3→0 (across)
    assert [loads.edge_bytes(("gpu", r), ("nic", "ib", r // 2))[0] for r in range(4)] == [1.0] * 4
    assert loads.edge_bytes(("nic", "ib", 0), ("switch", "ib")) == (1.0, 1.0)


def test_mesh_must_match_cluster():
    with pytest.raises(ValueError, match="16 GPUs"):
        Topology(cluster(), mesh(("dp", 4, "ib"),))


# ---------------------------------------------------------------------------- against brute force


@st.composite
def meshes(draw):
    names = draw(st.permutations(["dp", "pp", "tp", "cp"]))[: draw(st.integers(1, 4))]
    axes = tuple((n, draw(st.integers(1, 5)), "ib") for n in names)
    return mesh(*axes), draw(st.sampled_from([1, 2, 3, 4, 8])), draw(st.sampled_from(names))


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_classes_and_ring_charges_match_a_walk_over_every_group(case):
    m, gpn, axis = case
    assume(m.world_size % gpn == 0)
    assert Counter({tuple(r // gpn - c.example[0] // gpn for r in c.example): c.count for c in group_classes(m, gpn, axis)}) \
        == _brute_force(m, gpn, axis)
    topo = Topology(cluster(m.world_size // gpn, gpn), m)
    loads = charge(topo, [Flow((axis,), "ring", (1.0,))])
    out = {("nvlink", r): 0.0 for r in range(m.world_size)} | {("ib", r): 0.0 for r in range(m.world_size)}
    up = Counter()
    for grp in groups(m, axis):
        if len(grp) < 2:
            continue
        for a, b in zip(grp, grp[1:] + grp[:1]):
            link = "nvlink" if a // gpn == b // gpn else "ib"
            out[link, a] += 1.0
            up[a // gpn] += link == "ib"
    for (link, r), expected in out.items():
        kind = "hub" if link == "nvlink" else "nic"
        assert loads.edge_bytes(("gpu", r), (kind, link, r // gpn))[0] == expected
    for n in range(m.world_size // gpn):
        assert loads.edge_bytes(("nic", "ib", n), ("switch", "ib"))[0] == up[n]
