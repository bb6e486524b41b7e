"""The comparison ``dslc verify`` makes, as the golden tests make it (tests/test_golden.py):
every step's loss within ``rtol`` of the serial run's, relative; every final weight ``w``
within ``atol + rtol · |w_serial|`` of the serial run's (torch.testing.assert_close's
bound); 1e-5 both, the bound of fp32. A NaN anywhere fails."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RTOL = 1e-5
ATOL = 1e-5


@dataclass(frozen=True)
class Step:
    step: int  # from 1
    serial: float
    parallel: float

    @property
    def rel_diff(self) -> float:
        """|parallel − serial| / |serial| (NaN when either is NaN)."""
        diff = abs(self.parallel - self.serial)
        return diff / abs(self.serial) if self.serial else diff

    def ok(self, rtol: float = RTOL) -> bool:
        return self.rel_diff <= rtol  # False for NaN


@dataclass(frozen=True)
class Comparison:
    steps: tuple[Step, ...]
    rtol: float
    atol: float
    tensors: int  # compared
    max_diff: float  # the largest |parallel − serial| of any weight element (inf: NaN)
    max_tensor: str | None  # where it is
    bad_tensors: tuple[str, ...]  # past the bound, the worst first
    problems: tuple[str, ...] = field(default=())  # steps or tensors missing, shapes that differ

    @property
    def first_bad_step(self) -> int | None:
        return next((s.step for s in self.steps if not s.ok(self.rtol)), None)

    @property
    def passed(self) -> bool:
        return self.first_bad_step is None and not self.bad_tensors and not self.problems

    def summary(self) -> str:
        """One line: what passed, or the first step and the tensor that did not."""
        if self.passed:
            whose = "1 step's" if len(self.steps) == 1 else f"{len(self.steps)} steps'"
            return (f"PASS: {whose} losses within {self.rtol:g} relative; "
                    f"{self.tensors} weight tensors, largest difference {self.max_diff:.3g} ({self.max_tensor})")
        parts = []
        bad = self.first_bad_step
        if bad is not None:
            s = self.steps[bad - 1]
            parts.append(f"the loss first differs at step {bad}: {s.parallel!r} parallel, {s.serial!r} serial "
                         f"(relative difference {s.rel_diff:.3g} > {self.rtol:g})")
        if self.bad_tensors:
            more = f" and {len(self.bad_tensors) - 1} more tensors" if len(self.bad_tensors) > 1 else ""
            parts.append(f"the final weights differ most in {self.bad_tensors[0]} (by {self.max_diff:.3g}){more}")
        parts.extend(self.problems)
        return "FAIL: " + "; ".join(parts)


def compare(losses, ref_losses, weights: dict, ref_weights: dict, rtol: float = RTOL, atol: float = ATOL) -> Comparison:
    """The parallel run's ``losses`` (a list, one a step) and ``weights`` (name → tensor)
    against the serial run's ``ref_losses`` and ``ref_weights``."""
    problems = []
    steps = tuple(Step(i, float(want), float(got)) for i, (got, want) in enumerate(zip(losses, ref_losses), 1))
    if len(losses) != len(ref_losses):
        problems.append(f"the parallel run logged {len(losses)} steps, the serial {len(ref_losses)}")
    missing = sorted(set(ref_weights) ^ set(weights))
    if missing:
        problems.append(f"tensors in one run only: {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else ""))
    worst: list[tuple[float, str]] = []
    bad: list[tuple[float, str]] = []
    for name in sorted(set(ref_weights) & set(weights)):
        got, want = weights[name], ref_weights[name]
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{name} is {tuple(got.shape)} in the parallel run, {tuple(want.shape)} in the serial")
            continue
        got, want = got.double(), want.double()
        diff = (got - want).abs()
        nan = bool(diff.isnan().any()) or bool(diff.isinf().any())
        largest = math.inf if nan else (float(diff.max()) if diff.numel() else 0.0)
        worst.append((largest, name))
        if nan or bool((diff > atol + rtol * want.abs()).any()):
            bad.append((largest, name))
    worst.sort(key=lambda x: (-x[0], x[1]))
    bad.sort(key=lambda x: (-x[0], x[1]))
    top = bad[0] if bad else (worst[0] if worst else (0.0, None))
    return Comparison(steps, rtol, atol, len(worst), top[0], top[1], tuple(n for _, n in bad), tuple(problems))
