"""The pipeline-parallel part of the view model, and the schedule.json sidecar.

Everything the pipeline runtime (``templates/pipeline_parallel.py.jinja``) needs is decided here:
which layers each pipeline rank's model chunks hold (``Plan.stage_layers``, placed by
``Plan.placement``: chunk g on pp rank g % pp as local chunk g // pp, or in a V,
:mod:`dslc.chunks`), the stride between a pipeline's ranks (the script pairs first and last
stages for the tied embedding's gradient), and the action lists of
:func:`dslc.cost.schedule.build` with the V's turns (a tensor handed to the neighbouring chunk
on the same rank, :meth:`dslc.chunks.Placement.turn`), written to ``schedule.json`` beside the
script, which executes them literally and refuses a file whose SHA-256 is not the one it was
generated with.
"""

from __future__ import annotations

import hashlib
import json
from itertools import accumulate

from ..chunks import ONWARD
from ..cost import schedule
from ..ir import Plan

__all__ = ["pipeline_view", "schedule_json"]


def pipeline_view(plan: Plan) -> dict:
    """The view-model keys of the pipeline (``schedule_json`` is the sidecar's text, not
    for the templates); pp = 1 gives the keys with inert values."""
    pp, pl = plan.pp, plan.pipeline
    split = pl.schedule in schedule.SPLIT_BACKWARD
    if pp == 1:
        return {"pipeline_parallel": False, "split_backward": False, "linear": "F.linear",
                "tied_pp": False, "schedule_json": None}
    text = schedule_json(plan)
    v = pl.virtual_stages
    bounds, at = [0, *accumulate(plan.stage_layers())], plan.placement
    ids = tuple(at.ids(r) for r in range(pp))
    # [pp rank][local chunk] = (first layer, end layer) of its global chunk
    chunk_layers = tuple(tuple((bounds[g], bounds[g + 1]) for g in gs) for gs in ids)
    # tied embeddings on two ranks (not in a V, whose rank 0 holds both ends)
    tied = bool(plan.model.tie_embeddings) and plan.last_stage != 0
    return {
        "pipeline_parallel": True,
        "pp": pp,
        "pp_schedule": pl.schedule,
        "virtual_stages": v,
        "split_backward": split,
        # zb_h1, zb_v, dualpipe_v: every linear layer defers its weight gradient to W (zero_bubble.py)
        "linear": "linear" if split else "F.linear",
        "pp_stride": plan.mesh.stride("pp"),
        "chunk_layers": repr(chunk_layers),
        "chunk_ids": repr(ids),
        "chunk_ranks": repr(tuple(at.rank(g) for g in range(at.chunks))),
        "v_shape": plan.v_shape,
        "schedule_json": text,
        "schedule_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "tied_pp": tied,
    }


def schedule_json(plan: Plan) -> str:
    """``schedule.json``: every pp rank's action list, ``[kind, micro-batch, local chunk]``
    plus the peer pp rank for sends and receives, one line per compute with the sends
    and receives posted before it (so that a line reads "batch, then compute"). A compute
    whose neighbouring chunk is on the same rank (the turn of a V) is followed on its line
    by ``TURN_F`` (its output is that chunk's input) or ``TURN_B`` (its input gradient is
    that chunk's output gradient), with the receiving local chunk in place of a peer."""
    pl = plan.pipeline
    actions = schedule.build(pl.schedule, plan.pp, pl.microbatches, pl.virtual_stages)
    ranks = []
    for rank, acts in enumerate(actions):
        lines, current = [], []
        for a in acts:
            current.append(json.dumps([a.kind, a.microbatch, a.chunk, *(() if a.peer is None else (a.peer,))]))
            if a.kind in ONWARD and (to := actions.placement.turn(rank, a.chunk, ONWARD[a.kind])) is not None:
                current.append(json.dumps(["TURN_" + a.kind, a.microbatch, a.chunk, to]))
            if not a.is_comm:
                lines.append(", ".join(current))
                current = []
        if current:
            lines.append(", ".join(current))
        ranks.append("    [\n      " + ",\n      ".join(lines) + "\n    ]")
    header = {"plan": plan.name, "schedule": pl.schedule, "pp": plan.pp,
              "virtual_stages": pl.virtual_stages, "microbatches": pl.microbatches,
              "action": ["kind", "micro-batch", "local chunk",
                         "peer pp rank (sends, receives)" + " or receiving local chunk (turns)" * plan.v_shape]}
    head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
    return "{\n" + head + '  "actions": [\n' + ",\n".join(ranks) + "\n  ]\n}\n"
