"""``train { recompute = … }``: a policy for every layer, or ``full every N``."""

from __future__ import annotations

from .. import ir
from ..diagnostics import error
from . import ast
from .defaults import DEFAULTS as D
from .schema import Fields, Reader, describe, shown

# the policies whose blocks the script runs eagerly: selective_ops picks the ops to keep
# as they are dispatched, one by one, which a compiled graph does not do
EAGER_POLICIES = ("selective_ops",)


def recompute_policy(r: Reader, f: Fields) -> tuple[str, int]:
    """``recompute = POLICY``, or ``full every N``: blocks N-1, 2N-1, … (0-based) recomputed
    in full, the others keeping their activations (torchtitan's layer-frequency AC)."""
    a, default = f.assigns.get("recompute"), D["train.recompute"]
    if a is None or not isinstance(a.value, ast.Every):
        return r.choice(f, "recompute", ir.RECOMPUTE, default) or default, 1
    v = a.value
    n = v.count.value if isinstance(v.count, ast.Number) else None
    if v.name not in ir.RECOMPUTE:
        r.diags.append(r.unknown("E019", f"'{v.name}' is not a valid recompute", v.name, ir.RECOMPUTE, v.name_span))
    elif v.name != "full":
        r.diags.append(error("E024", v.span, f"only full recompute is applied to every N-th layer, not {v.name}",
                             f"write `recompute = {v.name}` for every layer, or `recompute = full every N`"))
    elif not isinstance(n, int) or n < 1:
        got = f"{shown(n)}" if isinstance(n, int) else describe(v.count)
        r.diags.append(error("E024", v.count.span, f"`every` takes a whole number of layers, at least 1, got {got}",
                             "`full every 2` recomputes every second block"))
    else:
        return "full", n
    return default, 1
