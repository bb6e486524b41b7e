"""Whether two plans have the same layout: what :mod:`dslc.front.edit` holds the plan file
it wrote to (:func:`same_layout`)."""

from __future__ import annotations

import dataclasses
import os

from .. import ir


def same_layout(a: ir.Plan, b: ir.Plan) -> list[str]:
    """The fields in which two plans differ (``mesh.axes[1].size``, ``train.micro_batch``),
    leaving out the plan's name, file and spans, the paths as written (their resolved paths
    are compared, made absolute) and settings that have no effect and cannot be written
    without a warning: context-parallel options without cp (W063), reshard_after_forward
    without zero = 3 (W102), the schedule, virtual stages and split without pp (W057)."""
    return _diff(_normal(a), _normal(b), "")


def _normal(p: ir.Plan) -> dict:
    d = _strip(p)
    del d["name"], d["file"]
    if p.cp == 1:
        d["context_parallel"] = None
    if p.data_parallel.zero != 3:
        d["data_parallel"]["reshard_after_forward"] = None
    if p.pp == 1:
        d["pipeline"].update(schedule=None, virtual_stages=None, layers_per_stage=None)
    return d


def _strip(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out = {f.name: _strip(getattr(x, f.name)) for f in dataclasses.fields(x) if f.name not in ("span", "spans")}
        if isinstance(x, (ir.Data, ir.Init)):
            out["path"] = None  # as written, relative to its file
            out["resolved_path"] = out["resolved_path"] and os.path.abspath(out["resolved_path"])
        return out
    if isinstance(x, (tuple, list)):
        return [_strip(i) for i in x]
    return x


def _diff(a, b, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in dict.fromkeys([*a, *b]) for d in _diff(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]
