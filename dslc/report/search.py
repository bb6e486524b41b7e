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
from ..search.batch import Advice
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


COLUMNS = ("#", "layout", "schedule", "mb", "zero", "recompute", "step", "tokens/s", "MFU", "memory/GPU", "headroom",
           "busiest link", "differs from the plan as written")
WIDTH = 120  # columns the table takes at most (a terminal's width when that is less)
# Shown only where the table still fits its width, the last first: each follows from another
# (headroom from memory and the device's, tokens/s from the step at the plan's batch) or is
# explain's detail (the busiest link); --json has every one.
SPARE = ("headroom", "tokens/s", "busiest link")
RIGHT = {"#", "mb", "step", "tokens/s", "MFU", "memory/GPU", "headroom"}  # the columns set to the right


def cells(row: Row | None, f: Found, busiest: BusiestLink | None) -> dict[str, str]:
    """The row's cell of each of :data:`COLUMNS`."""
    k = knobs(f.plan)
    mesh = k["mesh"] + (" sp" if k.get("sp") == "on" else "") + (f" ({k['cp']})" if "cp" in k else "")
    link = f"{busiest.link} {seconds(busiest.seconds)}" if busiest else "-"
    # the changes in the table's words: micro_batch is its column "mb"
    differs = ", ".join("mb" + c[len("micro_batch"):] if c.startswith("micro_batch ") else c for c in f.changes) or "(as written)"
    if row and row.same:
        differs += f" (+{row.same} other order{'s' * (row.same != 1)} of the axes, the same estimate)"
    return dict(zip(COLUMNS, [str(row.rank) if row else "plan", mesh, k.get("schedule", "-"), k["micro_batch"], k["zero"], k["recompute"],
                              seconds(f.timing.step), f"{f.timing.tokens_per_s:,.0f}", f"{f.timing.mfu:.1%}", size(f.peak), size(f.headroom), link, differs]))


def table(result: Result, shown: list[Row], width: int = WIDTH):
    """The rows, and the plan as written below them when it is not one of them, in at most
    ``width`` columns: a row a line while that fits (the :data:`SPARE` columns left out as
    needed), else each row's differences wrapped on lines of their own under it."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.constrain import Constrain
    from rich.padding import Padding
    from rich.text import Text

    lines = [(cells(r, r.found, r.busiest), "bold green" if r.rank == 1 else None) for r in shown]
    own = result.own
    if own is not None and all(r.found.changes for r in shown):  # none of them the plan's own layout
        lines.append((cells(None, own, _busiest(own)), "dim"))

    def fitted(columns: tuple[str, ...]) -> list[str] | None:
        """``columns`` without the spare ones, then with each spare one that still fits."""
        heads = [h for h in columns if h not in SPARE]
        if _width(_table(heads, lines)) > width:
            return None
        for spare in reversed(SPARE):
            more = [h for h in columns if h in heads or h == spare]
            heads = more if _width(_table(more, lines)) <= width else heads
        return heads

    last = COLUMNS[-1]
    heads = fitted(COLUMNS)
    if heads:
        return _table(heads, lines)
    heads = fitted(COLUMNS[:-1]) or [h for h in COLUMNS[:-1] if h not in SPARE]
    widths = [max(cell_len(h), *(cell_len(c[h]) for c, _ in lines)) for h in heads]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over > 0:  # still too wide (a long mesh): the layout wraps at its spaces
        widths[1] = max(12, widths[1] - over)
    parts = []
    for i, (row, style) in enumerate(lines):
        if style == "dim":
            parts.append(Text(""))  # the plan as written, set apart as a section would be
        parts.append(_table(heads, [(row, style)], widths, header=i == 0))
        parts.append(Padding(Text(row[last], style=style or "dim"), (0, 0, 0, widths[0] + 2)))
    return Constrain(Group(*parts), width)


def _table(heads: list[str], lines: list[tuple[dict[str, str], str | None]], widths: list[int] | None = None, header: bool = True):
    """A rich Table of the columns ``heads`` for ``lines`` (cells, style), a row a line."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold", show_header=header, collapse_padding=True)
    for j, h in enumerate(heads):
        t.add_column(h, justify="right" if h in RIGHT else "left", no_wrap=h != "layout", width=widths[j] if widths else None)
    for i, (row, style) in enumerate(lines):
        if style == "dim" and i:
            t.add_section()
        t.add_row(*(row[h] for h in heads), style=style)
    return t


def _width(renderable) -> int:
    """Columns ``renderable`` takes unwrapped."""
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=10_000).measure(renderable).maximum


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


def batch_lines(result: Result, advice: Advice | None, written: int) -> list[str]:
    """What the summary says of the global batch: the one searched when it is not the
    plan's (``written``), how it holds the layouts back and the batch that would not."""
    gb, tokens = result.plan.train.global_batch, result.plan.train.global_batch * result.plan.model.seq_len
    out = [f"searched at global_batch = {gb} (--global-batch; the plan writes {written})"] if gb != written else []
    if advice is None or advice.offered is None:
        return out
    n = advice.offered
    out.append("the global batch holds these layouts back: " + "; ".join(advice.limits))
    whose = "the plan's" if gb == written else "--global-batch's"
    reach = (f"the fastest layout reaches {'at least ' * advice.at_least}{advice.offered_mfu:.1%} MFU, not {advice.mfu:.1%}"
             if advice.offered_mfu is not None
             else f"it would not hold them back (not searched there: this search was a sample of the shapes; {advice.mfu:.1%} MFU here)")
    out.append(f"at global_batch = {n} ({n // gb}×, {_tokens(n * tokens // gb)} tokens a step) {reach}; the search keeps {whose} "
               f"global_batch = {gb}, a training setting (it changes what the run learns): --global-batch {n} searches at {n}")
    return out


def _tokens(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 10**9 else f"{n / 1e6:.1f}M" if n >= 10**6 else f"{n:,}"


def to_json(result: Result, shown: list[Row], seconds_taken: float, advice: Advice | None = None) -> dict:
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
        "global_batch": p.train.global_batch,
        # how the batch holds the layouts back (null: it does not), and the batch offered
        "batch_limits": advice and {"limits": list(advice.limits), "mfu": advice.mfu, "offered_global_batch": advice.offered,
                                    "offered_mfu": advice.offered_mfu, "offered_mfu_at_least": advice.at_least},
    }
