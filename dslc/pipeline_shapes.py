"""Which pipeline shapes can be built: a schedule, pp, micro-batches and virtual stages that
:func:`dslc.cost.schedule.build` makes action lists for, and :func:`dslc.check.pipeline.pipeline`
reports at the plan's keys when they cannot. A foundation module, read by check and cost
alike, so that the cost model does not ask the rules for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import SCHEDULES, V_SHAPED

SPLIT_BACKWARD = ("zb_h1", *V_SHAPED)  # the schedules whose backward is B, then W apart
MAX_SCHEDULE = 2**15  # chunk forwards per step: pp × virtual_stages × microbatches (a bound of front/defaults.py)


@dataclass(frozen=True)
class Problem:
    """Why action lists of a shape cannot be built: a diagnostic code, the plan keys it is
    about (most specific first), the message naming the numbers, and a hint."""

    code: str
    keys: tuple[str, ...]
    message: str
    hint: str | None = None


def shape_problems(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> list[Problem]:
    """The one statement of which (schedule, pp, microbatches, virtual_stages) can be built:
    :func:`dslc.cost.schedule.build` refuses these, and :func:`dslc.check.pipeline.pipeline`
    reports them at the plan's keys.
    1f1b, zb_h1, interleaved_1f1b and zb_v need microbatches ≥ pp, interleaved_1f1b also
    microbatches % pp == 0, dualpipe_v microbatches ≥ 2·pp (as torch's ScheduleDualPipeV);
    only interleaved_1f1b takes v > 1, and zb_v and dualpipe_v need v = 2 (their V: the
    front end implies it); pp × v × microbatches is at most MAX_SCHEDULE (E058)."""
    p, m, v = pp, microbatches, virtual_stages
    if schedule not in SCHEDULES:
        return [Problem("E019", ("pipeline.schedule",), f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")]
    if p < 1 or m < 1 or v < 1:
        return [Problem("E015", ("pipeline",), f"pp, microbatches and virtual_stages must be ≥ 1 (got {p}, {m}, {v})")]
    if p * v * m > MAX_SCHEDULE:  # what explain, schedule and compile handle in seconds
        return [Problem("E058", ("pipeline.microbatches", "train.global_batch", "pipeline.virtual_stages", "mesh.pp"),
                        f"the schedule has pp={p} × virtual_stages={v} × microbatches={m} = {p * v * m} chunk forwards per step, more than the {MAX_SCHEDULE} dslc plans for",
                        "use fewer, larger micro-batches")]
    out = []
    if schedule in V_SHAPED and v != 2:
        out.append(Problem("E056", ("pipeline.virtual_stages",), f"{schedule} places two chunks per rank in a V: virtual_stages must be 2, got {v}",
                           "leave virtual_stages out (it is implied) or set it to 2"))
    elif v > 1 and schedule not in ("interleaved_1f1b", *V_SHAPED):
        out.append(Problem("E056", ("pipeline.virtual_stages",), f"virtual_stages={v} needs schedule = interleaved_1f1b, not {schedule}"))
    if schedule == "dualpipe_v" and m < 2 * p:
        out.append(Problem("E053", ("pipeline.microbatches", "train.global_batch"), f"dualpipe_v needs microbatches ≥ 2·pp, got microbatches={m} < {2 * p}",
                           f"raise microbatches to at least {2 * p} (global_batch = micro_batch × microbatches × dp)"))
    elif schedule in ("1f1b", "zb_h1", "interleaved_1f1b", "zb_v") and m < p:
        out.append(Problem("E053", ("pipeline.microbatches", "train.global_batch"), f"{schedule} needs microbatches ≥ pp, got microbatches={m} < pp={p}",
                           f"raise microbatches to at least {p} (global_batch = micro_batch × microbatches × dp)"))
    elif schedule == "interleaved_1f1b" and m % p:
        out.append(Problem("E054", ("pipeline.microbatches",), f"interleaved_1f1b needs microbatches divisible by pp, got microbatches={m}, pp={p} (remainder {m % p})",
                           f"use {m - m % p or p} or {m + p - m % p}"))
    return out
