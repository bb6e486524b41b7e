"""Command line: ``dslc lint | fmt | compile | explain | diff | schedule | search | verify | doctor | lsp``.

Exit codes: 0 clean, 1 plan errors (warnings too with ``--strict``), 2 usage
or I/O errors (one line on stderr), 3 an internal error (a bug: please report
it; ``DSLC_DEBUG=1`` shows the traceback). ``dslc lsp`` serves an editor on stdin and
stdout until it says exit: 0 after a shutdown request, 1 without one (the protocol's rule).

This module holds the argument parser and :func:`main`; each command is the ``run`` of its
own module (``dslc lint`` is :mod:`dslc.cli.lint`'s), which reads its inputs through
:mod:`dslc.cli.inputs` and calls the driver; :mod:`dslc.cli.git` is ``dslc diff --git``'s
reader of a commit's files.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..diagnostics import printable
from . import compile, diff, doctor, explain, fmt, lint, lsp, schedule, search, verify
from .inputs import UsageError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dslc", description="Compiler for parallel training plans.")
    ap.add_argument("--version", action="version", version=f"dslc {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("lint", help="check plans and report every problem")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories ('-' for stdin)")
    p.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text")
    p.add_argument("--strict", action="store_true", help="warnings fail the run too")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=lint.run)

    p = sub.add_parser("fmt", help="rewrite plan files in the one canonical layout (--check in CI)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories ('-': standard input to standard output)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the files that would change")
    p.add_argument("--diff", action="store_true", help="write nothing; print a unified diff of each change")
    p.add_argument("-q", "--quiet", action="store_true", help="say only what fails")
    p.set_defaults(fn=fmt.run)

    p = sub.add_parser("compile", help="generate the training program (train.py and its modules, launch.sh, sbatch.sh, trainjob.yaml) for each plan")
    p.add_argument("paths", nargs="+", metavar="PLAN")
    p.add_argument("-o", "--output", help="output root (default: generated/)")
    p.add_argument("--check", action="store_true", help="exit 1 if the generated files are out of date")
    p.add_argument("--plan", help="compile only the plan of this name")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=compile.run)

    p = sub.add_parser("explain", help="memory, traffic, FLOPs and step time of a plan")
    p.add_argument("paths", nargs="+", metavar="PATH", help="plan files or directories")
    p.add_argument("--plan", help="the plan of this name (default: all in the file)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=explain.run)

    p = sub.add_parser("diff", help="what a change does to plans' cost: BASE and NEW side by side, or every plan changed since a git revision",
                       epilog=diff.EXIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="BASE NEW: two plan files ('-' for one of them from stdin); with --git: where to look for plans (default: the whole repository)")
    p.add_argument("--git", metavar="REV", help="every plan file changed since the commit REV, or importing a file that changed, against itself as of REV")
    p.add_argument("--plan", help="only the plan of this name")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text", help="markdown: a pull request's comment; json: for tools")
    p.set_defaults(fn=diff.run)

    p = sub.add_parser("schedule", help="compute, verify and draw the pipeline schedule")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name")
    p.add_argument("-o", "--output", help="write a picture (.png or .svg)")
    p.add_argument("--json", action="store_true", help="every rank's actions with simulated times")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=schedule.run)

    p = sub.add_parser("search", help="the fastest layouts of a plan's model on its cluster, by explain's step time")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name")
    p.add_argument("--gpus", type=int, metavar="N", help="search on N GPUs of the plan's cluster (whole nodes)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="layouts shown (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-o", "--output", metavar="FILE", help="write the fastest layout as a plan file")
    p.add_argument("--global-batch", type=int, metavar="N", help="search at N sequences a step instead of the plan's global_batch")
    p.add_argument("--fix", metavar="KNOB,...", default="",
                   help="keep these as the plan writes them: mesh, schedule, micro_batch, zero, recompute, sp, cp")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx) and warnings of the plan as written")
    p.set_defaults(fn=search.run)

    p = sub.add_parser("verify", help="prove on CPU that the plan's parallel script computes what the serial model computes")
    p.add_argument("plan_file", metavar="PLAN")
    p.add_argument("--plan", help="the plan of this name (default: each in the file)")
    p.add_argument("--steps", type=int, default=3, help="training steps compared (default: 3)")
    p.add_argument("--max-procs", type=int, default=8, metavar="P", help="CPU processes at most; a larger mesh is shrunk (default: 8)")
    p.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds each run may take (default: 300)")
    p.add_argument("--keep", metavar="DIR", help="compile and run in DIR and keep it (the scripts, losses, weights, logs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="leave out notes (N0xx)")
    p.set_defaults(fn=verify.run)

    p = sub.add_parser("doctor", help="why a generated script's job stopped: its ranks' state files (--run-dir) read with the plan")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the script's --run-dir (default runs/<plan>)")
    p.add_argument("plan_file", metavar="PLAN", nargs="?", help="the plan file (default: the one run.json names, if found)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=doctor.run)

    p = sub.add_parser("lsp", help="the language server for editors (diagnostics, hover, completion, definitions, formatting), on stdio")
    p.set_defaults(fn=lsp.run)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    if not (sys.argv[1:] if argv is None else argv):  # `dslc` alone: what it can do, not only that COMMAND is missing
        ap.print_help(sys.stderr)
        return 2
    args = ap.parse_args(argv)
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
