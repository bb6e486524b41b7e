"""``dslc compile``: the generated package of every clean plan, each folder written whole or
not at all, or with ``--check`` the files that are out of date."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..diagnostics import has_errors
from ..driver import output_clashes
from ..report.terminal import progress
from .inputs import UsageError, emit, load, pick


def run(args) -> int:
    """Writes every plan that is clean (no lint error in it or its file, no clash, nothing
    the generator cannot emit), each folder whole or not at all, and names the rest."""
    result = load(args.paths)
    emit(result.diagnostics, result.sources, quiet=args.quiet)
    if args.plan and has_errors(result.diagnostics) and all(p.name != args.plan for p in result.own_plans):
        print(f"dslc: not compiled: no plan named {args.plan!r} was read without errors", file=sys.stderr)
        return 1
    plans = pick(result, args.plan)
    clashes = output_clashes(plans)
    emit(clashes, result.sources)
    clashing = {p.name for p in plans for d in clashes if d.span == p.span}
    from .. import codegen

    root = Path(args.output) if args.output else codegen.DEFAULT_ROOT
    refused, stale, wrote = [], [], 0
    # --plan: only that plan's fate; a file whose plans are named is not named again
    named = {os.path.realpath(p.file) for p in plans if not result.clean(p)}
    failed_files = () if args.plan else [f for f in result.failed_files if os.path.realpath(f) not in named]
    skipped = [f"{f}: the file has errors" for f in failed_files]
    with progress("checking" if args.check else "compiling", total=len(plans)) as bar:  # a bar on a terminal only
        for plan in plans:
            bar.advance(0, plan.name)
            if not result.clean(plan) or plan.name in clashing:
                why = "has errors" if not result.clean(plan) else "has the name of another plan (E017)"
                skipped.append(f"{plan.file}: plan '{plan.name}' {why}")
            else:
                try:
                    if args.check:
                        stale += codegen.stale(plan, root)
                    else:
                        bar.log(f"wrote {codegen.write(plan, root, result.program.files)}/")  # above the bar
                        wrote += 1
                except codegen.Unsupported as e:
                    if args.check:
                        bar.log(f"note: {plan.name}: not compiled: {e}")
                    else:
                        refused.append(e.diagnostic(plan))
                        skipped.append(f"{plan.file}: plan '{plan.name}' is not supported yet (E100)")
                except codegen.CodegenError as e:
                    raise UsageError(str(e)) from None
            bar.advance(1)
    emit(refused, result.sources)
    for line in sorted(skipped):
        print(f"not compiled: {line}", file=sys.stderr)
    if not args.check:
        n_files = len(failed_files)
        rest = [f"{n} {what}{'s' * (n != 1)}" for n, what in ((len(skipped) - n_files, "plan"), (n_files, "file")) if n]
        print(f"dslc: wrote {wrote} plan{'s' * (wrote != 1)}" + ("; not compiled: " + ", ".join(rest)) * bool(rest), file=sys.stderr)
    if stale:
        for s in stale:
            print(f"stale: {s}", file=sys.stderr)
        print(f"dslc: generated code is out of date; run: {regenerate(args, root != codegen.DEFAULT_ROOT)}", file=sys.stderr)
    return 1 if skipped or stale else 0


def regenerate(args, output: bool) -> str:
    """The compile command that rewrites what ``--check`` found stale (``-o`` when ``output``)."""
    out = f" -o {shlex.quote(args.output)}" * output
    return "dslc compile " + " ".join(map(shlex.quote, args.paths)) + out + f" --plan {shlex.quote(args.plan)}" * bool(args.plan)
