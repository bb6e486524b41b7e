"""Whether the plan's global batch is what holds the search's fastest layout back, and the
batch that would not (what ``dslc search`` says under its table).

The global batch bounds every layout: its sequences are what the data-parallel ranks split
(dp × ep divides it, :func:`dslc.search.space.degrees`), so a batch of fewer sequences than
GPUs leaves the other GPUs to split each sequence or the layers (cp, tp, pp) whatever the
memory asks, and a pipeline runs as many micro-batches as a data-parallel rank's share: few,
and it idles. The search keeps the plan's batch all the same: it is a training setting,
which changes what the run learns and not only how fast, so a layout search does not change
it silently; it says so (:func:`limits`) and offers the batch that lifts both (:func:`advise`):

- a sequence a GPU at least: then dp alone may take every GPU the memory allows;
- a pipeline idle less than :data:`IDLE` of its time: the bubble shrinks as 1/m with the
  micro-batches m ((p−1)/(v·m) for 1f1b and interleaved, Narayanan et al. SC21 §2.2).

The smallest power-of-two multiple of the batch that does both, and no larger: past it a
larger batch mostly costs data (past the critical batch size, McCandlish et al. 2018, "An
Empirical Model of Large-Batch Training", doubling the batch nearly doubles the tokens a run
needs for the same loss, which the cost model cannot see) for what larger micro-batches add
to each GEMM. The offer is searched at that batch, as ``--global-batch`` would but within
:data:`OFFER_WORK` (its MFU a floor when that runs out), and made only
when its fastest layout's MFU beats the plan's by more than :data:`GAIN` (the estimate's own
error against published steps is 10-15 %, ``tests/test_published.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..front.defaults import BOUNDS
from ..ir import Plan
from . import WORK, Result, search

GAIN = 0.10  # the offer's MFU must beat the plan batch's by more than this
IDLE = 0.10  # a pipeline idle this share of its time or more is held back by its micro-batches
# The work of the search at the offered batch (its micro-batches make each estimate costlier):
# an eighth of the search's bound, a few seconds; cut short, its MFU is a floor ("at least")
OFFER_WORK = WORK // 8


@dataclass(frozen=True)
class Advice:
    limits: tuple[str, ...]  # how the batch holds the fastest layout back, in words
    mfu: float  # the fastest layout's at the plan's batch
    offered: int | None = None  # the batch offered: None when the search there gains too little
    offered_mfu: float | None = None  # the fastest layout's MFU there (None: not searched, the plan's search was a sample)
    at_least: bool = False  # that search ran out of work before its end: a faster layout may be left out


def limits(result: Result) -> tuple[str, ...]:
    """What the global batch does to the fastest layout: fewer sequences than GPUs, or a
    pipeline idle for want of micro-batches."""
    if not result.ranked:
        return ()
    plan, best = result.plan, result.ranked[0]
    gb, world, b = plan.train.global_batch, plan.cluster.world_size, best.plan
    out = []
    if gb < world:
        out.append(f"{gb} sequences a step on {world} GPUs: at most {gb} data-parallel ranks, so the other GPUs split "
                   "each sequence or the layers (cp, tp, pp)")
    if b.pp > 1 and _idle(best) >= IDLE:
        m = b.microbatches
        out.append(f"the fastest layout's pipeline of {b.pp} stages runs {m} micro-batch{'es' * (m != 1)} a step "
                   f"and idles {_idle(best):.0%} of its time")
    return tuple(out)


def _idle(found) -> float:
    """The share of the pipeline's time its ranks idle, b / (1 + b) of the bubble fraction b."""
    return found.timing.bubble_fraction / (1 + found.timing.bubble_fraction)


def batch_that_lifts(result: Result) -> int:
    """The smallest power-of-two multiple of the batch with a sequence a GPU and, at the
    fastest layout's pipeline, an idle share under :data:`IDLE` (the module's rule)."""
    gb, world, best = result.plan.train.global_batch, result.plan.cluster.world_size, result.ranked[0]
    k = max(0, math.ceil(math.log2(world / gb)))
    if best.plan.pp > 1 and _idle(best) >= IDLE:  # the bubble b shrinks as 1/m: m × b / target
        k = max(k, math.ceil(math.log2(best.timing.bubble_fraction / (IDLE / (1 - IDLE)))))
    return min(gb << k, BOUNDS["train.global_batch"][1])


def advise(plan: Plan, result: Result, gpus: int | None = None, fixed: frozenset[str] = frozenset(),
           progress=None) -> Advice | None:
    """None when the batch does not hold the fastest layout back (:func:`limits`); else how,
    and the batch offered with its fastest layout's MFU, searched as ``--global-batch``
    would within OFFER_WORK (none offered when that gains too little; not searched after a search that was
    itself a sample of the shapes)."""
    why = limits(result)
    if not why:
        return None
    advice = Advice(why, result.ranked[0].timing.mfu)
    batch = batch_that_lifts(result)
    if batch == result.plan.train.global_batch:
        return advice
    if result.unprobed:  # the search was a sample of the shapes: another would cost as much again
        return replace(advice, offered=batch)
    # a pointer, not the search the user asked for: at most OFFER_WORK, and within what the
    # plan's search left of the bound
    found = search(replace(plan, train=replace(plan.train, global_batch=batch)), gpus, progress=progress, fixed=fixed,
                   work=max(0, min(OFFER_WORK, WORK - result.work)))
    if not found.ranked or found.ranked[0].timing.mfu <= advice.mfu * (1 + GAIN):
        return advice
    return replace(advice, offered=batch, offered_mfu=found.ranked[0].timing.mfu, at_least=found.unsearched > 0)
