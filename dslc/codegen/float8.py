"""The view of ``train { float8 }``: which process groups hold parts of each linear's GEMM
dims (so that every amax is reduced over them and a parallel plan computes the serial
plan's scales), and whether torchao pads the GEMMs' inner dim (``pad_inner_dim``).

A linear y = x W^T has three GEMMs over three dims: the tokens N, its inputs K and its
outputs O (forward contracts K, grad_input O, grad_weight N). A scale covers some of them
(tensorwise: both of a tensor's; rowwise: the contracted one) and its amax is reduced over
the groups that shard those (the generated float8.py's ``to_float8``).
"""

from __future__ import annotations

from .. import arch
from ..ir import Plan


def float8_view(plan: Plan) -> dict:
    """The float8 keys of the view model (``float8`` False: the plan trains without)."""
    recipe = plan.train.float8
    if not recipe:
        return {"float8": False}
    m, tp, cp = plan.model, plan.tp, plan.cp
    sp = bool(plan.tensor_parallel.sequence_parallel) and tp > 1
    tokens = ("cp",) * (cp > 1)  # a micro-batch's sequences, split over cp
    split = ("tp",) * (tp > 1)
    # (tokens N, inputs K, outputs O): the groups over which each dim is split
    groups = {
        "linear": (tokens, (), ()),  # a block's linear without tp
        "column": (tokens, (), split),  # column-parallel: W's rows (outputs) over tp
        "row": (tokens, split, ()),  # row-parallel: W's columns and x's features over tp
        # the shared experts run on each tp rank's slice of the sequence under sp
        "shared": (tokens + split * sp, (), ()),
    }
    wanted = {"linear": tp == 1, "column": tp > 1, "row": tp > 1, "shared": bool(m.shared_experts)}
    per_rank = [d for w in arch.float8_weights(m, tp) for d in w.shape]
    rows = plan.train.micro_batch * m.seq_len // cp  # the tokens of a dense grad_weight GEMM
    per_rank.append(rows // tp if sp and m.shared_experts else rows)
    return {
        "float8": True,
        "float8_recipe": repr(recipe),
        "float8_recipe_name": recipe,
        "float8_groups": [(name, repr(g)) for name, g in groups.items() if wanted[name]],
        "float8_reduces": any(g for name, dims in groups.items() if wanted[name] for g in dims),
        "pad_inner_dim": any(d % arch.FLOAT8_ALIGN for d in per_rank),
    }
