"""The report of ``dslc verify``: what was run, each step's losses, the weights, the verdict."""

from __future__ import annotations

from . import Outcome
from .shrink import describe


def render_text(o: Outcome) -> list[tuple[str, str | None]]:
    """The report as lines, each with a rich style (``"green"``, ``"bold red"``) or None."""
    small = o.shrunk.plan
    lines: list[tuple[str, str | None]] = [(f"{o.plan}: shrunk to {describe(small)}", "bold")]
    lines += [(f"  shrunk: {note}", None) for note in o.shrunk.notes]
    c = o.comparison
    if c is None:
        lines.append(("  the plan runs on one process: it is its own serial model; nothing to compare", None))
        lines.append(("PASS (nothing to compare)", "green"))
        return lines
    lines.append((f"  against one process, seed {o.seed}, {len(c.steps)} steps, fp32, synthetic data", None))
    if o.margin is not None:
        lines.append((f"  smallest router gap of the serial run: {o.margin:.3g} (near-ties below 1e-5 flip between layouts)", None))
    lines.append((f"  {'step':>6}  {'serial loss':>14}  {'parallel loss':>14}  {'rel. diff':>9}", None))
    for s in c.steps:
        style = None if s.ok(c.rtol) else "red"
        lines.append((f"  {s.step:>6}  {s.serial:>14.8f}  {s.parallel:>14.8f}  {s.rel_diff:>9.2e}", style))
    if c.max_tensor is not None:
        lines.append((f"  weights: {c.tensors} tensors, largest difference {c.max_diff:.3g} in {c.max_tensor}"
                      f" (bound {c.atol:g} + {c.rtol:g}·|w|)", None if not c.bad_tensors else "red"))
    lines.append((c.summary(), "bold green" if c.passed else "bold red"))
    return lines
