"""How long ``dslc explain`` takes on 1k, 16k and 131k GPUs (issue 5, item 7).

Targets: 16,384 GPUs in under 2 s, 131,072 in under 10 s, growing no faster than linearly.
The peer, timed in the same run, is building the networkx cluster graph once (one vertex
and a few edges per GPU, :func:`dslc.cost.topology.build_graph`): the least any per-rank
method must do. explain does not build it (groups are handled per class, links charged
with numpy) and should stay well under it. The two alternate ``--repeats`` times (3) at
each size; a row gives each one's median time with its range (min-max) and the median of
the per-repeat ratios explain / peer with theirs; the targets are held to the median.
Run: ``python benchmarks/explain_scale.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import time

from common import Spread

from dslc.cost.topology import build_graph
from dslc.ir import (
    Cluster,
    ContextParallel,
    Data,
    DataParallel,
    Device,
    Link,
    LRSchedule,
    Mesh,
    MeshAxis,
    Model,
    Optimizer,
    Pipeline,
    Plan,
    TensorParallel,
    Train,
)
from dslc.report import explain as report
from dslc.source import Span

SPAN = Span("bench.plan", 1, 1, 1, 2)
TARGETS = {16_384: 2.0, 131_072: 10.0}


def gpt3_plan(nodes: int) -> Plan:
    """GPT-3 175B (Brown et al. 2020) on ``nodes`` DGX-H100 nodes: tp=8 inside a node,
    pp=16 across nodes, dp over the rest; interleaved 1F1B, ZeRO-1, sequence parallel."""
    model = Model("gpt3_175b", "gpt2", 96, 12288, 96, 96, 4 * 12288, 51200, 2048, 1e-5, 1e4, True, 0.0, 0, 0, 0.0, 0.0, "", 0.0, SPAN)
    links = (Link("nvlink", "node", 450e9, 2e-6, SPAN), Link("ib", "cluster", 50e9, 8e-6, SPAN))
    cluster = Cluster("dgx_h100", nodes, 8, Device("h100_sxm", 989e12, 80 * 2**30), links, SPAN)
    dp = nodes * 8 // (16 * 8)
    mesh = Mesh((MeshAxis("dp", dp, "ib", SPAN), MeshAxis("pp", 16, "ib", SPAN), MeshAxis("tp", 8, "nvlink", SPAN)), SPAN)
    m = 64
    opt = Optimizer("adamw", 6e-5, (0.9, 0.95), 1e-8, 0.1, 0.0, None)
    train = Train(100, 1, m * dp, "bf16", "selective", 1.0, 1, "dynamic", opt, LRSchedule("cosine", 10, 0.0, 100, None),
                  Data("synthetic", None, None, None), None, None)
    return Plan(f"gpt3_{nodes * 8}", "bench.plan", model, cluster, mesh, TensorParallel(True, None), DataParallel(1, None),
                Pipeline("interleaved_1f1b", 2, m, None, None), ContextParallel("ring", True, None), train, SPAN)


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.repeats} alternating repeats per size; seconds, median (min-max)")
    print(f"{'GPUs':>8}  {'explain':>21}  {'per GPU':>9}  {'peer: build_graph':>21}  {'explain / peer':>20}  target")
    ok, prev = True, None
    for nodes in (128, 2048, 16384):
        plan = gpt3_plan(nodes)
        n = plan.world_size
        ours, peers = [], []
        for _ in range(args.repeats):
            ours.append(seconds(lambda plan=plan: report.render_text(report.explain(plan))))
            peers.append(seconds(lambda plan=plan: build_graph(plan.cluster)))
        spread = Spread.of(ours)
        t = spread.median
        target = TARGETS.get(n)
        status = "" if target is None else (f"< {target:g} s " + ("ok" if t < target else "MISSED"))
        ok &= target is None or t < target
        ratio = Spread.of([a / b for a, b in zip(ours, peers)])
        print(f"{n:>8}  {spread.show():>21}  {t / n * 1e6:>7.2f}µs  {Spread.of(peers).show():>21}"
              f"  {ratio.show():>20}  {status}")
        if prev is not None:
            growth = (t / prev[1]) / (n / prev[0])
            print(f"{'':>8}  time grew {t / prev[1]:.1f}× for {n // prev[0]}× the GPUs ({growth:.2f} of linear)")
        prev = (n, t)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
