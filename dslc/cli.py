"""Command line: ``dslc lint | fmt | compile | explain | diff | schedule | search | verify | lsp``.

Exit codes: 0 clean, 1 plan errors (warnings too with ``--strict``), 2 usage
or I/O errors (one line on stderr), 3 an internal error (a bug: please report
it; ``DSLC_DEBUG=1`` shows the traceback). ``dslc lsp`` serves an editor on stdin and
stdout until it says exit: 0 after a shutdown request, 1 without one (the protocol's rule).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__, cli_diff
from .cli_fmt import run as cmd_fmt
from .cli_inputs import UsageError, emit, load, load_plans, pick
from .cli_search import run as cmd_search
from .codes import FIT_CODES
from .diagnostics import Severity, has_errors, printable
from .driver import output_clashes
from .report.terminal import console, progress

# --------------------------------------------------------------------------
# commands


def cmd_lint(args) -> int:
    result = load(args.paths)
    diags = [d for d in result.diagnostics if not (args.quiet and d.severity is Severity.NOTE)]
    emit(diags, result.sources, args.format, sys.stdout)
    if args.format == "text" and not diags:
        n, files, defs = len(result.plans), len(result.program.files), result.library
        library = f", and {defs} cluster or model definition{'s' * (defs != 1)} no plan uses" if defs else ""
        print(f"ok: {n} plan{'s' * (n != 1)} in {files} file{'s' * (files != 1)}{library}", file=sys.stderr)
    return 1 if has_errors(diags, args.strict) else 0


def cmd_compile(args) -> int:
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
    from . import codegen

    root = Path(args.output) if args.output else codegen.DEFAULT_ROOT
    refused, stale, wrote = [], [], 0
    failed_files = () if args.plan else result.failed_files  # --plan: only that plan's fate
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


def cmd_explain(args) -> int:
    from .report import explain as report

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


def cmd_schedule(args) -> int:
    from .cost import deadlock, schedule
    from .report import draw

    loaded = load_plans([args.plan_file], args.plan, args.quiet)
    if loaded is None:
        return 1
    _, plans = loaded
    if len(plans) > 1:
        raise UsageError(f"{args.plan_file} holds {len(plans)} plans; pick one with --plan")
    plan = plans[0]
    pl = plan.pipeline
    from .cost.time import timing
    from .cost.topology import Topology

    with progress(f"scheduling {plan.name}", total=4) as bar:  # a large plan's millions of actions take a while
        bar.advance(0, "building the actions")
        actions = schedule.build(pl.schedule, plan.pp, pl.microbatches, pl.virtual_stages)
        bar.advance(1, "proving them deadlock-free")
        problems = deadlock.verify(actions, split_backward=pl.schedule in schedule.SPLIT_BACKWARD)
        if not problems:
            # the plan's own costs (dslc explain): forward, backward, weight-grad and p2p times, in ms
            bar.advance(1, "costing the stages")
            t, _ = timing(plan, Topology.of(plan), acts=actions)
            bar.advance(1, "simulating")
            sim = schedule.simulate(actions, *([c[i] * 1e3 for c in t.chunks] for i in range(3)), t.t_comm * 1e3)
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(draw.to_json(plan, actions, sim, t), indent=1, allow_nan=False))
        return 0
    print(f"{plan.name}: {pl.schedule}, forward {t.t_f * 1e3:.2f} ms, backward {t.t_b * 1e3:.2f} ms"
          + (f", weight-grad {t.t_w * 1e3:.2f} ms" if t.t_w else "")
          + f" per chunk per micro-batch, p2p {t.t_comm * 1e3:.3f} ms")
    print(draw.text_grid(actions, sim, time_unit="ms"))
    if args.output:
        try:
            draw.draw(actions, sim, args.output, schedule=f"{plan.name}: {pl.schedule}", time_unit="ms")
        except ValueError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror}") from None
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def cmd_verify(args) -> int:
    """Each plan (or the one named) shrunk, run in parallel and serially, and compared:
    0 all match, 1 a mismatch or plan errors, 2 a run that could not be made."""
    from . import codegen, verify
    from .verify.show import render_text

    if args.max_procs < 1 or args.steps < 1 or not args.timeout > 0:
        raise UsageError("--max-procs and --steps must be at least 1, --timeout more than 0")
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


def cmd_lsp(args) -> int:
    """The language server, on standard input and output, until the editor says exit."""
    from .lsp.server import serve

    serve()
    return 0


# --------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dslc", description="Compiler for parallel training plans.")
    ap.add_argument("--version", action="version", version=f"dslc {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("lint", help="check plans and report every problem")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories ('-' for stdin)")
    p.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text")
    p.add_argument("--strict", action="store_true", help="warnings fail the run too")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=cmd_lint)

    p = sub.add_parser("fmt", help="rewrite plan files in the one canonical layout (--check in CI)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories ('-': standard input to standard output)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the files that would change")
    p.add_argument("--diff", action="store_true", help="write nothing; print a unified diff of each change")
    p.add_argument("-q", "--quiet", action="store_true", help="say only what fails")
    p.set_defaults(fn=cmd_fmt)

    p = sub.add_parser("compile", help="generate the training program (train.py and its modules, launch.sh, sbatch.sh, trainjob.yaml) for each plan")
    p.add_argument("paths", nargs="+", metavar="PLAN")
    p.add_argument("-o", "--output", help="output root (default: generated/)")
    p.add_argument("--check", action="store_true", help="exit 1 if the generated files are out of date")
    p.add_argument("--plan", help="compile only the plan of this name")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=cmd_compile)

    p = sub.add_parser("explain", help="memory, traffic, FLOPs and step time of a plan")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories")
    p.add_argument("--plan", help="the plan of this name (default: all in the file)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("diff", help="what a change does to plans' cost: BASE and NEW side by side, or every plan changed since a git revision",
                       epilog=cli_diff.EXIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="BASE NEW: two plan files ('-' for one of them from stdin); with --git: where to look for plans (default: the whole repository)")
    p.add_argument("--git", metavar="REV", help="every plan file changed since the commit REV, or importing a file that changed, against itself as of REV")
    p.add_argument("--plan", help="only the plan of this name")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text", help="markdown: a pull request's comment; json: for tools")
    p.set_defaults(fn=cli_diff.run)

    p = sub.add_parser("schedule", help="compute, verify and draw the pipeline schedule")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name")
    p.add_argument("-o", "--output", help="write a picture (.png or .svg)")
    p.add_argument("--json", action="store_true", help="every rank's actions with simulated times")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=cmd_schedule)

    p = sub.add_parser("search", help="the fastest layouts of a plan's model on its cluster, by explain's step time")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name")
    p.add_argument("--gpus", type=int, metavar="N", help="search on N GPUs of the plan's cluster (whole nodes)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="layouts shown (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-o", "--output", metavar="FILE", help="write the fastest layout as a plan file")
    p.add_argument("--fix", metavar="KNOB,...", default="",
                   help="keep these as the plan writes them: mesh, schedule, micro_batch, zero, recompute, sp, cp")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx) and warnings of the plan as written")
    p.set_defaults(fn=cmd_search)

    p = sub.add_parser("verify", help="prove on CPU that the plan's parallel script computes what the serial model computes")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name (default: each in the file)")
    p.add_argument("--steps", type=int, default=3, help="training steps compared (default: 3)")
    p.add_argument("--max-procs", type=int, default=8, metavar="P", help="CPU processes at most; a larger mesh is shrunk (default: 8)")
    p.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds each run may take (default: 300)")
    p.add_argument("--keep", metavar="DIR", help="compile and run in DIR and keep it (the scripts, losses, weights, logs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("lsp", help="the language server for editors (diagnostics, hover, completion, definitions, formatting), on stdio")
    p.set_defaults(fn=cmd_lsp)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"dslc: error: {printable(str(e))}", file=sys.stderr)  # names may hold ESC, CR
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug in dslc, not in the plan
        if os.environ.get("DSLC_DEBUG"):
            raise
        print(f"dslc: internal error: {type(e).__name__}: {printable(str(e))} (set DSLC_DEBUG=1 for details)", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
