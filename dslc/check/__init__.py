"""Semantic checks of a lowered plan: one function per rule, each returning
diagnostics that name the numbers involved and point at the key they are
about (``plan.where("model.heads")``). See dslc/codes.py for the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..diagnostics import Diagnostic
from ..ir import Plan
from ..unknown import until_unknown
from . import data, experts, mesh, model, pipeline, sequence, training
from .model import check_definition

__all__ = ["CHECKS", "check_definition", "check_plan"]

Check = Callable[[Plan], Iterator[Diagnostic]]
CHECKS: list[Check] = [  # in the order lint reports them
    mesh.mesh_matches_cluster, mesh.placement,
    model.model_shapes,
    pipeline.pipeline,
    sequence.sequence_context,
    experts.experts,
    training.batch, training.zero, training.training, training.float8, training.offload, training.init_checkpoint,
    data.checkpoint_dir,  # where the script writes its checkpoints
    data.data_file,  # reads the files, left out by check_plan(files=False)
]


def check_plan(plan: Plan, files: bool = True) -> list[Diagnostic]:
    """Every rule's diagnostics. Whether the plan fits in memory (E090) is decided after
    the checks, by :mod:`dslc.fit`, for plans that pass them. ``files=False`` leaves
    out the rule that reads the data files (search's variants of a checked plan differ
    from it only in their layout). A partial plan (``unknown.Unknown`` parts, left by errors
    of its lowering) gets the rules that do not read those parts: a rule stops at the first
    unknown value it reads, keeping what it found before (read from known values only)."""
    out: list[Diagnostic] = []
    for fn in CHECKS:
        if files or fn is not data.data_file:
            out.extend(until_unknown(fn(plan)))
    return out
