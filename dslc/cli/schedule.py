"""``dslc schedule``: a plan's pipeline action lists, proved deadlock-free, costed and
simulated, as a text grid, JSON or a picture."""

from __future__ import annotations

import json
import sys

from ..report.terminal import progress
from .inputs import UsageError, load_plans


def run(args) -> int:
    from ..cost import deadlock, schedule
    from ..report import draw

    loaded = load_plans([args.plan_file], args.plan, args.quiet)
    if loaded is None:
        return 1
    _, plans = loaded
    if len(plans) > 1:
        raise UsageError(f"{args.plan_file} holds {len(plans)} plans; pick one with --plan")
    plan = plans[0]
    pl = plan.pipeline
    if plan.pp == 1:
        return _no_pipeline(plan, args)
    from ..cost.time import timing
    from ..cost.topology import Topology

    with progress(f"scheduling {plan.name}", total=4) as bar:  # a large plan's millions of actions take a while
        bar.advance(0, "building the actions")
        actions = schedule.build(pl.schedule, plan.pp, pl.microbatches, pl.virtual_stages)
        bar.advance(1, "proving them deadlock-free")
        problems = deadlock.verify(actions, split_backward=pl.schedule in schedule.SPLIT_BACKWARD)
        if not problems:
            # the plan's own costs (dslc explain): forward, backward, weight-grad and p2p times, in ms
            bar.advance(1, "costing the stages")
            t, _ = timing(plan, Topology.of(plan), acts=actions)
            bar.advance(1, "simulating")
            sim = schedule.simulate(actions, *([c[i] * 1e3 for c in t.chunks] for i in range(3)), t.t_comm * 1e3)
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(draw.to_json(plan, actions, sim, t) | {"deadlock_free": True}, indent=1, allow_nan=False))
        return 0
    print(f"{plan.name}: {pl.schedule}, forward {t.t_f * 1e3:.2f} ms, backward {t.t_b * 1e3:.2f} ms"
          + (f", weight-grad {t.t_w * 1e3:.2f} ms" if t.t_w else "")
          + f" per chunk per micro-batch, p2p {t.t_comm * 1e3:.3f} ms")
    print(f"deadlock-free: {sum(map(len, actions))} actions on {plan.pp} ranks, each rank's in program order, "
          "every send met by its receive in posting order, no cycle of waits")
    print(draw.text_grid(actions, sim, time_unit="ms"))
    if args.output:
        try:
            draw.draw(actions, sim, args.output, schedule=f"{plan.name}: {pl.schedule}", time_unit="ms")
        except ValueError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror}") from None
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _no_pipeline(plan, args) -> int:
    """pp = 1: one stage, so there are no action lists to prove or draw; say so."""
    m = plan.pipeline.microbatches
    if args.output:
        raise UsageError(f"{plan.name} has no pipeline (pp = 1): no schedule to draw")
    if args.json:
        print(json.dumps({"plan": plan.name, "schedule": None, "pp": 1, "microbatches": m}, indent=1))
        return 0
    print(f"{plan.name} has no pipeline (pp = 1): each rank runs the forward and backward of its "
          f"{m} micro-batch{'es' if m > 1 else ''} in turn, so there is nothing to schedule; "
          "`dslc explain` gives the step's time")
    return 0
