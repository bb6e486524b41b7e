"""``dslc verify``: the plan's own parallel script computes what the serial model computes.

A stage after codegen. :mod:`.shrink` makes a tiny copy of the plan that keeps its layout
(mesh axes and their order, schedule, ZeRO, HSDP, cp method, experts, recompute,
optimizer...) and fits in ``max_procs`` CPU processes, and its serial twin; both must pass
the same checks as a user's plan (:func:`lint`; one that does not is a bug in the shrinker:
:class:`ShrinkError`). Both are compiled (without black: they are run, never read) and
trained for a few steps under torchrun on CPU with gloo in fp32 (:mod:`.run`), and the
losses of every step and the final weights are compared as the golden tests compare them
(:mod:`.compare`: 1e-5, fp32's bound).

How MoE near-ties are kept out: a top-k choice between two router logits closer than the
rounding of the parallel layout would flip between the layouts, and the runs would differ
without a bug. The serial run of a mixture of experts observes every router's top-k
(run.MARGIN_RUNNER: it only watches ``Tensor.topk``; the script is unchanged) and reports
the smallest gap between consecutive logits among each token's k + 1 largest. If it is
under :data:`MARGIN` (as the golden plans' seeds keep theirs, tests/golden/mixtral.plan),
the next seed is tried, up to :data:`SEEDS` of them; both runs then use that seed
(``--seed``). If every seed has a near-tie, the runs still go on and the report says so.
The observed gaps are the serial run's: a layout's rounding differences are far below
1e-5 in fp32 over a few steps, which is what the margin assumes.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import codegen, fit
from ..arch import params
from ..diagnostics import Diagnostic
from ..front.defaults import BOUNDS
from ..ir import Plan
from ..report.terminal import progress
from .compare import ATOL, RTOL, Comparison, compare
from .run import RunFailed, launch
from .shrink import MAX_PARAMS, MAX_PROCS, Shrunk, describe, shrink

MARGIN = 1e-5  # the smallest router gap a verified mixture of experts may have
SEEDS = 4  # tried, from the plan's, while the serial run has a near-tie
STEPS = 3
TIMEOUT = 300.0  # seconds a run may take
MAX_STEPS = BOUNDS["train.steps"][1]  # steps a verify may train: the language's bound

__all__ = ["ATOL", "MARGIN", "MAX_PARAMS", "MAX_PROCS", "MAX_STEPS", "RTOL", "Outcome", "RunFailed", "ShrinkError", "compare", "describe", "lint", "shrink", "verify"]


class ShrinkError(Exception):
    """The shrunk plan breaks a rule of dslc.check: a bug in the shrinker."""


@dataclass
class Outcome:
    plan: str
    shrunk: Shrunk
    comparison: Comparison | None = None  # None: nothing to compare (a one-process plan)
    seed: int = 0
    margin: float | None = None  # the serial run's smallest router gap (MoE), else None
    seconds: dict[str, float] = field(default_factory=dict)  # serial, parallel, total

    @property
    def passed(self) -> bool:
        return self.comparison is None or self.comparison.passed

    def to_json(self) -> dict:
        c = self.comparison
        doc = {
            "plan": self.plan, "passed": self.passed, "processes": self.shrunk.plan.world_size,
            "layout": describe(self.shrunk.plan), "notes": list(self.shrunk.notes), "seed": self.seed,
            "router_margin": self.margin, "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }
        if c is not None:
            doc |= {
                "rtol": c.rtol, "atol": c.atol, "first_bad_step": c.first_bad_step,
                "steps": [{"step": s.step, "serial": _num(s.serial), "parallel": _num(s.parallel), "rel_diff": _num(s.rel_diff)}
                          for s in c.steps],
                "weights": {"tensors": c.tensors, "max_diff": _num(c.max_diff), "tensor": c.max_tensor, "failing": list(c.bad_tensors)},
                "problems": list(c.problems),
            }
        return doc


def _num(x: float) -> float | str:
    """``x`` for JSON: a NaN or an infinity as its name ("nan", "inf"), which JSON lacks."""
    return x if math.isfinite(x) else repr(x)


def lint(plan: Plan) -> list[Diagnostic]:
    """The errors of a shrunk plan under the rules a user's plan passes (dslc lint's)."""
    return [d for d in fit.diagnostics(plan) if d.is_error]


def verify(plan: Plan, max_procs: int = 8, steps: int = STEPS, timeout: float = TIMEOUT, keep: Path | None = None,
           patch: Callable[[Path], None] | None = None) -> Outcome:
    """Shrink ``plan``, compile and train it and its serial twin, and compare them.
    ``keep``: the folder to compile and run in (kept; else a temporary one); ``patch``:
    called with the parallel program's folder after it is compiled (tests break it).
    Raises :class:`ShrinkError`, :class:`RunFailed` and codegen's errors."""
    start = time.perf_counter()
    shrunk = shrink(plan, max_procs, steps)
    for p in (shrunk.plan, shrunk.serial):
        errors = lint(p)
        if errors:
            d = errors[0]
            raise ShrinkError(f"the shrunk plan {p.name} breaks {d.code}: {d.message} (a bug in dslc verify's shrinker)")
    n = params(shrunk.plan.model).total
    if n > MAX_PARAMS:
        raise ShrinkError(f"the shrunk plan {shrunk.plan.name} has {n} parameters, more than {MAX_PARAMS} (a bug in dslc verify's shrinker)")
    outcome = Outcome(plan.name, shrunk, seed=shrunk.plan.train.seed)
    if shrunk.plan.world_size == 1:
        return outcome
    with tempfile.TemporaryDirectory(prefix="dslc-verify-") as tmp:
        # absolute: the runs start in the program's folder, and their flags name files under root
        root = (Path(keep).absolute() if keep is not None else Path(tmp)) / plan.name
        _run_both(shrunk, root, timeout, patch, outcome)
    outcome.seconds["total"] = time.perf_counter() - start
    return outcome


def _run_both(shrunk: Shrunk, root: Path, timeout: float, patch, outcome: Outcome) -> None:
    import torch

    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFailed(f"cannot make the folder {root}: {e.strerror or e}") from None
    serial = codegen.write(shrunk.serial, root, layout=False)
    parallel = codegen.write(shrunk.plan, root, layout=False)
    if patch is not None:
        patch(parallel)
    n, moe = shrunk.plan.world_size, shrunk.plan.model.is_moe
    with progress(f"verifying {outcome.plan}", total=2) as bar:
        seeds = [outcome.seed + i for i in range(SEEDS if moe else 1)]
        for seed in seeds:
            bar.advance(0, f"the serial script (1 process, seed {seed})")
            run = launch(serial / "train.py", 1, _flags(root, "serial", seed), timeout, root / "logs",
                         margin=root / "margin.json" if moe else None)
            outcome.seed, outcome.seconds["serial"] = seed, run.seconds
            if moe:
                outcome.margin = json.loads((root / "margin.json").read_text())["margin"]
            tie = moe and outcome.margin is not None and outcome.margin < MARGIN
            bar.log(f"ran the serial script (1 process, seed {seed}): {run.seconds:.1f} s"
                    + (f", smallest router gap {outcome.margin:.2g}" if moe and outcome.margin is not None else "")
                    + (f" < {MARGIN:g}: a near-tie" if tie else ""))
            if not tie:
                break
        bar.advance(1, f"the parallel script ({n} processes)")
        run = launch(parallel / "train.py", n, _flags(root, "parallel", outcome.seed), timeout, root / "logs")
        outcome.seconds["parallel"] = run.seconds
        bar.log(f"ran the parallel script ({n} processes): {run.seconds:.1f} s")
        bar.advance(1)
    losses, ref = (json.loads((root / f"{k}.json").read_text())["loss"] for k in ("parallel", "serial"))
    weights, ref_weights = (torch.load(root / f"{k}.pt", weights_only=True) for k in ("parallel", "serial"))
    outcome.comparison = compare(losses, ref, weights, ref_weights)


def _flags(root: Path, which: str, seed: int) -> list[str]:
    return ["--seed", str(seed), "--dump-losses", str(root / f"{which}.json"), "--dump-weights", str(root / f"{which}.pt")]
