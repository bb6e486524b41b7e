"""A plan's layout as a plan writes it, by key (:func:`knobs`), and its mesh in one label
(:func:`layout_label`): what ``dslc search`` varies and ranks, and what ``dslc explain
--json`` reports as the plan's layout. A foundation module, so the report reads it
without importing the search.
"""

from __future__ import annotations

from .ir import Offload, Plan


def layout_label(p: Plan) -> str:
    """``dp8 × pp4 × tp8`` (outermost first), ``serial`` for one rank."""
    return " × ".join(f"{a.name}{a.size}" for a in p.mesh.axes if a.size > 1) or "serial"


def knobs(p: Plan) -> dict[str, str]:
    """The layout settings as a plan writes them, by key."""
    pl, dp = p.pipeline, p.data_parallel
    out = {"mesh": layout_label(p)}
    if p.pp > 1:
        out["schedule"] = pl.schedule + (f" v{pl.virtual_stages}" if pl.virtual_stages > 1 else "")
    out["micro_batch"] = str(p.train.micro_batch)
    out["zero"] = str(dp.zero) + (f" shard {dp.shard}" if dp.hsdp(p.dp) else "")
    out["recompute"] = p.train.recompute_label
    if p.tp > 1:
        out["sp"] = "on" if p.tensor_parallel.sequence_parallel else "off"
    if p.cp > 1:
        out["cp"] = p.context_parallel.method
    if offload_label(p.train.offload):
        out["offload"] = offload_label(p.train.offload)
    return out


def offload_label(o: Offload | None) -> str:
    """What an offload block moves, as words: "optimizer+activations", or ""."""
    return "+".join(k for k in ("optimizer", "activations") if o and getattr(o, k))


def offload_text(o: Offload) -> str:
    """The block as a plan writes it: ``offload { optimizer = true }``."""
    return "offload { " + "; ".join(f"{k} = true" for k in ("optimizer", "activations") if getattr(o, k)) + " }"
