"""``dslc compile``: the generated package of every clean plan, each folder written whole or
not at all, or with ``--check`` the files that are out of date."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..diagnostics import has_errors
from ..driver import output_clashes
from ..front import ast
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
    # --plan: only that plan's fate. A file with errors is named by its plans that lowered to
    # none (an error left a part unknown: plans holds them not) or, holding none, itself.
    failed_files, skipped = [], []
    for f in () if args.plan else result.failed_files:
        lowered = {p.name for p in plans if os.path.realpath(p.file) == os.path.realpath(f)}
        unlowered = [n for n in _plan_names(result.asts.get(f)) if n not in lowered]
        skipped += [f"{f}: plan '{n}' has errors" for n in unlowered]
        failed_files += [f] * (not unlowered and not lowered)
    skipped += [f"{f}: the file has errors" for f in failed_files]
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


def _plan_names(tree) -> list[str]:
    """The names of the plans a file's syntax tree defines (None: it does not parse)."""
    return [b.name for b in tree.items if isinstance(b, ast.Block) and b.kind == "plan" and b.name] if tree else []


def regenerate(args, output: bool) -> str:
    """The compile command that rewrites what ``--check`` found stale (``-o`` when ``output``)."""
    out = f" -o {shlex.quote(args.output)}" * output
    return "dslc compile " + " ".join(map(shlex.quote, args.paths)) + out + f" --plan {shlex.quote(args.plan)}" * bool(args.plan)
