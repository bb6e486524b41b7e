"""``dslc diff``'s pictures of :class:`dslc.report.diff.PlanDiff`: a table per plan for a
terminal (:func:`tables`), or Markdown for a pull request's comment (:func:`markdown`).

The Markdown begins with :data:`MARKER`, an HTML comment a CI step finds its own earlier
comment by, to update it rather than add one on each push. Anything a plan's author
chose (a file name, a diagnostic's message) goes into a code span, where Markdown, HTML
and @-mentions are not read; the rest is the report's own words, escaped.
"""

from __future__ import annotations

import re

from ..diagnostics import Diagnostic, printable
from .diff import MINUS, PlanDiff, Row, change, headline, value

MARKER = "<!-- dslc-diff -->"
SHOWN = ("layout", "cost", "links")  # the first table; "stages" and "time" are the details


def _shown(d: PlanDiff, sections: tuple[str, ...]) -> list[Row]:
    """The rows of ``sections``; of the layout only the settings that differ (all of them
    for a plan on one side only)."""
    one_side = d.base is None or d.new is None
    return [r for r in d.rows if r.section in sections and (r.section != "layout" or r.changed or one_side)]


def _where(x: Diagnostic) -> str:
    return f" ({x.span})" if x.span else ""


# ---------------------------------------------------------------------------- terminal


def tables(diffs: list[PlanDiff], base: str, new: str) -> list:
    """What the terminal shows: a title, then per plan its headline, a table of base, new
    and the change (green better, red worse) and the diagnostics that appear (+) and
    disappear (−). Rich renderables, for :func:`dslc.report.terminal.show`."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(f"dslc diff: {printable(base)} → {printable(new)}", style="bold")]
    if not diffs:
        out.append(Text("no plan changed"))
    for d in diffs:
        out.append(Text(""))
        out.append(Text(printable(headline(d)), style="bold"))
        rows = _shown(d, SHOWN + ("stages", "time")) if d.tabled else []
        if rows:
            t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
            for i, h in enumerate(("", "base", "new", "change")):
                t.add_column(h, justify="right" if i else "left", overflow="fold")
            section = rows[0].section
            for r in rows:
                if r.section != section:
                    t.add_section()
                    section = r.section
                style = {"better": "green", "worse": "red"}.get(r.verdict or "")
                t.add_row(r.label, _cell(r, 0), _cell(r, 1), Text(change(r), style=style or ""))
            out.append(t)
        for sign, group, style in (("+", d.appeared, "red"), (MINUS, d.disappeared, "green")):
            for x in group:
                out.append(Text(f"  {sign} {x.severity.value}[{x.code}]: {x.message}{printable(_where(x))}",
                                style=style if x.is_error else ""))
    return out


def _cell(r: Row, i: int) -> str:
    x = (r.base, r.new)[i]
    return value(r.unit, x) + (" (over)" if r.over[i] else "")


# ---------------------------------------------------------------------------- markdown


def code(s: str) -> str:
    """``s`` as a Markdown code span, safe in a table: control characters escaped, ``|``
    escaped as GitHub's tables need, fenced with more backticks than it holds."""
    s = printable(s).replace("|", "\\|")
    fence = "`" * (1 + max((len(m) for m in re.findall("`+", s)), default=0))
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def text(s: str) -> str:
    """The report's own words in Markdown: every character Markdown or HTML could read
    as markup written as a literal."""
    return re.sub(r"([\\`*_\[\]<>|~!#&@])", r"\\\1", printable(s))


def _table(rows: list[Row]) -> list[str]:
    out = ["| | base | new | change |", "|:--|--:|--:|--:|"]
    for r in rows:
        cells = [text(r.label), text(_cell(r, 0)), text(_cell(r, 1)), text(change(r))]
        if r.verdict == "worse":
            cells[3] = f"**{cells[3]}**"
        out.append("| " + " | ".join(cells) + " |")
    return out


def _diagnostics(d: PlanDiff) -> list[str]:
    out = []
    for verb, group in (("appear", d.appeared), ("disappear", d.disappeared)):
        if group:
            out += ["", f"Diagnostics that {verb}:", ""]
            out += [f"- **{x.severity.value} {x.code}** {code(x.message)}" + (f" at {code(str(x.span))}" if x.span else "")
                    for x in group]
    return out


def markdown(diffs: list[PlanDiff], base: str, new: str) -> str:
    """A pull request's comment: :data:`MARKER`, a title, and per plan its headline, a table
    of the settings that changed, memory and fit, the links and the time, the diagnostics
    that appear and disappear, and memory per stage with the time's parts folded away."""
    out = [MARKER, f"### dslc diff: {code(base)} → {code(new)}", ""]
    if not diffs:
        out.append("No plan changed.")
    for d in diffs:
        words = headline(d)
        title = d.title
        out.append(f"**{text(title) if d.name else code(title)}**{text(words[len(title):])}")
        main, details = (_shown(d, SHOWN), _shown(d, ("stages", "time"))) if d.tabled else ([], [])
        if main:
            out += [""] + _table(main)
        out += _diagnostics(d)
        if details:
            out += ["", "<details><summary>Memory per stage, and the step's parts</summary>", ""] + _table(details) + ["", "</details>"]
        out.append("")
    out.append(f"<sub>{text('dslc diff: the estimates of dslc explain for each side; a change is new minus base.')}</sub>")
    return "\n".join(out) + "\n"
