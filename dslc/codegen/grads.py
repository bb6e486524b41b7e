"""Each kind of parameter's gradient, decided once for the generated program.

A parameter is ``dense`` (whole on every tp rank), ``tp`` (split over tp) or ``expert``
(this ep rank's experts, whole on every tp rank). Per kind the view gives the group its
gradient is summed and ZeRO-sharded over (:func:`dslc.cost.memory.grad_group`), the groups
its squares are summed over for the global gradient norm (:func:`norm_groups`), how many
parts of the whole parameter a pipeline stage's ranks hold, and whether its gradient holds
partial sums over tp that sequence parallel's all-reduce adds. plan.py emits them once, as
PARAM_KINDS, and data_parallel.py, optimizer.py and train.py read that table.
"""

from __future__ import annotations

from ..cost.memory import grad_group
from ..groups import axes_of, group_mesh
from ..ir import Plan

__all__ = ["grads_view", "kinds", "norm_groups", "zero_stage"]

# how many parts of a whole parameter the ranks of a pipeline stage hold, as the script's constants
_PARTS = {"dense": "1", "tp": "TP", "expert": "EP"}


def kinds(plan: Plan) -> tuple[str, ...]:
    """The kinds of parameter the plan's model has on its mesh."""
    return ("dense",) + ("tp",) * (plan.tp > 1) + ("expert",) * plan.model.is_moe


def zero_stage(plan: Plan) -> int:
    """ZeRO's stage as the script runs it: 0 when the dense gradients have no group to be
    sharded over."""
    return plan.data_parallel.zero if grad_group(plan, expert=False) else 0


def norm_groups(plan: Plan, kind: str) -> tuple[str, ...]:
    """The process groups (keys of the script's GROUPS) over which a kind's squared
    gradient norm is summed, in turn: those whose ranks hold other parts of it. tp first
    (a tp-split weight, or experts whose ZeRO shards are split over tp too), then the rest
    of its ZeRO shard group with each ep rank's experts (the dense group, or ep alone), then
    pp (each stage its own layers). Kinds that share the tail of their groups add their
    sums before it (the script's grad_norm), so each group is all-reduced once."""
    apart = set(grad_group(plan, kind == "expert")) if zero_stage(plan) else set()
    apart |= {"tp"} if kind == "tp" else {"ep"} if kind == "expert" else set()
    rest = axes_of(group_mesh(plan), tuple(apart - {"tp"}))
    return ("tp",) * ("tp" in apart) + ("+".join(rest),) * bool(rest) + ("pp",) * (plan.pp > 1)


def grads_view(plan: Plan) -> dict:
    """The view-model keys of the gradients' groups: the dense and the experts' group, and
    PARAM_KINDS's rows (kind, group, norm groups, parts, tp partial sums) as literals."""
    dense, experts = grad_group(plan, expert=False), grad_group(plan, expert=True)
    sp = plan.tp > 1 and bool(plan.tensor_parallel.sequence_parallel)
    # reduced over their buckets' group when there are buckets (data parallel), else never
    group = {"dense": "GRAD_GROUP", "tp": "GRAD_GROUP", "expert": "EXPERT_GRAD_GROUP"} if dense else {}
    partial = {"dense": sp, "tp": False, "expert": sp and "tp" not in experts}
    rows = [(k, group.get(k, "None"), repr(norm_groups(plan, k)), _PARTS[k], repr(partial[k])) for k in kinds(plan)]
    return {
        "grad_group": "+".join(dense),
        "param_kinds": rows,
        "expert_grad_group_literal": repr("+".join(experts) or None),
        "expert_grad_group_why": _expert_why(plan, experts),
    }


def _expert_why(plan: Plan, axes: tuple[str, ...]) -> str:
    """Why the experts' gradient group is what it is, for its comment."""
    if not axes:  # under tp the experts' group has tp (sequence parallel, E076)
        return "not reduced: no other rank holds these experts"
    why = "summed over " + " and ".join(axes)
    why += ": each ep rank holds other experts" if plan.ep > 1 else ", as the dense ones" if "tp" not in axes else ""
    return why + ("; tp adds each tp rank's tokens' partial sums" if "tp" in axes else "")
