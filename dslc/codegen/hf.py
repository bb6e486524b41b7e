"""The view of Hugging Face checkpoints: what ``--export-hf`` writes and what
``init = hf("DIR")`` reads, as literals for templates/hf.py.jinja (the names and layouts
are the architecture's, :mod:`dslc.arch.hf`)."""

from __future__ import annotations

import json

from .. import arch
from ..ir import Plan


def hf_view(plan: Plan, init_path: str | None) -> dict:
    """``init_path``: the checkpoint folder relative to the generated script (or absolute)."""
    a, m = arch.of(plan.model), plan.model
    copies = tuple(axis for axis in ("dp", "cp") if plan.mesh.size(axis) > 1)
    rows = [_row(row) for row in arch.hf.tensors(a, m)]
    return {
        "hf_tensors": rows,
        "hf_config": repr(arch.hf.config(a, m)),
        "hf_checks": [_row(row) for row in arch.hf.checks(a, m)],
        "hf_exportable": not arch.hf.exportable(m),
        "hf_export_refused": repr(arch.hf.exportable(m)),
        "hf_init": init_path is not None,
        # what the script reads of the folder: lint's bounds and tables (dslc.arch.hf)
        "hf_read_bytes": f"{arch.hf.MAX_CONFIG}, {arch.hf.MAX_INDEX}, {arch.hf.MAX_HEADER}, {arch.hf.MAX_HEADERS}",
        "hf_dtype_bits": repr(arch.hf.DTYPE_BITS),
        "hf_weight_dtypes": "{" + ", ".join(f'"{n}": torch.{t}' for n, t in arch.hf.WEIGHT_DTYPES.items()) + "}",
        "hf_max_dims": arch.hf.MAX_DIMS,
        "hf_init_dir": repr(init_path),
        # the axes whose ranks hold copies of the same weights: --export-hf's writers are
        # the first on each (ZeRO's shards are gathered first)
        "hf_copies": " x ".join(copies),
        "hf_copies_test": " or ".join(f'COORDS["{axis}"]' for axis in copies),
    }


def _row(row: tuple) -> str:
    """A tuple as black writes it (double quotes): the table is not reformatted."""
    def one(x) -> str:
        if isinstance(x, str):
            return json.dumps(x)
        return "(" + ", ".join(map(one, x)) + ("," if len(x) == 1 else "") + ")" if isinstance(x, tuple) else repr(x)

    return one(row)
