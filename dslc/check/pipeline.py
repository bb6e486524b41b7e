"""The pipeline: its shape (:func:`dslc.pipeline_shapes.shape_problems`, which the schedule
builder refuses too), its layers over the stages (E050–E052) and its bubble (W055), and
pipeline options without a pp axis (W057)."""

from __future__ import annotations

from ..chunks import Placement
from ..diagnostics import error, warning
from ..ir import Plan
from ..pipeline_shapes import shape_problems
from ..unknown import unless_unknown


def pipeline(plan: Plan):
    p, pl = plan.pp, plan.pipeline
    v, m = pl.virtual_stages, pl.microbatches
    if pl.schedule == "interleaved_1f1b" and p > 1 and v < 2:
        yield error("E056", plan.where("pipeline.virtual_stages", "pipeline.schedule"), f"interleaved_1f1b needs virtual_stages ≥ 2, got {v}", "set virtual_stages = 2 or use schedule = 1f1b")
    for pr in shape_problems(pl.schedule, p, m, v):  # build() refuses the same
        yield error(pr.code, plan.where(*pr.keys), pr.message, pr.hint)
    if p == 1:
        if any(k in plan.spans for k in ("pipeline.schedule", "pipeline.virtual_stages", "pipeline.layers_per_stage")):
            yield warning("W057", plan.where("pipeline"), "pipeline options have no effect: the mesh has no pp axis", "add `pp = N on <link>` to the mesh, or remove them")
        return
    with unless_unknown():  # the layers over the stages: the bubble below needs no model
        yield from _layers(plan, p * v, plan.model.layers)
    if pl.schedule == "gpipe" and (p - 1) / m > 0.25:  # the bubble over the compute, (p−1)/m
        yield warning("W055", plan.where("pipeline.schedule"), f"gpipe with pp={p} and microbatches={m}: the pipeline bubble is {(p - 1) / m:.3g}× the compute ((p−1)/m), so each rank idles {(p - 1) / (m + p - 1):.0%} of the step", f"use ≥ {4 * (p - 1)} micro-batches, or schedule = 1f1b")


def _layers(plan: Plan, chunks: int, layers: int):
    """The model's layers over the pipeline's chunks: as listed (E051, E052) or split (E050)."""
    p, pl = plan.pp, plan.pipeline
    v = pl.virtual_stages
    if pl.layers_per_stage is not None:
        where = plan.where("pipeline.layers_per_stage")
        if len(pl.layers_per_stage) != chunks:
            yield error("E051", where, f"layers_per_stage lists {len(pl.layers_per_stage)} stages but the plan has {chunks} (pp={p} × virtual_stages={v})")
        elif sum(pl.layers_per_stage) != layers:
            yield error("E051", where, f"layers_per_stage sums to {sum(pl.layers_per_stage)} but the model has {layers} layers")
        empty = _empty_chunks(pl.layers_per_stage, plan.placement)
        if empty:
            hint = "in a V any chunk may have 0 layers, but every pp rank but rank 0 (the embedding and the loss) must hold one" if plan.v_shape else "only the first chunk (it holds the embedding) and the last (the final norm, head and loss) may have 0 layers"
            yield error("E052", where, empty, hint)
    elif chunks > layers:
        yield error("E050", plan.where("mesh.pp", "pipeline.virtual_stages"), f"pp={p} × virtual_stages={v} = {chunks} stages but the model has only {layers} layers", f"use at most {layers} stages in all")


def _empty_chunks(split: tuple[int, ...], at: Placement) -> str:
    """Every chunk of ``layers_per_stage`` (on the pp rank ``at`` places it) with fewer than
    0 layers, or none but the first (the embedding) and the last (the loss), in one message.
    In a V any chunk may be empty (its forward is the identity), but every rank but the
    first (the embedding and head) must hold a layer."""
    names = [f"chunk {g}" + (f" (pp rank {at.rank(g)})" if at.v > 1 else "") for g in range(len(split))]
    bad = [f"{names[g]} has {'no' if n == 0 else n} layers" for g, n in enumerate(split) if n < 0 or (n == 0 and 0 < g < len(split) - 1 and not at.v_shape)]
    if at.v_shape and at.v == 2 and len(split) == at.chunks:  # else E056 (a V has two chunks a rank)
        bad += [f"pp rank {r} (chunks {' and '.join(map(str, at.ids(r)))}) has no layers" for r in range(1, at.pp) if not any(split[g] for g in at.ids(r))]
    return "layers_per_stage: " + ", ".join(bad) if bad else ""
