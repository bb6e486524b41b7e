"""The pipeline-parallel part of the code generator's view model.

Everything the pipeline runtime (``templates/parallel/pp.jinja``) needs is decided
here: which layers each pipeline rank's model chunks hold (``Plan.stage_layers``,
chunk g on pp rank g % pp as local chunk g // pp), the action lists of
:func:`dslc.schedule.build` written out as a Python literal the script executes
literally, the global ranks of the first and last stage of each pipeline (for
the tied embedding's gradient), and the shape of the messages.
"""

from __future__ import annotations

from itertools import accumulate

from ..cost import schedule
from ..ir import Plan

__all__ = ["pipeline_view", "schedule_literal"]


def pipeline_view(plan: Plan, unsupported: type[Exception]) -> dict:
    """The view-model keys of the pipeline; pp = 1 gives the keys with inert values."""
    pp, pl = plan.pp, plan.pipeline
    if pp == 1:
        return {
            "pp": 1,
            "pipeline_parallel": False,
            "pp_schedule": "none",
            "split_backward": False,
            "linear": "F.linear",
            "tied_pp": False,
        }
    v, m = pl.virtual_stages, pl.microbatches
    layers = plan.stage_layers()
    if len(layers) != pp * v or sum(layers) != plan.model.layers or min(layers) < 1:
        raise unsupported(
            f"pipeline stages {list(layers)} do not split {plan.model.layers} layers "
            f"into pp={pp} x virtual_stages={v} non-empty chunks"
        )
    try:
        actions = schedule.build(pl.schedule, pp, m, v)
    except ValueError as e:
        raise unsupported(str(e)) from None
    bounds = [0, *accumulate(layers)]
    # [pp rank][local chunk] = (first layer, end layer) of global chunk c * pp + rank
    chunk_layers = tuple(
        tuple((bounds[c * pp + r], bounds[c * pp + r + 1]) for c in range(v)) for r in range(pp)
    )
    tied = bool(plan.model.tie_embeddings)
    groups = plan.mesh.groups("pp")
    return {
        "pp": pp,
        "pipeline_parallel": True,
        "pp_schedule": pl.schedule,
        "virtual_stages": v,
        "split_backward": pl.schedule == "zb_h1",
        # zb_h1: every linear layer defers its weight gradient to W (parallel/zb.jinja)
        "linear": "linear" if pl.schedule == "zb_h1" else "F.linear",
        "pp_stride": plan.mesh.stride("pp"),
        "chunk_layers": repr(chunk_layers),
        "stage_layers": repr(tuple(layers)),
        "schedule_literal": schedule_literal(actions),
        "tied_pp": tied,
        "embedding_groups": repr(tuple((g[0], g[-1]) for g in groups)) if tied else "()",
    }


def schedule_literal(actions: schedule.Actions) -> str:
    """``SCHEDULE = (...)``: one tuple of actions per pp rank, one line per compute
    (the sends and receives posted before it, then the compute itself), so that a line
    reads as "batch, then compute". The caller wraps it in ``# fmt: off``: black would
    put every action on a line of its own."""

    def text(a: schedule.Action) -> str:
        fields = [f'"{a.kind}"', str(a.microbatch), str(a.chunk)]
        if a.peer is not None:
            fields.append(str(a.peer))
        return "(" + ", ".join(fields) + ")"

    lines = ["SCHEDULE = ("]
    for rank, acts in enumerate(actions):
        lines.append(f"    (  # pp rank {rank}")
        current: list[str] = []
        for a in acts:
            current.append(text(a))
            if not a.is_comm:
                lines.append("        " + ", ".join(current) + ",")
                current = []
        if current:
            lines.append("        " + ", ".join(current) + ",")
        lines.append("    ),")
    lines.append(")")
    return "\n".join(lines)
