"""``dslc search``: the command line of the layout search (:mod:`dslc.search`), its
table or JSON (:mod:`dslc.report.search`), and the plan file of the fastest layout
(:func:`dslc.driver.layout_file`), written whole or not at all.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import search
from ..codes import FIT_CODES
from ..driver import layout_file
from ..front.defaults import BOUNDS
from ..front.edit import can_name_a_plan
from ..front.plan import microbatches_of
from ..report import search as report
from ..report.terminal import console, progress, show
from ..search import batch
from .inputs import UsageError, emit, load, pick, write_whole


def run(args) -> int:
    """The fastest layouts of the plan's model on its cluster (or ``--gpus``), a table or
    JSON on standard output; ``-o`` writes the fastest as a plan file."""
    if args.top < 1:
        raise UsageError("--top must be at least 1")
    most = BOUNDS["train.global_batch"][1]
    if args.global_batch is not None and not 1 <= args.global_batch <= most:
        raise UsageError(f"--global-batch must be from 1 to {most:,} sequences, not {args.global_batch}")
    fixed = frozenset(k.strip() for k in args.fix.split(",") if k.strip())
    if fixed - set(search.FIXABLE):
        raise UsageError(f"--fix takes {', '.join(search.FIXABLE)}; not {', '.join(sorted(fixed - set(search.FIXABLE)))}")
    result = load([args.plan_file])
    # the layout is what the search replaces: a plan that does not fit (E090-E092) or whose
    # mesh is not the size of the cluster (E030, or the --gpus asked for) is searched all the same
    errors = [d for d in result.diagnostics if d.is_error]
    emit([d for d in result.diagnostics if d.is_error or not args.quiet], result.sources)
    if any(d.code not in FIT_CODES + ("E030",) for d in errors):
        return 1
    plans = pick(result, args.plan)
    if len(plans) > 1:
        raise UsageError(f"{args.plan_file} holds {len(plans)} plans; pick one with --plan")
    plan = plans[0]
    sources = tuple(dict.fromkeys([plan.file, *result.sources.texts]))  # the plan's file, then every file it imports
    if args.output:  # before the search, not after it
        writable(args.output, sources)
    searched = plan if args.global_batch is None else with_batch(plan, args.global_batch)
    began = time.monotonic()
    try:
        with progress(f"searching the layouts of {plan.name}") as bar:
            found = search.search(searched, args.gpus, progress=bar, fixed=fixed)
    except search.SearchError as e:
        raise UsageError(str(e)) from None
    took = time.monotonic() - began
    if not found.ranked:
        print(f"dslc: {report.summary(found, took)}; no layout fits", file=sys.stderr)
        return 1
    advice = None
    if batch.limits(found):  # the batch holds the layouts back: a search at the batch that would not
        with progress(f"searching at the global batch that would not hold {plan.name}'s layouts back") as bar:
            advice = batch.advise(searched, found, args.gpus, fixed, progress=bar)
    shown = report.rows(found, args.top)
    if args.json:
        print(json.dumps(report.to_json(found, shown, took, advice), indent=2, allow_nan=False))
    else:
        show(report.table(found, shown, min(report.WIDTH, console().width)))
    print(f"dslc: {report.summary(found, took)}", file=sys.stderr)
    for line in report.batch_lines(found, advice, plan.train.global_batch):
        print(f"dslc: {line}", file=sys.stderr)
    if args.output:
        batch_changed = (f"global_batch {plan.train.global_batch}→{searched.train.global_batch}",) if searched is not plan else ()
        write_layout(plan, found.ranked[0], args.output, result.sources.texts.get(plan.file), sources, batch_changed)
    return 0


def with_batch(plan, n: int):
    """``plan`` at a global batch of ``n`` sequences, its micro-batches counted again (as
    lowering counts them when the plan does not write them)."""
    micro = microbatches_of(n, plan.train.micro_batch, plan.data_parallel_size)
    return replace(plan, train=replace(plan.train, global_batch=n), pipeline=replace(plan.pipeline, microbatches=micro))


def writable(path: str, sources: tuple[str, ...]) -> None:
    """A one-line error for an output that cannot be written, or that is one of ``sources``
    (the plan's own file and its imports: the written plan imports them), by name, link or
    hard link."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {path}: no folder {folder}")
    if os.path.isdir(path):
        raise UsageError(f"cannot write {path}: it is a folder")
    for i, source in enumerate(sources):
        if os.path.exists(path) and os.path.exists(source) and os.path.samefile(path, source):
            what = "the plan being searched" if i == 0 else f"a file the plan being searched imports ({source})"
            raise UsageError(f"-o {path} is {what}: write the layout to another file")


def write_layout(plan, best, path: str, source: str | None, sources: tuple[str, ...], more: tuple[str, ...] = ()) -> None:
    """The fastest layout as a plan file at ``path``, named after the file (or the plan's
    name with ``_searched``), written whole or not at all; never over ``sources``. ``more``:
    changes of the plan the search was given (its ``--global-batch``), before the layout's."""
    writable(path, sources)
    stem = Path(path).stem
    name = stem if can_name_a_plan(stem) and stem != plan.name else f"{plan.name}_searched"
    text = layout_file(plan, best.plan, path, name, more + best.changes, source)
    try:
        write_whole(path, text)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    print(f"wrote {path} (plan {name})", file=sys.stderr)
