"""``dslc diff``: what a change does to a plan's cost, from ``dslc explain --json`` of each
side (:func:`dslc.report.explain.to_json`, the same numbers, not a second estimate).

The plans of the two sides of a file are paired by name (one plan on each side under two
names: renamed); each pair gives a :class:`PlanDiff`: the settings that changed, memory
and whether it fits, the busiest link of each type, bubble, step time, tokens/s, MFU,
memory per stage and the time's parts, each base, new and the change, and the
diagnostics that appear or disappear. :mod:`dslc.report.diff_show` draws them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..codes import FIT_CODES
from ..diagnostics import Diagnostic
from ..units import seconds, si, size


@dataclass(frozen=True)
class Side:
    """One side's plan: its file, its explain JSON (None when it has errors other than not
    fitting, as ``dslc explain`` refuses it) and its diagnostics (its own and its file's)."""

    file: str
    plan: str
    doc: dict | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def fits(self) -> bool | None:
        return None if self.doc is None else all(s["fits"] for s in self.doc["memory"])

    @property
    def errors(self) -> list[str]:
        return sorted({d.code for d in self.diagnostics if d.is_error})


@dataclass(frozen=True)
class FileSide:
    """A file on one side: its plans and the diagnostics of the file and its imports
    (``file`` None: the file is not on that side)."""

    file: str | None
    plans: tuple[Side, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True)
class Row:
    """One number (or setting) of both sides. ``key`` says where it is in ``dslc explain
    --json``; ``unit`` how to write it: bytes, s, rate (tokens/s), fraction, count, flop, text;
    ``better``: whether lower or higher is better (None: neither)."""

    section: str  # layout | cost | links | stages | time
    label: str
    key: str
    unit: str
    base: float | str | None
    new: float | str | None
    better: str | None = None
    over: tuple[bool, bool] = (False, False)  # above the device's memory, base and new

    @property
    def delta(self) -> float | None:
        if self.unit == "text" or self.base is None or self.new is None:
            return None
        return self.new - self.base

    @property
    def percent(self) -> float | None:
        d = self.delta  # none across zero (a headroom that goes negative): no sense as a percentage
        return None if d is None or not self.base or self.base * self.new < 0 else 100.0 * d / abs(self.base)

    @property
    def changed(self) -> bool:
        return self.base != self.new

    @property
    def verdict(self) -> str | None:
        """"better" or "worse" when the row moved the way ``better`` says, else None."""
        d = self.delta
        if not d or self.better is None or (self.percent is not None and abs(self.percent) < 0.05):
            return None
        return "better" if (d < 0) == (self.better == "lower") else "worse"


def _key(d: Diagnostic) -> tuple[str, ...]:
    """What tells a diagnostic from another across the sides: its severity, code and
    message; for not fitting (E090-E092) only the code: the numbers in its message change
    with every change of the plan."""
    return (d.severity.value, d.code) if d.code in FIT_CODES else (d.severity.value, d.code, d.message)


@dataclass(frozen=True)
class PlanDiff:
    name: str  # the plan's name on the new side (the base's when removed); "" for a file without plans
    status: str  # changed | unchanged | added | removed | renamed
    base: Side | None
    new: Side | None
    rows: tuple[Row, ...]
    appeared: tuple[Diagnostic, ...]
    disappeared: tuple[Diagnostic, ...]
    file: str = ""  # for a file without plans: its path

    @property
    def errors_appear(self) -> bool:
        """Whether the change brings an error of a code the base did not have: exit 1."""
        had = set(self.base.errors) if self.base else set()
        return any(d.is_error and d.code not in had for d in self.appeared)

    @property
    def tabled(self) -> bool:
        """Whether the reports show its rows: when the new side is costed and the base is
        not (added, its errors gone), or both are and a number changed."""
        if self.new is None or self.new.doc is None:
            return False
        return self.base is None or self.base.doc is None or any(r.changed for r in self.rows)

    @property
    def title(self) -> str:
        if self.status == "renamed":
            return f"{self.base.plan} → {self.new.plan}"
        return self.name or self.file


def plan_diff(base: Side | None, new: Side | None) -> PlanDiff:
    """The rows and the diagnostics of one plan's two sides (one of them None: added or removed)."""
    b, n = base.doc if base else None, new.doc if new else None
    rows = tuple(_rows(b, n)) if (b or n) else ()
    appeared, disappeared = _moved(base.diagnostics if base else (), new.diagnostics if new else ())
    status = ("added" if base is None else "removed" if new is None else "renamed" if base.plan != new.plan
              else "changed" if appeared or disappeared or any(r.changed for r in rows) or (b is None) != (n is None)
              else "unchanged")
    return PlanDiff((new or base).plan, status, base, new, rows, appeared, disappeared)


def compare(base: FileSide, new: FileSide) -> list[PlanDiff]:
    """Pair the plans of a file's two sides by name; one plan left on each side is the
    same plan renamed. A plan missing from a side whose file has errors (it did not
    lower) is paired with those errors, not reported removed or added."""
    b = {s.plan: s for s in base.plans}
    n = {s.plan: s for s in new.plans}
    only_b = [k for k in b if k not in n]
    only_n = [k for k in n if k not in b]
    pairs: list[tuple[Side | None, Side | None]] = [(b[k], n[k]) for k in b if k in n]
    if len(only_b) == len(only_n) == 1:
        pairs.append((b[only_b[0]], n[only_n[0]]))
        only_b = only_n = []

    def broken(side: FileSide, name: str) -> Side | None:
        if side.file is None or not any(d.is_error for d in side.diagnostics):
            return None
        return Side(side.file, name, None, side.diagnostics)

    pairs += [(b[k], broken(new, k)) for k in only_b]
    pairs += [(broken(base, k), n[k]) for k in only_n]
    out = [plan_diff(x, y) for x, y in pairs]
    if not b and not n:  # no plan on either side: a file of clusters, or one that does not parse or lower
        appeared, disappeared = _moved(base.diagnostics, new.diagnostics)
        sides = [Side(f.file, "", None, f.diagnostics) if f.file else None for f in (base, new)]
        if appeared or disappeared or any(s and s.errors for s in sides):
            out.append(PlanDiff("", "changed" if appeared or disappeared else "unchanged", *sides, (), appeared, disappeared,
                                new.file or base.file or ""))
    return out


def _moved(before: tuple[Diagnostic, ...], after: tuple[Diagnostic, ...]) -> tuple[tuple[Diagnostic, ...], tuple[Diagnostic, ...]]:
    """The diagnostics that appear and those that disappear, told apart by severity, code
    and message (not by line: an edit above one moves it)."""
    old, new = {_key(d) for d in before}, {_key(d) for d in after}
    return (tuple({_key(d): d for d in after if _key(d) not in old}.values()),
            tuple({_key(d): d for d in before if _key(d) not in new}.values()))


# ---------------------------------------------------------------------------- rows


def _get(doc: dict | None, f: Callable[[dict], object]):
    if doc is None:
        return None
    try:
        return f(doc)
    except (KeyError, IndexError, TypeError, ValueError, StopIteration):
        return None


def _peak(doc: dict) -> int:
    return max(s["total"] for s in doc["memory"])


def _link(name: str, field: str) -> Callable[[dict], float]:
    return lambda doc: next(x[field] for x in doc["busiest_links"] if x["link"] == name)


LAYOUT = (  # (label, key, how to read it): shown when they differ
    ("GPUs", "world_size", lambda d: d["world_size"]),
    ("device", "device", lambda d: d["device"]),
    ("parameters", "params.total", lambda d: d["params"]["total"]),
    ("mesh", "layout.mesh", lambda d: d["layout"]["mesh"]),
    ("schedule", "layout.schedule", lambda d: d["layout"]["schedule"]),
    ("micro-batches", "pipeline.microbatches", lambda d: d["pipeline"]["microbatches"]),
    ("micro_batch", "layout.micro_batch", lambda d: d["layout"]["micro_batch"]),
    ("zero", "layout.zero", lambda d: d["layout"]["zero"]),
    ("recompute", "layout.recompute", lambda d: d["layout"]["recompute"]),
    ("sequence parallel", "layout.sp", lambda d: d["layout"]["sp"]),
    ("cp", "layout.cp", lambda d: d["layout"]["cp"]),
)

COST = (  # (label, key, unit, better, how to read it)
    ("memory per GPU (worst stage)", "max(memory[].total)", "bytes", "lower", _peak),
    ("headroom", "device_memory - max(memory[].total)", "bytes", "higher", lambda d: d["device_memory"] - _peak(d)),
    ("fits", "memory[].fits", "text", None, lambda d: "yes" if all(s["fits"] for s in d["memory"]) else "NO"),
    ("step time", "step_time_s", "s", "lower", lambda d: d["step_time_s"]),
    ("tokens/s", "tokens_per_s", "rate", "higher", lambda d: d["tokens_per_s"]),
    ("MFU", "mfu", "fraction", "higher", lambda d: d["mfu"]),
    ("bubble", "pipeline.bubble_fraction", "fraction", "lower", lambda d: d["pipeline"]["bubble_fraction"]),
    ("exposed communication", "time.exposed_comm_s", "s", "lower", lambda d: d["time"]["exposed_comm_s"]),
)

TIME = (
    ("pipeline (forward and backward)", "pipeline.makespan_s", "s", "lower", lambda d: d["pipeline"]["makespan_s"]),
    ("overlapped communication", "time.overlapped_comm_s", "s", None, lambda d: d["time"]["overlapped_comm_s"]),
    ("optimizer step", "time.optimizer_s", "s", "lower", lambda d: d["time"]["optimizer_s"]),
    ("HFU", "hfu", "fraction", None, lambda d: d["hfu"]),
    ("model FLOPs per step", "flops_per_step", "flop", None, lambda d: d["flops_per_step"]),
)


def _rows(b: dict | None, n: dict | None) -> list[Row]:
    rows = []
    for label, key, f in LAYOUT:
        x, y = _get(b, f), _get(n, f)
        if x is not None or y is not None:
            rows.append(Row("layout", label, key, "count" if isinstance(x if x is not None else y, int) else "text", x, y))
    rows += [Row("cost", label, key, unit, _get(b, f), _get(n, f), better) for label, key, unit, better, f in COST]
    links = list(dict.fromkeys(x["link"] for d in (b, n) if d for x in d["busiest_links"]))
    for name in links:
        for label, field, unit in (("traffic on its busiest link", "bytes_per_step", "bytes"), ("busy time", "seconds_per_step", "s")):
            f = _link(name, field)
            rows.append(Row("links", f"{name}: {label}", f"busiest_links[link={name}].{field}", unit, _get(b, f), _get(n, f), "lower"))
    stages = max(len(d["memory"]) for d in (b, n) if d)
    for i in range(stages):
        mb, mn = (_get(d, lambda d: d["memory"][i]) for d in (b, n))
        layers = [str(m["layers"]) if m else "-" for m in (mb, mn)]
        label = f"stage {i} ({layers[0] if layers[0] == layers[1] else ' → '.join(layers)} layers)"
        rows.append(Row("stages", label, f"memory[{i}].total", "bytes", mb and mb["total"], mn and mn["total"], "lower",
                        (bool(mb and not mb["fits"]), bool(mn and not mn["fits"]))))
    rows += [Row("time", label, key, unit, _get(b, f), _get(n, f), better) for label, key, unit, better, f in TIME]
    return rows


# ---------------------------------------------------------------------------- words


MINUS = "\u2212"


def signed(text: str) -> str:
    return text.replace("-", MINUS, 1) if text.startswith("-") else text


def value(unit: str, x) -> str:
    """A value as the reports write it (a negative one with a minus sign)."""
    if isinstance(x, (int, float)) and x < 0:
        return MINUS + value(unit, -x)
    if x is None:
        return "-"
    if unit == "bytes":
        return size(x)
    if unit == "s":
        return seconds(x)
    if unit == "rate":
        return f"{x:,.0f}"
    if unit == "fraction":
        return f"{100 * x:.1f} %"
    if unit == "flop":
        return si(x, "FLOP")
    if unit == "count":
        return f"{x:,}" if isinstance(x, int) else f"{x:.3g}"
    return str(x)


def change(r: Row) -> str:
    """The change of a row: ``+6.00 GiB (+8.6 %)``, ``+1.2 pt`` for a fraction, blank when none."""
    d = r.delta
    if not d:
        return ""
    if r.unit == "fraction":
        return signed(f"{100 * d:+.1f} pt")
    mag = value(r.unit, abs(d))
    pct = f" ({signed(f'{r.percent:+.1f}')} %)" if r.percent is not None else ""
    return ("+" if d > 0 else MINUS) + mag + pct


def _fit_words(s: Side) -> str:
    worst = max(s.doc["memory"], key=lambda m: m["total"])
    return f"stage {worst['stage']} needs {size(worst['total'])} of {size(s.doc['device_memory'])}"


def headline(d: PlanDiff) -> str:
    """One line for the plan: ``llama3_70b: step 4.12 s → 3.80 s (−7.8 %), still fits``."""
    b, n = d.base, d.new
    if not d.name:
        still = [c for c in n.errors if c in b.errors] if b and n else []
        kept = f"has errors on both sides ({', '.join(still)}): not costed" if still else ""
        return f"{d.file}: " + "; ".join(x for x in (kept, _counted(d)) if x)
    if d.status == "unchanged":
        what = f"step {seconds(n.doc['step_time_s'])}, {'fits' if n.fits else 'does not fit'}" if n.doc else f"errors {', '.join(n.errors)}"
        return f"{d.title}: no change ({what})"
    if b is None or n is None:
        s = n or b
        state = (f"step {seconds(s.doc['step_time_s'])}, " + ("fits" if s.fits else f"does not fit: {_fit_words(s)}")
                 if s.doc else f"has errors ({', '.join(s.errors)})")
        return f"{d.title}: " + (f"new plan: {state}" if n else f"removed (it was: {state})") + _counted(d, "; ")
    if b.doc and n.doc and not any(r.changed for r in d.rows):
        words = f"{'renamed, ' * (d.status == 'renamed')}no change in cost (step {seconds(n.doc['step_time_s'])}, " + ("fits)" if n.fits else f"does not fit: {_fit_words(n)})")
    elif b.doc and n.doc:
        step = next(r for r in d.rows if r.key == "step_time_s")
        pct = f" ({signed(f'{step.percent:+.1f}')} %)" if step.percent else ""
        fit = {(True, True): "still fits", (False, True): "now fits", (True, False): f"stops fitting: {_fit_words(n)}",
               (False, False): f"still does not fit: {_fit_words(n)}"}[b.fits, n.fits]
        words = f"step {seconds(b.doc['step_time_s'])} → {seconds(n.doc['step_time_s'])}{pct}, {fit}"
    elif n.doc:
        words = f"its errors are gone ({', '.join(b.errors)}): step {seconds(n.doc['step_time_s'])}, " + ("fits" if n.fits else f"does not fit: {_fit_words(n)}")
    elif b.doc:
        words = f"now has errors ({', '.join(n.errors)}): not costed"
    else:
        words = f"has errors on both sides ({', '.join(n.errors)}): not costed"
    return f"{d.title}: {words}" + _counted(d, "; ")


def _counted(d: PlanDiff, lead: str = "") -> str:
    parts = [f"{len(x)} diagnostic{'s' * (len(x) != 1)} {verb}" for x, verb in ((d.appeared, "appear"), (d.disappeared, "disappear")) if x]
    if len(d.appeared) == 1:
        parts[0] = parts[0].replace("appear", "appears")
    if len(d.disappeared) == 1:
        parts[-1] = parts[-1].replace("disappear", "disappears")
    return lead + ", ".join(parts) if parts else ""


# ---------------------------------------------------------------------------- json


def _diag(d: Diagnostic) -> dict:
    s = d.span
    return {"severity": d.severity.value, "code": d.code, "message": d.message, "file": s.file if s else None,
            "line": s.line if s else None, "fit": d.code in FIT_CODES}


def to_json(diffs: list[PlanDiff], base: str, new: str) -> dict:
    """The diff for tools: every row with its key in ``dslc explain --json``, base, new,
    delta and percent; the diagnostics that appear and disappear."""

    def side(s: Side | None) -> dict | None:
        return None if s is None else {"file": s.file, "plan": s.plan, "costed": s.doc is not None, "fits": s.fits, "errors": s.errors}

    return {
        "base": base,
        "new": new,
        "errors_appear": any(d.errors_appear for d in diffs),
        "plans": [{"plan": d.name, "file": d.file or (d.new or d.base).file, "status": d.status, "headline": headline(d),
                   "base": side(d.base), "new": side(d.new),
                   "rows": [{"section": r.section, "label": r.label, "key": r.key, "unit": r.unit, "base": r.base, "new": r.new,
                             "delta": r.delta, "percent": r.percent} for r in d.rows],
                   "appeared": [_diag(x) for x in d.appeared], "disappeared": [_diag(x) for x in d.disappeared]}
                  for d in diffs],
    }
