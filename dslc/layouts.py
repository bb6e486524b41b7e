"""``dslc search``: the layouts of a plan's model on its cluster, ranked by the step time
``dslc explain`` estimates.

A layout is everything a plan says of how the model is spread and run: the degrees of dp,
tp, pp, cp and ep and their order on the links, the ZeRO stage and HSDP shard, the schedule
and its virtual stages, the micro-batch size (and so the count, at the plan's global batch),
the recompute policy, sequence parallelism and the context-parallel method. The model,
cluster, data and training settings stay the plan's.

A candidate is kept only when it passes every rule of :func:`dslc.check.check_plan`
without an error or a warning and fits (:func:`dslc.search.fits`, the test behind E090):
the search never holds a second copy of a rule. It prunes instead of costing everything
(Alpa and Galvatron prune the same way, by memory first; Megatron's auto-configurator
too):

1. **shapes** — the degrees whose product is the GPU count and whose data-parallel ranks
   divide the global batch; tp within a node (across nodes it is W035), one order of the
   axes per placement (orders that put the same axes on the same links cost the same);
2. **memory bound** — a shape whose most frugal layout (the highest zero stage, full
   recompute, micro-batches of one, 1f1b) does not fit is dropped with all its variants;
3. **shape ranking** — each surviving shape is costed once, at a probe (1f1b, micro-batches
   of one, the fastest zero and recompute that fit); the best ``beam`` shapes, and the plan's
   own, go on;
4. **the rest** — for those shapes every schedule, virtual-stage count, micro-batch size,
   sequence-parallel and cp-method choice, each with the *fastest knobs that fit*: for each
   zero stage the lightest recompute that fits (a staircase: a higher stage never needs
   more recompute), then costed.

Dominated choices are not costed: gpipe (1f1b has its bubble with fewer activations held),
and sequence parallelism off under tp (the same bytes as tp's all-reduce and 1/tp of the
activations: Korthikanti et al. 2022, §4.2.2) unless the plan turns it off itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from .check import check_plan
from .cost import memory as mem
from .cost.time import Timing, timing
from .cost.topology import Topology
from .groups import axis_crossing
from .ir import Cluster, MeshAxis, Plan
from .search import fits

AXIS_ORDER = ("dp", "pp", "cp", "ep", "tp")  # the plans' usual order, outermost first
RECOMPUTE = (("none", 1), ("selective", 1), ("selective_ops", 1), ("full", 2), ("full", 1))  # most saved first
VIRTUAL = (2, 3, 4, 6, 8)  # interleaved_1f1b's virtual stages tried
MAX_MICRO_BATCH = 16
BEAM = 8  # shapes kept after the probe, and frames after the schedules


class SearchError(Exception):
    """The search cannot start (a GPU count the cluster cannot be cut to): one line."""


@dataclass(frozen=True)
class Found:
    """A layout that passes every check and fits, with its estimate."""

    plan: Plan
    timing: Timing
    peak: int  # bytes on the worst rank
    changes: tuple[str, ...]  # how it differs from the plan as written

    @property
    def headroom(self) -> int:
        return self.plan.cluster.device.memory - self.peak


@dataclass
class Result:
    plan: Plan  # the plan as written (on the searched cluster)
    ranked: list[Found]  # fastest first
    shapes: int = 0  # degree and order combinations enumerated
    memory_pruned: int = 0  # shapes dropped by the memory bound
    rule_pruned: int = 0  # shapes no layout of which passes the rules
    costed: int = 0  # layouts whose step was estimated
    checked: int = 0  # layouts put through the rules
    own: Found | None = None  # the plan as written, if it passes and fits
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- the cluster


def resize(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster with ``gpus`` GPUs of the same nodes and links: whole nodes, or part of
    one node (whose cluster-scope links then go unused)."""
    g = cluster.gpus_per_node
    if gpus < 1:
        raise SearchError(f"--gpus must be at least 1, got {gpus}")
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degrees(plan: Plan, world: int) -> Iterator[dict[str, int]]:
    """{axis: size} with the product ``world``, dp·ep dividing the global batch, tp inside
    a node, pp at most the layers, ep dividing the experts (1 for a dense model)."""
    m, gpn = plan.model, plan.cluster.gpus_per_node
    ds = _divisors(world)
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


def _spans(plan: Plan) -> dict:
    """The plan's spans without those of what a search changes (a warning about a key the
    user wrote, such as W057's pipeline options without pp, is about their plan)."""
    changed = ("mesh.", "pipeline", "data_parallel", "tensor_parallel", "context_parallel", "train.micro_batch", "train.recompute")
    return {k: s for k, s in plan.spans.items() if not k.startswith(changed)}


def _with(plan: Plan, mesh, schedule: str, v: int, mb: int, sp: bool, method: str, zero: int = 0,
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


FIXABLE = ("mesh", "schedule", "micro_batch", "zero", "recompute", "sp", "cp")  # what --fix keeps as written


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
    if "recompute" in fixed:
        return [(plan.train.recompute, plan.train.recompute_every)]
    return [r for r in RECOMPUTE if not (r[0] == "full" and r[1] == 2 and plan.model.layers < 2)]


# ---------------------------------------------------------------------------- the search


class Searcher:
    """One search: the rules, the memory test and the estimate of each layout, once each."""

    def __init__(self, plan: Plan, settings: mem.Settings = mem.DEFAULT, fixed=frozenset()):
        self.plan, self.settings, self.fixed = plan, settings, fixed
        self.checked = self.costed = 0
        self._ok: dict[Plan, bool] = {}
        self._fit: dict[Plan, tuple[bool, int]] = {}
        self._cost: dict[Plan, Found] = {}

    def passes(self, p: Plan) -> bool:
        """No error and no warning of any rule (the written plan must lint clean)."""
        if p not in self._ok:
            self.checked += 1
            self._ok[p] = not any(d.severity.value in ("error", "warning") for d in check_plan(p, files=False))
        return self._ok[p]

    def fit(self, p: Plan) -> tuple[bool, int]:
        if p not in self._fit:
            try:
                self._fit[p] = fits(p, self.settings)
            except ValueError:  # no schedule for these numbers: the rules said why
                self._fit[p] = (False, 0)
        return self._fit[p]

    def cost(self, p: Plan, peak: int) -> Found:
        if p not in self._cost:
            self.costed += 1
            t, _ = timing(p, Topology.of(p), self.settings)
            self._cost[p] = Found(p, t, peak, changes(self.plan, p))
        return self._cost[p]

    def fastest_knobs(self, frame: Callable[..., Plan], mesh, corners: bool = False) -> Iterator[tuple[Plan, int]]:
        """For each zero stage, the lightest recompute that passes and fits: the frame's
        layouts worth costing. A stage that shards more never needs more recompute, so the
        walk starts from the last stage's policy and goes down while a lighter one fits
        (up while none does): a staircase, a couple of memory tests per stage. ``corners``:
        only the first stage and those that lighten the recompute (a higher stage at the same
        recompute moves more bytes for the same work: worth costing only at the end)."""
        policies = recompute_policies(self.plan, self.fixed)

        def ok(zero: int, shard: int, j: int) -> tuple[Plan, int] | None:
            p = frame(zero=zero, shard=shard, recompute=policies[j])
            if not self.passes(p):
                return None
            fit, peak = self.fit(p)
            return (p, peak) if fit else None

        j, last = 0, None
        for zero, shard in zero_stages(self.plan, mesh, self.fixed):
            found = ok(zero, shard, j)
            if found:
                while j > 0 and (lighter := ok(zero, shard, j - 1)):
                    j, found = j - 1, lighter
            else:
                up = next(((k, f) for k in range(j + 1, len(policies)) if (f := ok(zero, shard, k))), None)
                if up is None:
                    continue
                j, found = up
            if not corners or last is None or j < last:
                yield found
            last = j if last is None else min(last, j)

    def frugal(self, mesh, sp: bool) -> bool | None:
        """Whether the most frugal layout of the mesh (the highest zero stage the rules
        allow, full recompute, micro-batches of one, 1f1b) fits: if not, no variant does.
        None when no such layout passes the rules (a shape the model cannot take)."""
        # the most sharded first: the highest stage, over every dp rank (shard 0), then wider shards
        stages = sorted(zero_stages(self.plan, mesh, self.fixed), key=lambda z: (-z[0], z[1] != 0, -z[1]))
        frugal = recompute_policies(self.plan, self.fixed)[-1]
        pp, fixed = mesh_size(mesh, "pp"), self.fixed
        shapes = schedules(self.plan, pp, fixed) if "schedule" in fixed else [("1f1b", 1), ("zb_h1", 1)] if pp > 1 else [("1f1b", 1)]
        mb = self.plan.train.micro_batch if "micro_batch" in fixed else 1
        for (zero, shard), (schedule, v), method in itertools.product(stages, shapes, _methods(self.plan, mesh_size(mesh, "cp"), fixed)):
            p = _with(self.plan, mesh, schedule, v, mb, sp, method, zero, shard, frugal)
            if self.passes(p):
                return self.fit(p)[0]
        return None


def mesh_size(mesh, name: str) -> int:
    return next((a.size for a in mesh.axes if a.name == name), 1)


def _methods(plan: Plan, cp: int, fixed=()) -> list[str]:
    if cp == 1 or "cp" in fixed:
        return [plan.context_parallel.method]
    return ["ring", "ulysses"]


def _sp_choices(plan: Plan, tp: int, fixed=()) -> list[bool]:
    if tp == 1:
        return [False]
    if "sp" in fixed:
        return [plan.tensor_parallel.sequence_parallel]
    return [True, False] if not plan.tensor_parallel.sequence_parallel and "tensor_parallel.sequence_parallel" in plan.spans else [True]


def search(plan: Plan, gpus: int | None = None, beam: int = BEAM, progress=None,
           settings: mem.Settings = mem.DEFAULT, fixed: frozenset[str] = frozenset()) -> Result:
    """The layouts of ``plan``'s model on its cluster (resized to ``gpus``) that pass the
    rules and fit, fastest first: every shape the memory bound leaves is costed at a probe,
    then the best ``beam`` shapes (and the plan's own) at every schedule, cp method and
    sequence-parallel choice, then the best ``beam`` of those at every micro-batch size;
    each at the fastest zero and recompute that fit. ``fixed``: the settings of
    :data:`FIXABLE` kept as the plan writes them."""
    cluster = resize(plan.cluster, gpus) if gpus else plan.cluster
    base = replace(plan, cluster=cluster, spans=_spans(plan))
    own = replace(plan, cluster=cluster)
    s = Searcher(own, settings, fixed)
    result = Result(own, [])
    written = {n: plan.mesh.size(n) for n in AXIS_ORDER}
    shapes = [(m, sizes) for sizes in degrees(base, cluster.world_size) if "mesh" not in fixed or sizes == written
              for m in meshes(base, sizes)]
    result.shapes = len(shapes)
    bar = progress or _Silent()
    bar.total(len(shapes) + 2 * beam)

    def per_rank(sizes) -> int:
        return base.train.global_batch // (sizes["dp"] * sizes["ep"])

    def best(frames, corners=True) -> list[tuple[float, tuple]]:
        """(fastest step, frame) of each frame with a layout that fits, fastest first."""
        out = []
        for key in frames:
            mesh, schedule, v, mb, sp, method = key
            found = [s.cost(p, peak) for p, peak in s.fastest_knobs(_frame(base, mesh, schedule, v, mb, sp, method), mesh, corners)]
            result.ranked += found
            if found:
                out.append((min(f.timing.step for f in found), key))
        return sorted(out, key=lambda x: x[0])

    # 1, 2: shapes and the memory bound; 3: a probe of each (1f1b, the smallest micro-batches)
    probes = []
    for mesh, sizes in shapes:
        bar.advance(1, f"shapes ({s.costed} layouts costed)")
        sp = _sp_choices(base, sizes["tp"], fixed)[0]
        frugal = s.frugal(mesh, sp)
        if not frugal:
            result.memory_pruned += frugal is False
            result.rule_pruned += frugal is None
            continue
        (schedule, v), mbs = schedules(base, sizes["pp"], fixed)[0], micro_batches(base, per_rank(sizes), fixed)
        ranked = best([(mesh, schedule, v, mbs[0], sp, m) for m in _methods(base, sizes["cp"], fixed)]) if mbs else []
        if ranked:
            probes.append((ranked[0][0], _same_mesh(mesh, plan.mesh), mesh, sizes))
    fastest: dict[tuple, tuple] = {}  # per degrees, the order whose probe is fastest
    for x in sorted(probes, key=lambda x: x[0]):
        fastest.setdefault(tuple(sorted(x[3].items())), x)
    kept = [x for i, x in enumerate(fastest.values()) if i < beam or x[1]]

    # 4: every schedule, cp method and sp choice of the kept shapes, then every micro-batch size of the best
    frames = [(mesh, schedule, v, micro_batches(base, per_rank(sizes), fixed)[0], sp, method) for _, _, mesh, sizes in kept
              for (schedule, v), sp, method in itertools.product(
                  schedules(base, sizes["pp"], fixed), _sp_choices(base, sizes["tp"], fixed), _methods(base, sizes["cp"], fixed))]
    ranked = []
    for frame in frames:
        bar.advance(beam / len(frames), f"schedules ({s.costed} layouts costed)")
        ranked += best([frame])
    ranked.sort(key=lambda x: x[0])
    sizes_of = {id(mesh): sizes for _, _, mesh, sizes in kept}
    frames = [(mesh, schedule, v, mb, sp, method) for _, (mesh, schedule, v, _, sp, method) in ranked[:beam]
              for mb in micro_batches(base, per_rank(sizes_of[id(mesh)]), fixed)]
    for frame in frames:  # every zero stage now, not only those that lighten the recompute
        bar.advance(beam / len(frames), f"micro-batches ({s.costed} layouts costed)")
        best([frame], corners=False)

    if s.passes(own):
        ok, peak = s.fit(own)
        if ok:
            result.own = s.cost(own, peak)
    unique = {f.plan: f for f in result.ranked}
    result.ranked = sorted(unique.values(), key=lambda f: (f.timing.step, f.peak))
    result.costed, result.checked = s.costed, s.checked
    return result


class _Silent:
    def total(self, n):
        pass

    def advance(self, n=1, note=""):
        pass


def _frame(base: Plan, mesh, schedule: str, v: int, mb: int, sp: bool, method: str) -> Callable[..., Plan]:
    return lambda **knobs: _with(base, mesh, schedule, v, mb, sp, method, **knobs)


def _same_mesh(a, b) -> bool:
    return [(x.name, x.size) for x in a.axes if x.size > 1] == [(x.name, x.size) for x in b.axes if x.size > 1]


# ---------------------------------------------------------------------------- differences


def layout_label(p: Plan) -> str:
    """``dp8 × pp4 × tp8`` (outermost first), ``serial`` for one rank."""
    return " × ".join(f"{a.name}{a.size}" for a in p.mesh.axes if a.size > 1) or "serial"


def knobs(p: Plan) -> dict[str, str]:
    """The layout settings as a plan writes them, by key."""
    pl, dp = p.pipeline, p.data_parallel
    out = {"mesh": layout_label(p)}
    if p.pp > 1:
        out["schedule"] = pl.schedule + (f" v{pl.virtual_stages}" if pl.virtual_stages > 1 else "")
    out["micro_batch"] = str(p.train.micro_batch)
    out["zero"] = str(dp.zero) + (f" shard {dp.shard}" if dp.hsdp(p.dp) else "")
    out["recompute"] = p.train.recompute_label
    if p.tp > 1:
        out["sp"] = "on" if p.tensor_parallel.sequence_parallel else "off"
    if p.cp > 1:
        out["cp"] = p.context_parallel.method
    return out


def changes(before: Plan, after: Plan) -> tuple[str, ...]:
    """What ``after`` changes of ``before``'s layout, shortly: ``tp 8→4``, ``cp 1→2``,
    ``axis order``, ``v5→v4``, ``zero 1→3``, ``recompute selective→none``."""
    out = [f"{n} {before.mesh.size(n)}→{after.mesh.size(n)}" for n in AXIS_ORDER if before.mesh.size(n) != after.mesh.size(n)]
    if not out and [(a.name, a.link) for a in before.mesh.axes if a.size > 1] != [(a.name, a.link) for a in after.mesh.axes if a.size > 1]:
        out.append("axis order")
    a, b = knobs(before), knobs(after)
    for k in ("schedule", "micro_batch", "zero", "recompute", "sp", "cp"):
        if a.get(k) != b.get(k) and k in b and (k != "cp" or k in a):  # a new cp's method is in its layout
            old, new = a.get(k, "-"), b[k]
            if k == "schedule" and old.split()[0] == new.split()[0] == "interleaved_1f1b":
                old, new, k = old.split()[1], new.split()[1], "interleaved"
            out.append(f"{k} {old}→{new}")
    return tuple(out)
