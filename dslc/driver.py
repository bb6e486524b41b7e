"""The pipeline, top to bottom: the one place that runs the stages in order.

::

    read (front.load) ─▶ lower (front.lower) ─▶ check ─▶ fit (search: E090 and its hint)
                                                      └▶ estimate (cost) ─▶ report | codegen

Each stage is a module or package that never calls a later one; this driver hands
the output of one to the next. ``dslc lint`` stops after :func:`lint`; ``explain`` and
``compile`` take the plans it returns when there are no errors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import check, fit, ir
from .diagnostics import Diagnostic, error
from .front import ast, edit
from .front.fmt import FormatError, format_text
from .front.load import Files, Loader
from .front.lower import lower_unit
from .source import Sources


@dataclass
class LoadResult:
    program: ir.Program
    diagnostics: list[Diagnostic]
    sources: Sources
    failed_files: tuple[str, ...] = ()  # roots whose text or definitions (or imports') have errors
    failed_plans: tuple[ir.Plan, ...] = ()  # plans with errors of their own or of their file
    library: int = 0  # clusters and models of files without plans, checked on their own
    roots: tuple[str, ...] = ()  # the files asked for, not their imports
    own_diagnostics: tuple[tuple[Diagnostic, ...], ...] = ()  # each plan's (of plans, in order): lint's of it
    asts: dict[str, ast.File | None] = field(default_factory=dict)  # every file read, by its path in spans

    @property
    def own_plans(self) -> tuple[ir.Plan, ...]:
        """The plans defined in the files asked for (compile and explain write and explain
        these; an imported plan is its own file's)."""
        roots = {os.path.realpath(r) for r in self.roots}
        return tuple(p for p in self.distinct_plans if os.path.realpath(p.file) in roots or p.file in self.roots)

    @property
    def distinct_plans(self) -> tuple[ir.Plan, ...]:
        """Each plan once, however many of the files asked for read its file (one given and
        also imported by another is read in both units)."""
        first: dict[tuple[str, str], ir.Plan] = {}
        for p in self.plans:
            first.setdefault((os.path.realpath(p.file), p.name), p)
        return tuple(first.values())

    @property
    def plans(self) -> tuple[ir.Plan, ...]:
        return self.program.plans

    def diagnostics_of(self, plan: ir.Plan) -> tuple[Diagnostic, ...]:
        """The diagnostics of ``plan`` itself (its rules and its fit, :func:`lint`), not of its file."""
        return next((d for p, d in zip(self.plans, self.own_diagnostics) if p is plan), ())

    def clean(self, plan: ir.Plan) -> bool:
        """Whether ``plan`` and the files it comes from have no error: it can be compiled."""
        return not any(plan is p for p in self.failed_plans)


def load_paths(paths: list[Path | str], check: bool = True, files: Files | None = None) -> LoadResult:
    """Read, lower and (with ``check``) lint files, each with its imports (from ``files``:
    this machine's by default, a commit's for ``dslc diff --git``). ``OSError`` from a root
    path propagates: the CLI turns it into a one-line I/O error."""
    loader = Loader(Sources(), [], files)
    roots = []
    for p in paths:
        path = os.path.normpath(str(p))
        loader.read(path)
        roots.append(path)
    return _lower(loader, roots, check)


def load_text(text: str | bytes, filename: str = "<stdin>", check: bool = True) -> LoadResult:
    """:func:`load_paths` of one file's text (standard input, tests)."""
    loader = Loader(Sources(), [])
    loader.read(filename, text.encode("utf-8") if isinstance(text, str) else text)
    return _lower(loader, [filename], check)


def lint(plan: ir.Plan) -> list[Diagnostic]:
    """Every diagnostic of a lowered plan: the rules of :mod:`dslc.check`, then, for a
    plan whose shapes are sound, whether it fits in memory (E090, :mod:`dslc.fit`)."""
    return fit.diagnostics(plan)


def _lower(loader: Loader, roots: list[str], run_checks: bool) -> LoadResult:
    plans: list[ir.Plan] = []
    failed_files: list[str] = []
    failed: list[ir.Plan] = []
    owns: list[tuple[Diagnostic, ...]] = []
    defined: set = set()  # the library definitions checked, once each (a shared import's)
    diags = loader.diags
    read = [d for d in diags if d.is_error]  # of every file as read, before any unit is walked
    for root in roots:
        start = len(diags)
        unit = loader.unit(root)  # adds the errors of its imports
        lowered, views, partial, library, d = lower_unit(unit, loader.asts)
        diags.extend(d)
        if run_checks:  # the rules that read no part an error left unknown; never compiled
            diags.extend(x for plan in partial for x in check.check_plan(plan))
        for definition, spans in library:
            diags.extend(check.check_definition(definition, spans))
            defined.add(definition.span)
        broken = any(x.is_error for x in diags[start:]) or any(x.span is None or x.span.file in unit.files for x in read)
        if broken:
            failed_files.append(root)
        for plan, view in zip(lowered, views):
            plans.append(plan)
            own = (lint(plan) if view is plan else check.check_plan(view)) if run_checks else []  # no fit on a guess
            owns.append(tuple(own))
            diags.extend(own)
            if broken or any(x.is_error for x in own):
                failed.append(plan)
    unique = list(dict.fromkeys(diags))  # a shared import's diagnostics once
    unique.sort(key=Diagnostic.sort_key)
    program = ir.Program(tuple(plans), tuple(loader.sources.texts))
    return LoadResult(program, unique, loader.sources, tuple(failed_files), tuple(failed), len(defined), tuple(roots), tuple(owns), loader.asts)


def output_clashes(plans: Sequence[ir.Plan]) -> list[Diagnostic]:
    """E017 for a plan name defined in two files compiled together: both would compile
    to ``<output>/<name>/``, each overwriting the other (and ``--check`` would find one
    stale forever). Lint allows it: the files may be compiled to different folders.
    Within one file and its imports the lowering reports it; a shared import's plan is
    the same definition, not two."""
    first: dict[str, ir.Plan] = {}
    out = []
    for plan in plans:
        seen = first.setdefault(plan.name, plan)
        if seen.span != plan.span:
            out.append(error("E017", plan.span, f"plan '{plan.name}' is also defined in {seen.file}", f"first defined at {seen.span}; both would compile to the folder {plan.name}/: rename one"))
    return out


def layout_file(plan: ir.Plan, layout: ir.Plan, out_path: str, name: str, changes=None, source: str | None = None) -> str:
    """The text of a plan file at ``out_path`` defining plan ``name`` with ``layout``
    (:func:`dslc.front.edit.layout_text`, which checks that it lowers to the layout), linted
    as ``dslc lint`` would: any error or warning is a bug of the writer (``WriteError``),
    but those of the data files' rule that the plan as written has too (a data file that
    is not on this machine is so for every layout). The text is in ``dslc fmt``'s layout
    when it can be (the writer's edits leave a mesh's ``on`` unaligned)."""
    text = edit.layout_text(plan, layout, out_path, name, changes, source)
    try:
        text = format_text(text, out_path)
    except FormatError:  # nested too deep to format: written as edited
        pass
    bad = [d for d in load_text(text, out_path).diagnostics if d.severity.value in ("error", "warning")]
    if bad:
        own = {d.code for d in check.check_plan(plan)} - {d.code for d in check.check_plan(plan, files=False)}
        bad = [d for d in bad if d.code not in own]
    if bad:
        raise edit.WriteError(edit.problems(f"the plan written for {out_path}", bad, []))
    return text
