"""``dslc explain``: the estimates of each plan (:mod:`dslc.report.explain`), as text or JSON;
a plan that only fails to fit (E090-E092) is still explained."""

from __future__ import annotations

import json

from ..codes import FIT_CODES
from .inputs import emit, load, pick


def run(args) -> int:
    from ..report import explain as report

    result = load(args.paths)
    emit(result.diagnostics, result.sources, quiet=args.quiet)
    # a plan that only fails to fit (E090-E092) is still explained: the report shows why
    errors = [d for d in result.diagnostics if d.is_error]
    if any(d.code not in FIT_CODES for d in errors):
        return 1
    plans = pick(result, args.plan)
    if args.json:
        docs = [report.to_json(report.explain(p)) for p in plans]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, allow_nan=False))
    else:
        print("\n\n".join(report.render_text(report.explain(p)) for p in plans))
    return 1 if errors else 0
