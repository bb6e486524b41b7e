"""``dslc diff``: what a change does to plans' cost, for a person (a table per plan), a
pull request (``--format markdown``) or a tool (``--format json``).

``dslc diff BASE NEW`` compares two plan files; ``dslc diff --git REV [PATH...]`` every
plan file that changed since REV, or that imports a file that did
(:meth:`dslc.cli.git.Repo.touched`), with itself as of REV: its text and its imports'
read from the commit, its data files from this machine (they are not versioned with
it). Each side is read and linted as ``dslc lint`` does and costed as ``dslc explain
--json`` does (:func:`dslc.report.explain.to_json`); :mod:`dslc.report.diff` compares.

Exit codes: 0 when no error appears on the new side, 1 when one does (an error of a code
the plan's base side did not have: a rule broken, a plan that stops fitting: E090, a new
plan with errors), 2 for usage and I/O errors.
"""

from __future__ import annotations

import json
import os
import sys

from ..codes import FIT_CODES
from ..diagnostics import printable
from ..driver import LoadResult, load_paths
from ..report import diff as report
from ..report import explain
from ..report.diff_show import markdown, tables
from ..report.terminal import progress, show
from .git import Repo, commit
from .inputs import UsageError, load

EXIT = """exit codes:
  0  no error appears on the new side
  1  an error appears (of a code the plan's base did not have): a rule broken, a plan
     that stops fitting (E090), a new plan with errors
  2  usage or I/O errors (one line on stderr)"""


def run(args) -> int:
    """The diff of the files asked for, printed in ``args.format``; the exit code above."""
    if args.git is not None:
        base_label, new_label, files = _git(args.git, args.paths)
    else:
        files = _two(args.paths)
        base_label, new_label = (_label(p) for p in args.paths)
    diffs: list[report.PlanDiff] = []
    with progress("costing both sides", total=len(files)) as bar:
        for base, new in files:
            bar.advance(0, new.file if new else base.file)
            diffs += report.compare(base() if base else report.FileSide(None), new() if new else report.FileSide(None))
            bar.advance(1)
    if args.plan is not None:
        diffs = [d for d in diffs if args.plan in {s.plan for s in (d.base, d.new) if s}]
        if not diffs:
            raise UsageError(f"no plan named {args.plan!r} on either side")
    if args.format == "json":
        print(json.dumps(report.to_json(diffs, base_label, new_label), indent=2, allow_nan=False))
    elif args.format == "markdown":
        sys.stdout.write(markdown(diffs, base_label, new_label))
    else:
        for part in tables(diffs, base_label, new_label):
            show(part)
    return 1 if any(d.errors_appear for d in diffs) else 0


class _Side:
    """A file of one side, read and costed when called (so the progress bar can say which)."""

    def __init__(self, path: str, files=None):
        self.file, self.files = path, files

    def __call__(self) -> report.FileSide:
        if self.files is None:
            result = load([self.file])
        else:
            try:
                result = load_paths([self.file], files=self.files)
            except OSError as e:
                raise UsageError(f"cannot read {printable(self.file)} at {self.files.sha[:12]}: {e.strerror}") from None
        return costed(result)


def _label(path: str) -> str:
    return "<stdin>" if path == "-" else path


def _two(paths: list[str]) -> list[tuple[_Side, _Side]]:
    if len(paths) != 2:
        raise UsageError(f"dslc diff takes two plan files, BASE and NEW (or --git REV [PATH...]); got {len(paths)}")
    if paths == ["-", "-"]:
        raise UsageError("only one side can be '-' (standard input)")
    for p in paths:
        if p != "-" and os.path.isdir(p):
            raise UsageError(f"{p} is a folder: dslc diff compares two plan files (--git REV compares folders as of a commit)")
    return [(_Side(paths[0]), _Side(paths[1]))]


def _git(rev: str, within: list[str]) -> tuple[str, str, list[tuple[_Side | None, _Side | None]]]:
    repo = Repo()
    sha = commit(repo.top, rev)
    tree = repo.at(sha)
    files = [(_Side(t.base, tree) if t.base else None, _Side(t.new) if t.new else None)
             for t in repo.touched(sha, within)]
    return (rev if sha.startswith(rev) else f"{rev} ({sha[:12]})"), "the working tree", files


def costed(result: LoadResult) -> report.FileSide:
    """A file's side: each of its plans with its diagnostics
    (its own and its file's) and, unless it has errors other than not fitting, its
    ``dslc explain --json``."""
    own = {d for p in result.plans for d in result.diagnostics_of(p)}
    shared = tuple(d for d in result.diagnostics if d not in own)
    plans = []
    for plan in result.own_plans:
        diags = tuple(result.diagnostics_of(plan)) + shared
        doc = None if any(d.is_error and d.code not in FIT_CODES for d in diags) else explain.to_json(explain.explain(plan))
        plans.append(report.Side(plan.file, plan.name, doc, diags))
    return report.FileSide(result.roots[0] if result.roots else None, tuple(plans), shared)
