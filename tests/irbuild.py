"""IR plans built in Python, without plan text, for the estimator and report tests: a
model, and a plan on a cluster of H100 nodes (nvlink inside a node, ib across); and the
plain definition of a mesh's groups, rank by rank, that dslc's group classes and the
generated mesh.py are checked against."""

from __future__ import annotations

from math import prod

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
from dslc.source import Span

SP = Span("x.plan", 1, 1, 1, 2)
GiB = 2**30


def model(arch="gpt2", l=2, h=64, a=4, V=128, s=32, kv=None, ffn=None, tie=None, dropout=0.0, experts=0, top_k=0, cf=0.0,
          name=None, rope_theta=1e4, router=None, z_loss=0.0, head_dim=0) -> Model:
    ffn = ffn or (4 * h if arch == "gpt2" else 3 * h)
    tie = (arch == "gpt2") if tie is None else tie
    router = ("topk_softmax" if experts else "") if router is None else router
    return Model(name or arch, arch, l, h, a, kv or a, ffn, V, s, 1e-5, rope_theta, tie, dropout, experts, top_k, cf, 0.0,
                 router, z_loss, SP, head_dim=head_dim)


def plan(mdl: Model, *axes, gpn=8, zero=0, sp=False, schedule="1f1b", v=1, m=1, b=1, precision="bf16",
         recompute="none", cp="ring", optimizer="adamw", momentum=0.0, memory=80 * GiB,
         bandwidth=(450e9, 50e9), latency=(2e-6, 8e-6), peak=989e12, name="p") -> Plan:
    """``axes``: (name, size, link) from the outermost; the global batch is b · m · dp · ep."""
    world = prod(size for _, size, _ in axes)
    gpn = min(gpn, world)
    links = (Link("nvlink", "node", bandwidth[0], latency[0], SP), Link("ib", "cluster", bandwidth[1], latency[1], SP))
    cluster = Cluster("dgx", world // gpn, gpn, Device("h100_sxm", peak, memory, 3.35e12), links, SP)
    mesh = Mesh(tuple(MeshAxis(n, size, lk, SP) for n, size, lk in axes), SP)
    dp = mesh.size("dp") * mesh.size("ep")
    opt = Optimizer(optimizer, 1e-4, (0.9, 0.95), 1e-8, 0.1, momentum, None)
    train = Train(10, b, b * m * dp, precision, recompute, 1.0, 0, "dynamic", opt, LRSchedule("constant", 0, 0.0, 10, None),
                  Data("synthetic", None, None, None), None, None)
    return Plan(name, f"{name}.plan", mdl, cluster, mesh, TensorParallel(sp, None), DataParallel(zero, None),
                Pipeline(schedule, v, m, None, None), ContextParallel(cp, True, None), train, SP)


def group(m: Mesh, name: str, rank: int) -> tuple[int, ...]:
    """The ranks of ``rank``'s group along axis ``name`` (itself when the axis is absent)."""
    ax, stride = m.axis(name), m.stride(name)
    if ax is None:
        return (rank,)
    base = rank - m.coords(rank)[name] * stride
    return tuple(base + i * stride for i in range(ax.size))


def groups(m: Mesh, name: str) -> tuple[tuple[int, ...], ...]:
    """Every group along axis ``name``, in order of their lowest rank."""
    return tuple(dict.fromkeys(group(m, name, r) for r in range(m.world_size)))
