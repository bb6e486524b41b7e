"""``dslc search``: the layouts of a plan's model on its cluster, ranked by the step time
``dslc explain`` estimates.

A layout is everything a plan says of how the model is spread and run: the degrees of dp,
tp, pp, cp and ep and their order on the links, the ZeRO stage and HSDP shard, the schedule
and its virtual stages, the micro-batch size (and so the count, at the plan's global batch),
the recompute policy, sequence parallelism and the context-parallel method. The model,
cluster, data and training settings stay the plan's.

A candidate is kept only when it passes every rule of :func:`dslc.check.check_plan`
without an error or a warning and fits (:func:`dslc.fit.fits`, the test behind E090):
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
4. **the rest** — for those shapes every schedule, virtual-stage count, sequence-parallel
   and cp-method choice (at the smallest micro-batch), then for the best ``beam`` of those
   every micro-batch size; each with the *fastest knobs that fit*: for each zero stage the
   lightest recompute that fits (a staircase: a higher stage never needs more recompute),
   then costed.

It is a beam search: a layout whose shape or schedule probed slower than the beam's is
not costed at its other micro-batch sizes. It is bounded: at most :data:`MAX_DEGREES` of
the degree combinations are probed (the plan's own first, then a sample spread evenly over
the rest), so that a plan at the language's bounds (2¹⁸ GPUs, 65,536 layers and experts:
7,315 combinations) is searched in about the time of the largest published layouts
(16,384 GPUs, 283 combinations), not in minutes; and its work is bounded (:data:`WORK`,
counted in :class:`Searcher`): once spent, no further shape is probed and no further frame
costed. The summary says how many were left out. ``tests/test_search.py`` holds its
answers against published layouts.

Dominated choices are not costed: gpipe (1f1b has its bubble with fewer activations held),
and sequence parallelism off under tp (the same bytes as tp's all-reduce and 1/tp of the
activations: Korthikanti et al. 2022, §4.2.2) unless the plan turns it off itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ..check import check_plan
from ..cost import memory as mem
from ..cost import offload as off
from ..cost.time import Timing, timing
from ..cost.topology import Topology
from ..fit import fits
from ..ir import Plan
from ..knobs import knobs, layout_label
from ..units import gib
from .space import (
    AXIS_ORDER,
    FIXABLE,
    RECOMPUTE,
    SearchError,
    changes,
    degrees,
    meshes,
    methods,
    micro_batches,
    recompute_policies,
    resize,
    schedules,
    sp_choices,
    with_layout,
    without_layout_spans,
    zero_stages,
)

__all__ = ["AXIS_ORDER", "BEAM", "MAX_DEGREES", "WORK", "FIXABLE", "RECOMPUTE", "Found", "Result", "SearchError", "Searcher", "changes", "degrees", "knobs",
           "layout_label", "meshes", "micro_batches", "resize", "schedules", "search", "with_layout", "zero_stages"]

BEAM = 8  # shapes kept after the probe, and frames after the schedules
MAX_DEGREES = 320  # degree combinations probed at most (16,384 GPUs of Llama 3 405B have 283; 2¹⁸ GPUs up to 7,315)
# The work a search may do, in units of about 2.5 µs on the 2-core CI machine, as measured
# there (:func:`_work`): a rule check costs RULE_WORK (20-30 units from 80 to 65,536
# layers), a memory test and an estimate about a unit per layer and a share of each chunk
# forward of the schedule (pp × v × m, at most 2¹⁵). Llama 3 70B on its 64 GPUs spends
# 1.3M of it, all its shapes searched.
WORK = 2**24
RULE_WORK = 30


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
    unprobed: int = 0  # degree combinations left out by the bound (MAX_DEGREES)
    unsearched: int = 0  # shapes and frames left out once the work (WORK) was spent
    memory_pruned: int = 0  # shapes dropped by the memory bound
    rule_pruned: int = 0  # shapes no layout of which passes the rules
    costed: int = 0  # layouts whose step was estimated
    checked: int = 0  # layouts put through the rules
    work: int = 0  # what it spent of its bound (WORK)
    own: Found | None = None  # the plan as written, if it passes and fits
    refused: tuple[tuple[str, str], ...] = ()  # else (code, message) of each rule or the memory test that refused it


# ---------------------------------------------------------------------------- the search


class Searcher:
    """One search: the rules, the memory test and the estimate of each layout, once each."""

    def __init__(self, plan: Plan, settings: mem.Settings = mem.DEFAULT, fixed=frozenset()):
        self.plan, self.settings, self.fixed = plan, settings, fixed
        self.checked = self.costed = self.work = 0
        self._ok: dict[Plan, bool] = {}
        self._fit: dict[Plan, tuple[bool, int]] = {}
        self._cost: dict[Plan, Found] = {}

    def passes(self, p: Plan) -> bool:
        """No error and no warning of any rule (the written plan must lint clean)."""
        if p not in self._ok:
            self.checked += 1
            self.work += RULE_WORK
            self._ok[p] = not any(d.severity.value in ("error", "warning") for d in check_plan(p, files=False))
        return self._ok[p]

    def fit(self, p: Plan) -> tuple[bool, int]:
        if p not in self._fit:
            self.work += _work(p)
            try:
                self._fit[p] = fits(p, self.settings)
            except ValueError:  # no schedule for these numbers: the rules said why
                self._fit[p] = (False, 0)
        return self._fit[p]

    def cost(self, p: Plan, peak: int) -> Found:
        if p not in self._cost:
            self.costed += 1
            self.work += _work(p, estimate=True)
            t, _ = timing(p, Topology.of(p), self.settings)
            self._cost[p] = Found(p, t, peak, changes(self.plan, p))
        return self._cost[p]

    def as_written(self) -> tuple[Found | None, tuple[tuple[str, str], ...]]:
        """The plan as written, costed, or else (code, message) of what refused it: every
        error and warning of the rules (the search keeps no layout with either), or E090's
        memory test with its figures."""
        p = self.plan
        if not self.passes(p):
            return None, tuple((d.code, d.message) for d in check_plan(p, files=False) if d.severity.value in ("error", "warning"))
        ok, peak = self.fit(p)
        if ok:
            return self.cost(p, peak), ()
        need = f"needs {gib(peak)} per GPU" if peak else "has no pipeline schedule to measure"  # fits() found none: the rules said why
        return None, (("E090", f"{need} but {p.cluster.device.name} has {gib(p.cluster.device.memory)}"),)

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
        pp, fixed = mesh.size("pp"), self.fixed
        shapes = schedules(self.plan, pp, fixed) if "schedule" in fixed else [("1f1b", 1), ("zb_h1", 1)] if pp > 1 else [("1f1b", 1)]
        mb = self.plan.train.micro_batch if "micro_batch" in fixed else 1
        for (zero, shard), (schedule, v), method in itertools.product(stages, shapes, methods(self.plan, mesh.size("cp"), fixed)):
            p = with_layout(self.plan, mesh, schedule, v, mb, sp, method, zero, shard, frugal)
            if self.passes(p):
                return self.fit(p)[0]
        return None


def search(plan: Plan, gpus: int | None = None, beam: int = BEAM, progress=None,
           settings: mem.Settings = mem.DEFAULT, fixed: frozenset[str] = frozenset(), work: int = WORK) -> Result:
    """:func:`search_layouts`, and when no layout fits (and ``offload`` is not fixed), the
    layouts of each offload beyond the plan's (:func:`dslc.cost.offload.choices`) too,
    within what is left of ``work``, all ranked by their step: offload trades PCIe copies
    and a host step for device memory, worth it only where nothing fits without."""
    result = search_layouts(plan, gpus, beam, progress, settings, fixed, work)
    if result.ranked or "offload" in fixed:
        return result
    for o in off.choices(plan):  # within what is left of the one bound
        if result.work >= work:
            break
        more = search_layouts(replace(plan, train=replace(plan.train, offload=o)), gpus, beam, progress, settings, fixed, work - result.work)
        result.ranked += [replace(f, changes=changes(result.plan, f.plan)) for f in more.ranked]
        for name in ("unsearched", "costed", "checked", "work"):  # the same shapes again: counted once
            setattr(result, name, getattr(result, name) + getattr(more, name))
    result.ranked.sort(key=lambda f: (f.timing.step, f.peak))
    return result


def search_layouts(plan: Plan, gpus: int | None = None, beam: int = BEAM, progress=None,
                   settings: mem.Settings = mem.DEFAULT, fixed: frozenset[str] = frozenset(), work: int = WORK) -> Result:
    """The layouts of ``plan``'s model on its cluster (resized to ``gpus``) that pass the
    rules and fit, fastest first: every shape the memory bound leaves is costed at a probe,
    then the best ``beam`` shapes (and the plan's own) at every schedule, cp method and
    sequence-parallel choice, then the best ``beam`` of those at every micro-batch size;
    each at the fastest zero and recompute that fit. ``fixed``: the settings of
    :data:`FIXABLE` kept as the plan writes them; ``work``: its bound (:data:`WORK`)."""
    cluster = resize(plan.cluster, gpus) if gpus is not None else plan.cluster
    base = replace(plan, cluster=cluster, spans=without_layout_spans(plan))
    own = replace(plan, cluster=cluster)
    s = Searcher(own, settings, fixed)
    result = Result(own, [])
    written = {n: plan.mesh.size(n) for n in AXIS_ORDER}
    combos = [sizes for sizes in degrees(base, cluster.world_size) if "mesh" not in fixed or sizes == written]
    probed = bounded(combos, written, MAX_DEGREES)
    result.unprobed = len(combos) - len(probed)
    shapes = [(m, sizes) for sizes in probed for m in meshes(base, sizes)]
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
        if s.work > work:
            result.unsearched += 1
            continue
        sp = sp_choices(base, sizes["tp"], fixed)[0]
        frugal = s.frugal(mesh, sp)
        if not frugal:
            result.memory_pruned += frugal is False
            result.rule_pruned += frugal is None
            continue
        (schedule, v), mbs = schedules(base, sizes["pp"], fixed)[0], micro_batches(base, per_rank(sizes), fixed)
        ranked = best([(mesh, schedule, v, mbs[0], sp, m) for m in methods(base, sizes["cp"], fixed)]) if mbs else []
        if ranked:
            probes.append((ranked[0][0], _same_mesh(mesh, plan.mesh), mesh, sizes))
    fastest: dict[tuple, tuple] = {}  # per degrees, the order whose probe is fastest
    for x in sorted(probes, key=lambda x: x[0]):
        fastest.setdefault(tuple(sorted(x[3].items())), x)
    kept = [x for i, x in enumerate(fastest.values()) if i < beam or x[1]]

    # 4: every schedule, cp method and sp choice of the kept shapes, then every micro-batch size of the best
    frames = [(mesh, schedule, v, micro_batches(base, per_rank(sizes), fixed)[0], sp, method) for _, _, mesh, sizes in kept
              for (schedule, v), sp, method in itertools.product(
                  schedules(base, sizes["pp"], fixed), sp_choices(base, sizes["tp"], fixed), methods(base, sizes["cp"], fixed))]
    ranked = []
    for frame in frames:
        bar.advance(beam / len(frames), f"schedules ({s.costed} layouts costed)")
        if s.work > work:
            result.unsearched += 1
            continue
        ranked += best([frame])
    ranked.sort(key=lambda x: x[0])
    sizes_of = {id(mesh): sizes for _, _, mesh, sizes in kept}
    frames = [(mesh, schedule, v, mb, sp, method) for _, (mesh, schedule, v, _, sp, method) in ranked[:beam]
              for mb in micro_batches(base, per_rank(sizes_of[id(mesh)]), fixed)]
    for frame in frames:  # every zero stage now, not only those that lighten the recompute
        bar.advance(beam / len(frames), f"micro-batches ({s.costed} layouts costed)")
        if s.work > work:
            result.unsearched += 1
            continue
        best([frame], corners=False)

    result.own, result.refused = s.as_written()
    unique = {f.plan: f for f in result.ranked}
    result.ranked = sorted(unique.values(), key=lambda f: (f.timing.step, f.peak))
    result.costed, result.checked, result.work = s.costed, s.checked, s.work
    return result


def _work(p: Plan, estimate: bool = False) -> int:
    """What a memory test (or an estimate, which simulates the schedule) of ``p`` costs, in
    the units of :data:`WORK`: measured, a unit a layer, and half a unit (two for an
    estimate) a chunk forward."""
    chunks = p.pp * p.pipeline.virtual_stages * p.microbatches
    return p.model.layers + (2 * chunks if estimate else chunks // 2)


def bounded(combos: list[dict], own: dict, most: int) -> list[dict]:
    """At most ``most`` of ``combos``: all when they are as few, else ``own`` (the plan's
    degrees, when among them) and a sample spread evenly over the others, in their order."""
    if len(combos) <= most:
        return combos
    others = [c for c in combos if c != own]
    kept = [others[i * len(others) // (most - 1)] for i in range(most - 1)]
    return ([own] if own in combos else []) + kept


class _Silent:
    def total(self, n):
        pass

    def advance(self, n=1, note=""):
        pass


def _frame(base: Plan, mesh, schedule: str, v: int, mb: int, sp: bool, method: str) -> Callable[..., Plan]:
    return lambda **knobs: with_layout(base, mesh, schedule, v, mb, sp, method, **knobs)


def _same_mesh(a, b) -> bool:
    return [(x.name, x.size) for x in a.axes if x.size > 1] == [(x.name, x.size) for x in b.axes if x.size > 1]
