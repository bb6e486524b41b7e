"""``dslc verify``: each plan shrunk to CPU processes, its script and its serial twin run
and compared (:mod:`dslc.verify`)."""

from __future__ import annotations

import json
import os
import sys

from ..diagnostics import printable
from ..report.terminal import console
from .inputs import UsageError, load_plans


def run(args) -> int:
    """Each plan (or the one named) shrunk, run in parallel and serially, and compared:
    0 all match, 1 a mismatch or plan errors, 2 a run that could not be made."""
    from .. import verify
    from ..verify.run import Stopped, ending_on_signals

    if args.max_procs < 1 or args.steps < 1 or not args.timeout > 0:
        raise UsageError("--max-procs and --steps must be at least 1, --timeout more than 0")
    if args.max_procs > verify.MAX_PROCS:
        raise UsageError(f"--max-procs {args.max_procs}: verify runs at most {verify.MAX_PROCS} CPU processes")
    if args.steps > verify.MAX_STEPS:
        raise UsageError(f"--steps {args.steps}: verify compares at most {verify.MAX_STEPS} steps")
    if args.keep is not None and (args.keep == "" or os.path.exists(args.keep) and not os.path.isdir(args.keep)):
        raise UsageError(f"--keep {args.keep}: it is a file, not a folder" if args.keep else "--keep takes a folder, not ''")
    try:
        with ending_on_signals():  # SIGTERM, SIGHUP, Ctrl-C: the runs ended, the temporary folder removed
            return _verify(args)
    except Stopped as e:
        print(f"dslc: verify stopped by {e}: its processes were ended and its temporary folder removed", file=sys.stderr)
        return 128 + e.signum


def _verify(args) -> int:
    from .. import codegen, verify
    from ..verify.show import render_text

    loaded = load_plans([args.plan_file], args.plan, args.quiet)
    if loaded is None:
        return 1
    result, plans = loaded
    docs, status = [], 0
    for plan in plans:
        if not result.clean(plan):
            print(f"dslc: not verified: plan '{plan.name}' has errors", file=sys.stderr)
            status = max(status, 1)
            continue
        try:
            outcome = verify.verify(plan, args.max_procs, args.steps, args.timeout, args.keep)
        except verify.RunFailed as e:
            print(f"dslc: error: {plan.name}: {printable(str(e))}", file=sys.stderr)
            if e.tail:
                print("\n".join(map(printable, e.tail.rstrip().splitlines())), file=sys.stderr)
            return 2
        except codegen.Unsupported as e:  # before CodegenError, its base
            print(f"dslc: not verified: {plan.name}: {e}", file=sys.stderr)
            status = max(status, 1)
            continue
        except (verify.ShrinkError, codegen.CodegenError) as e:
            raise UsageError(f"{plan.name}: {e}") from None
        status = max(status, 0 if outcome.passed else 1)
        if args.json:
            docs.append(outcome.to_json())
            continue
        out = console()
        for text, style in render_text(outcome):
            out.print(text, style=style)
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, allow_nan=False))
    return status
