"""The code generator's two exceptions; their messages fit on one line."""

from __future__ import annotations

from ..diagnostics import Diagnostic, error
from ..ir import Plan


class CodegenError(Exception):
    """Output that cannot be written, or an internal error; the message is one line."""


class Unsupported(CodegenError):
    """A plan that the generator cannot compile (yet): ``reasons`` names every why."""

    def __init__(self, *reasons: str):
        super().__init__("; ".join(reasons))
        self.reasons = reasons

    def diagnostic(self, plan: Plan) -> Diagnostic:
        """E100 at the plan (``dslc compile``), naming every reason."""
        n = len(self.reasons)
        why = f": {self.reasons[0]}" if n == 1 else f", for {n} reasons: " + "; ".join(f"({i}) {r}" for i, r in enumerate(self.reasons, 1))
        return error("E100", plan.span, f"plan '{plan.name}' cannot be compiled yet{why}")
