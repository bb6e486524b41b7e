"""``dslc lint``: every diagnostic of the plan files, in the format asked for, and a line
saying what was read when there is none."""

from __future__ import annotations

import sys

from ..diagnostics import Severity, has_errors
from .inputs import emit, load


def run(args) -> int:
    result = load(args.paths)
    diags = [d for d in result.diagnostics if not (args.quiet and d.severity is Severity.NOTE)]
    emit(diags, result.sources, args.format, sys.stdout)
    if args.format == "text" and not diags:
        n, files, defs = len(result.distinct_plans), len(result.program.files), result.library
        library = f", and {defs} cluster or model definition{'s' * (defs != 1)} no plan uses" if defs else ""
        print(f"ok: {n} plan{'s' * (n != 1)} in {files} file{'s' * (files != 1)}{library}", file=sys.stderr)
    return 1 if has_errors(diags, args.strict) else 0
