"""Pictures of a pipeline schedule: a timeline image (matplotlib) and a terminal grid.

Both read the action lists of :func:`dslc.cost.schedule.build` and the timeline of
:func:`dslc.cost.schedule.simulate`: one row per pipeline rank, time across. matplotlib is imported
inside :func:`draw` only, so importing this module (and ``dslc lint``) stays fast.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..chunks import Placement
from ..cost.schedule import COMPUTE, Action, Schedule, Simulation, message, placed

# One look per kind: the micro-batch picks the colour, the kind its shade and hatch.
KIND_LOOK = {
    "F": {"shade": 0.0, "hatch": "", "name": "F  forward"},
    "B": {"shade": -0.35, "hatch": "///", "name": "B  backward"},
    "W": {"shade": 0.5, "hatch": "...", "name": "W  weight gradient"},
}
MESSAGE_LOOK = {
    "F": ("#444444", "activation send → recv"),
    "B": ("#c0392b", "gradient send → recv"),
}
IDLE = "#e6e6e6"
PAIR = "#1f4e79"  # the outline of an overlapped F&B pair (dualpipe_v)


def shape(actions: Schedule) -> tuple[int, int, int]:
    """(pp, microbatches, virtual_stages) of a schedule: its placement's, and the micro-batches
    read off its actions."""
    at = placed(actions).placement
    return at.pp, 1 + max((a.microbatch for acts in actions for a in acts), default=-1), at.v


def _label(a: Action, v: int) -> str:
    """``F3``, ``B3·1``; the B of an overlapped F&B pair ``&B3·1``."""
    return "&" * a.overlaps + a.label(chunks=v > 1)


def pairs(sim: Simulation) -> list[tuple[int, float, float]]:
    """(rank, start, end) of each overlapped F&B pair of the timeline: its F's start to its B's end."""
    out, last = [], {}
    for r, a, s, e in sim.timeline:
        if a.kind in COMPUTE:
            if a.overlaps and r in last:
                out.append((r, last[r], e))
            last[r] = s
    return out


def draw(actions: Schedule, sim: Simulation, path: str | Path, *, schedule: str = "",
         time_unit: str = "") -> Path:
    """Write the timeline as PNG or SVG (chosen by the suffix of ``path``); return the path.

    Each compute is a box coloured by micro-batch, shaded and hatched by kind (F plain, B dark
    and striped, W light and dotted) and labelled ``F3``, or ``F3·1`` with chunks when it fits;
    every message is a line from the end of its send to the end of its receive (dark:
    activations, red: gradients; left out when boxes are only a few pixels wide, as for
    pp=16, m=64, v=4); an overlapped F&B pair (dualpipe_v) is outlined as one, its B labelled
    ``&B3``, and its F's activation leaves while its B computes; idle time shows as grey gaps. ``schedule`` names the schedule
    in the title; ``time_unit`` labels the time axis ("s", "ms"; default: cost units)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"cannot draw {path}: the file must end in .png or .svg")
    from matplotlib import colormaps
    from matplotlib.collections import LineCollection, PatchCollection
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    p, m, v = shape(actions)
    span = sim.makespan or 1.0
    computes = [row for row in sim.timeline if row[1].kind in COMPUTE]
    unit = min((end - start for _, _, start, end in computes if end > start), default=span)
    width = min(max(6.0, 1.5 + 0.42 * span / unit), 20.0)
    fig = Figure(figsize=(width, 1.9 + 0.5 * p), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    palette = colormaps["tab20" if m <= 20 else "turbo"]

    def colour(mb: int, shade: float) -> tuple[float, ...]:
        # tab20 pairs a dark and a light hue: take the ten dark ones first, neighbours differ
        index = (2 * mb) % 20 + (mb % 20) // 10 if m <= 20 else mb / max(m - 1, 1)
        return _shade(to_rgb(palette(index)), shade)

    for r in range(p):  # the row background shows through the gaps: the bubbles
        ax.add_patch(Rectangle((0, r - 0.36), span, 0.72, facecolor=IDLE, edgecolor="none"))
    px_per_unit = (width - 1.5) * 150 / span
    detailed = unit * px_per_unit >= 6  # boxes wide enough for edges and message lines
    for kind, look in KIND_LOOK.items():
        boxes = [(r, a, s, e) for r, a, s, e in computes if a.kind == kind]
        if not boxes:
            continue
        ax.add_collection(PatchCollection(
            [Rectangle((s, r - 0.34), e - s, 0.68) for r, _, s, e in boxes],
            facecolors=[colour(a.microbatch, look["shade"]) for _, a, _, _ in boxes],
            edgecolors="#222222", linewidths=0.5 if detailed else 0.0, hatch=look["hatch"]))
        for r, a, s, e in boxes:
            text = _label(a, v)
            if (e - s) * px_per_unit > 9 * len(text) + 8:  # a label on a white tag, if it fits
                ax.text((s + e) / 2, r, text, ha="center", va="center", fontsize=7.5,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                              "alpha": 0.85})
    if detailed:
        _draw_messages(ax, sim, actions.placement, LineCollection)
    overlapped = pairs(sim)
    ax.add_collection(PatchCollection(
        [Rectangle((s, r - 0.44), e - s, 0.88) for r, s, e in overlapped],
        facecolors="none", edgecolors=PAIR, linewidths=1.6 if detailed else 0.8))

    ax.set_xlim(0, span)
    ax.set_ylim(p - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_xlabel(f"time ({time_unit or 'cost units'})")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.tick_params(axis="y", length=0)
    held = "chunk activations" if v > 1 else "micro-batches"
    ax.set_title(
        f"{schedule + ' · ' if schedule else ''}pp={p}, m={m}, v={v} · "
        f"bubble {sim.bubble_fraction:.1%} of ideal time (idle {sim.idle_fraction:.1%} of "
        f"makespan {sim.makespan:g})\npeak in-flight {held} per rank: "
        f"{', '.join(map(str, sim.peak_inflight))}", fontsize=10, loc="left")
    kinds = {a.kind for _, a, _, _ in computes}
    handles = [Patch(facecolor=_shade(to_rgb("#8c8c8c"), look["shade"]), edgecolor="#222222",
                     hatch=look["hatch"],
                     label=look["name"] if kind != "B" or "W" not in kinds else "B  input gradient")
               for kind, look in KIND_LOOK.items() if kind in kinds]
    if overlapped:
        handles.append(Patch(facecolor="none", edgecolor=PAIR, lw=1.6, label="&  overlapped F&B pair"))
    if detailed:
        handles += [Line2D([], [], color=c, lw=1, label=name) for c, name in MESSAGE_LOOK.values()]
    handles.append(Patch(facecolor=IDLE, label="idle (bubble)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
               frameon=False, title="colour = micro-batch", title_fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _shade(rgb: tuple[float, ...], shade: float) -> tuple[float, ...]:
    """Darken (shade < 0) or lighten (shade > 0) a colour by that fraction."""
    return tuple(c * (1 + shade) if shade < 0 else c + (1 - c) * shade for c in rgb)


def _draw_messages(ax, sim: Simulation, at: Placement, line_collection) -> None:
    """A line per message from the end of its send to the end of its receive, with the send's
    own duration as a thin bar under the sender's row."""
    ends: dict[tuple, float] = {}
    for r, a, _, e in sim.timeline:
        if a.kind.startswith("RECV"):
            ends[message(a, r, at)] = (r, e)
    for d, (col, _) in MESSAGE_LOOK.items():
        segments, bars = [], []
        for r, a, s, e in sim.timeline:
            if a.kind == "SEND_" + d and message(a, r, at) in ends:
                q, arrive = ends[message(a, r, at)]
                edge = 0.36 if q > r else -0.36  # leave the sender's row towards the receiver
                segments.append([(e, r + edge), (arrive, q - edge)])
                if e > s:
                    bars.append([(s, r + 0.38), (e, r + 0.38)])
        ax.add_collection(line_collection(segments, colors=col, linewidths=0.7, alpha=0.55))
        ax.add_collection(line_collection(bars, colors=col, linewidths=2.5))
        if segments:
            ax.scatter([s[1][0] for s in segments], [s[1][1] for s in segments], s=6, color=col,
                       marker="o", zorder=3, linewidths=0)


def text_grid(actions: Schedule, sim: Simulation, width: int = 80, time_unit: str = "", max_lines: int = 60) -> str:
    """Terminal rendering within ``width`` columns: a summary, a legend, then the timeline
    in bands, each a time ruler and one row per rank.

    A slot lasts the shortest compute and each compute covers the slots between its start
    and end rounded to slot boundaries. A cell shows the label where a compute starts
    (``F3``: forward of micro-batch 3; ``B3·1``: its backward in chunk 1), ``~`` while it
    continues and ``.`` while the rank idles; ``&B3`` is the B of an overlapped F&B pair
    (``&`` one character a slot), run with the F just before it. When that takes more than ``max_lines``
    lines, one character per slot (F, B, W, ``.``); when even that does, slots are widened
    to fit and show the kind that kept the rank busiest (``.`` if it idled for most)."""
    p, m, v = shape(actions)
    unit = time_unit or "time units"
    computes = [row for row in sim.timeline if row[1].kind in COMPUTE]
    span = sim.makespan
    step = min((e - s for _, _, s, e in computes if e > s), default=span or 1.0)
    prefix = len(f"rank {p - 1} ") + 1
    room = max(8, width - prefix)
    slots = max(1, math.ceil(span / step - 1e-9))
    cell = 1 + max((len(_label(a, v)) for _, a, _, _ in computes), default=1)
    lines_for = lambda n, c: math.ceil(n * c / room) * (p + 1)  # noqa: E731 (bands of a ruler and p rows)
    if lines_for(slots, cell) > max_lines:
        cell = 1
    coarse = lines_for(slots, 1) > max_lines
    if coarse:
        slots = room * max(1, max_lines // (p + 1))
        step = span / slots
    grid = [["."] * slots for _ in range(p)]
    busy: dict[tuple[int, int, str], float] = defaultdict(float)
    for r, a, s, e in computes:
        if coarse:
            for k in range(int(s / step), min(slots, math.ceil(e / step))):
                busy[(r, k, "&" if a.overlaps else a.kind)] += min(e, (k + 1) * step) - max(s, k * step)
            continue
        lo = math.floor(s / step + 0.5)
        for k in range(lo, min(slots, max(lo + 1, math.floor(e / step + 0.5)))):
            grid[r][k] = ("&" if a.overlaps else a.kind) if cell == 1 else _label(a, v) if k == lo else "~"
    for (r, k, kind), t in busy.items():
        total = sum(busy.get((r, k, x), 0.0) for x in (*COMPUTE, "&"))
        if total >= step / 2 and t == max(busy.get((r, k, x), 0.0) for x in (*COMPUTE, "&")):
            grid[r][k] = kind
    kinds = sorted({a.kind for _, a, _, _ in computes}, key="FBW".index)
    names = {"F": "forward", "B": "backward", "W": "weight gradient"}
    legend = ", ".join(f"{k}{'3' * (cell > 1)} {names[k]}{' of micro-batch 3' * (cell > 1 and k == 'F')}" for k in kinds)
    if cell > 1:
        legend += (", ·1 in chunk 1" if v > 1 else "") + ", ~ continues"
    if any(a.overlaps for _, a, _, _ in computes):
        legend += f", {'&B3' if cell > 1 else '&'} backward overlapped with the forward before it (an F&B pair)"
    lines = [f"{p} rank{'s' * (p > 1)}, m={m}, v={v}; bubble {sim.bubble_fraction:.1%} of ideal, makespan {span:.4g} {unit}",
             f"one column = {step:.3g} {unit}", f"{legend}, . idle"]
    per_band = max(1, room // cell)
    for first in range(0, slots, per_band):
        lines.append(" " * prefix + f"t = {first * step:.4g} {unit}")
        for r, row in enumerate(grid):
            lines.append(f"rank {r}".ljust(prefix) + "".join(c.ljust(cell) for c in row[first:first + per_band]).rstrip())
    return "\n".join(lines) + "\n"


def to_json(plan, actions: Schedule, sim: Simulation, t) -> dict:
    """``dslc schedule --json``: every rank's action list with its simulated start and end
    (ms) and the global chunk of each local chunk (the schedule's placement), and the plan's
    costs ``t`` (dslc.cost.time.timing) in ms."""
    pl, at = plan.pipeline, placed(actions).placement
    rows: dict[int, list] = {r: [] for r in range(len(actions))}
    for rank, a, start, end in sim.timeline:
        rows[rank].append({"kind": a.kind, "microbatch": a.microbatch, "chunk": a.chunk, "peer": a.peer,
                           "overlaps": a.overlaps, "start_ms": round(start, 6), "end_ms": round(end, 6)})
    return {
        "plan": plan.name,
        "schedule": pl.schedule,
        "pp": plan.pp,
        "microbatches": pl.microbatches,
        "virtual_stages": pl.virtual_stages,
        "placement": "v" if at.v_shape else "interleaved",
        "costs_ms": {"forward": t.t_f * 1e3, "backward": t.t_b * 1e3, "weight_grad": t.t_w * 1e3, "p2p": t.t_comm * 1e3},
        "bubble_fraction": sim.bubble_fraction,
        "makespan_ms": sim.makespan,
        "peak_inflight": list(sim.peak_inflight),
        "ranks": [{"rank": r, "chunks": list(at.ids(r)), "actions": rows[r]} for r in sorted(rows)],
    }
