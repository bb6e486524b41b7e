"""``dslc search``'s answer: the fastest layouts as a table for a person (:func:`table`) or a
dict for a tool (:func:`to_json`), and the plan as written beside them.

Each row's busiest link comes from the full estimate (:func:`dslc.cost.estimate.estimate`,
every rank's traffic charged to the links), which only the rows shown pay for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.estimate import estimate
from ..cost.links import BusiestLink
from ..knobs import knobs
from ..search import Found, Result
from ..units import seconds, size


@dataclass(frozen=True)
class Row:
    rank: int  # 1: the fastest
    found: Found
    busiest: BusiestLink | None
    same: int  # layouts of the same estimate left out (the same axes in another order, ...)


def rows(result: Result, top: int) -> list[Row]:
    """The ``top`` fastest distinct layouts: of those whose estimate (step and memory) and
    settings are the same but for the order of the mesh axes, the first stands for all."""
    shown: list[Found] = []
    same: dict[tuple, list] = {}  # key -> [index in shown or None, how many left out]
    for f in result.ranked:
        key = (round(f.timing.step, 9), f.peak, tuple(sorted((a.name, a.size) for a in f.plan.mesh.axes)),
               tuple((k, v) for k, v in knobs(f.plan).items() if k != "mesh"))
        if key in same:
            same[key][1] += 1
        elif len(shown) < top:
            same[key] = [len(shown), 0]
            shown.append(f)
        else:
            same[key] = [None, 0]
    left_out = {i: n for i, n in same.values() if i is not None}
    return [Row(i + 1, f, _busiest(f), left_out[i]) for i, f in enumerate(shown)]


def _busiest(f: Found) -> BusiestLink | None:
    busiest = estimate(f.plan).busiest
    return busiest[0] if busiest else None


def own_rank(result: Result) -> int | None:
    """Where the plan as written would stand among the layouts found (1: fastest)."""
    if result.own is None:
        return None
    return 1 + sum(f.timing.step < result.own.timing.step for f in result.ranked)


HEAD = ("#", "layout", "schedule", "mb", "zero", "recompute", "step", "tokens/s", "MFU", "memory/GPU", "headroom", "busiest link", "differs from the plan as written")
RIGHT = {0, 3, 6, 7, 8, 9, 10}


def cells(row: Row | None, f: Found, busiest: BusiestLink | None) -> list[str]:
    k = knobs(f.plan)
    mesh = k["mesh"] + (" sp" if k.get("sp") == "on" else "") + (f" ({k['cp']})" if "cp" in k else "")
    link = f"{busiest.link} {seconds(busiest.seconds)}" if busiest else "-"
    differs = ", ".join(f.changes) or "(as written)"
    if row and row.same:
        differs += f" (+{row.same} other order{'s' * (row.same != 1)} of the axes, the same estimate)"
    return [str(row.rank) if row else "plan", mesh, k.get("schedule", "-"), k["micro_batch"], k["zero"], k["recompute"],
            seconds(f.timing.step), f"{f.timing.tokens_per_s:,.0f}", f"{f.timing.mfu:.1%}", size(f.peak), size(f.headroom), link, differs]


def table(result: Result, shown: list[Row]):
    """A rich Table of the rows, and the plan as written below them when it is not one of them."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for i, h in enumerate(HEAD):
        t.add_column(h, justify="right" if i in RIGHT else "left", overflow="fold")
    for r in shown:
        t.add_row(*cells(r, r.found, r.busiest), style="bold green" if r.rank == 1 else None)
    own = result.own
    if own is not None and all(r.found.plan != own.plan for r in shown):
        t.add_section()
        t.add_row(*cells(None, own, _busiest(own)), style="dim")
    return t


def summary(result: Result, seconds_taken: float) -> str:
    p = result.plan
    where = f"{p.cluster.world_size} × {p.cluster.device.name}"
    own = own_rank(result)
    mine = (f"the plan as written ranks {own} of {len(result.ranked)}" if own is not None
            else "the plan as written does not fit or does not pass the rules on these GPUs"
            + "".join(f" ({code}: {message})" for code, message in result.refused))
    return (f"{p.name} on {where}: {result.shapes} shapes of the mesh ({result.memory_pruned} too large even at the most "
            f"frugal settings, {result.rule_pruned} refused by the rules), {result.costed} layouts costed, "
            f"{len(result.ranked)} fit, in {seconds_taken:.1f} s; {mine}"
            + (f"; {result.unprobed} more degree combinations not probed (the search's bound)" if result.unprobed else "")
            + (f"; {result.unsearched} shapes and schedules left out once the search's work bound was spent" if result.unsearched else ""))


def to_json(result: Result, shown: list[Row], seconds_taken: float) -> dict:
    def doc(f: Found, busiest: BusiestLink | None) -> dict:
        return {
            "layout": knobs(f.plan),
            "mesh": [{"axis": a.name, "size": a.size, "link": a.link} for a in f.plan.mesh.axes],
            "microbatches": f.plan.microbatches,
            "step_s": f.timing.step,
            "tokens_per_s": f.timing.tokens_per_s,
            "mfu": f.timing.mfu,
            "bubble_fraction": f.timing.bubble_fraction,
            "memory_bytes": f.peak,
            "headroom_bytes": f.headroom,
            "busiest_link": ({"link": busiest.link, "seconds_per_step": busiest.seconds, "bytes_per_step": busiest.bytes}
                             if busiest else None),
            "changes": list(f.changes),
        }

    p = result.plan
    return {
        "plan": p.name,
        "gpus": p.cluster.world_size,
        "device": p.cluster.device.name,
        "shapes": result.shapes,
        "unprobed_degrees": result.unprobed,
        "unsearched": result.unsearched,
        "memory_pruned": result.memory_pruned,
        "rule_pruned": result.rule_pruned,
        "costed": result.costed,
        "fit": len(result.ranked),
        "seconds": seconds_taken,
        "layouts": [doc(r.found, r.busiest) | {"rank": r.rank, "same_estimate": r.same} for r in shown],
        "as_written": (doc(result.own, _busiest(result.own)) | {"rank": own_rank(result)}) if result.own else None,
        "as_written_refused": [{"code": code, "message": message} for code, message in result.refused],
    }
