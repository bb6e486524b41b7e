"""Diagnostics rendered for a person (text with the source line and a caret) or a tool
(json, GitHub workflow commands, SARIF 2.1.0)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..diagnostics import Diagnostic, Severity, printable
from ..source import Sources

_COLOURS = {"error": "bold red", "warning": "bold yellow", "note": "bold cyan"}  # rich styles
_BOLD, _BLUE = "bold", "bold blue"


def render_text(diags: Sequence[Diagnostic], sources: Sources, colour: bool = False) -> str:
    """Render like a modern compiler: location, severity[code], message, the
    source line with a caret under the span, and ``help:``. ``colour``: in rich's styles,
    as ANSI escapes of the 16 standard colours (the text is otherwise the same)."""
    if colour:
        from rich.color import ColorSystem
        from rich.style import Style

    def c(style: str, s: str) -> str:
        return Style.parse(style).render(s, color_system=ColorSystem.STANDARD) if colour else s

    out: list[str] = []
    repeats: dict[tuple, list[Diagnostic]] = {}  # a note said again (another cluster's link): once, with where else
    for d in diags:
        if d.severity is Severity.NOTE:
            repeats.setdefault((d.code, d.message, d.hint), []).append(d)
    for d in diags:
        same = repeats.get((d.code, d.message, d.hint), [d]) if d.severity is Severity.NOTE else [d]
        if same[0] is not d:
            continue
        sev = d.severity.value
        head = f"{c(_COLOURS[sev], f'{sev}[{d.code}]')}: {c(_BOLD, d.message)}"
        if d.span is None:
            out.append(head)
        else:
            out.append(f"{c(_BOLD, printable(str(d.span)))}: {head}")
            src = sources.line(d.span.file, d.span.line)
            if src is not None:
                out += _quote(src, d, lambda s: c(_BLUE, s), lambda s: c(_COLOURS[sev], s))
        if d.hint:
            out.append(f"  {c(_BOLD, 'help')}: {d.hint}")
        if len(same) > 1:
            where = ", ".join(printable(str(o.span)) for o in same[1:4] if o.span) + ", …" * (len(same) > 4)
            out.append(f"  {c(_BOLD, 'note')}: said {len(same)} times; also at {where}")
    n_err = sum(d.is_error for d in diags)
    n_warn = sum(d.severity is Severity.WARNING for d in diags)
    if diags:
        out.append(f"{n_err} error{'s' * (n_err != 1)}, {n_warn} warning{'s' * (n_warn != 1)}")
    return "\n".join(out) + ("\n" if out else "")


QUOTE_WIDTH = 200  # the most characters of a source line a diagnostic quotes


def _quote(src: str, d: Diagnostic, blue, red) -> list[str]:
    """At most :data:`QUOTE_WIDTH` characters of the source line (escaped), around the
    span's start where the line is longer, and a caret under the span; the caret counts
    the escapes, so it stays under the span's characters. A line of many errors is
    quoted once per error: the window keeps each quote short (5,000 errors on one long
    line would otherwise print the line, or the caret's indent, 5,000 times)."""
    src = src.replace("\t", " ")
    s = d.span
    end = s.end_col if s.end_line == s.line and s.end_col > s.col else s.col + 1
    start = max(0, s.col - 1 - QUOTE_WIDTH // 2) if len(src) > QUOTE_WIDTH else 0
    stop, lead = start + QUOTE_WIDTH, "… " * bool(start)
    before = lead + printable(src[start : s.col - 1])
    under = printable(src[s.col - 1 : min(end - 1, stop)])
    shown = printable(src[start:stop])
    if len(shown) > QUOTE_WIDTH or stop < len(src):
        shown = shown[:QUOTE_WIDTH] + " …"
    gutter = f"{s.line:>4} | "
    caret = " " * len(before) + red("^" * max(1, len(under)))
    return [blue(gutter) + lead + shown, blue(" " * (len(gutter) - 2) + "| ") + caret]


def to_dict(d: Diagnostic) -> dict:
    """A diagnostic for tools. The message and hint are escaped as for a terminal (a
    tool may print them raw, `jq -r`: :class:`Diagnostic` escapes them); the file stays
    the name a tool can open."""
    out: dict = {"code": d.code, "severity": d.severity.value, "message": d.message}
    if d.span:
        out |= {
            "file": d.span.file,
            "line": d.span.line,
            "col": d.span.col,
            "end_line": d.span.end_line,
            "end_col": d.span.end_col,
        }
    if d.hint:
        out["hint"] = d.hint
    return out


def render_json(diags: Sequence[Diagnostic], sources: Sources | None = None) -> str:
    return json.dumps([to_dict(d) for d in diags], indent=2) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


def render_github(diags: Sequence[Diagnostic], sources: Sources | None = None) -> str:
    """GitHub Actions workflow commands: ``::error file=…,line=…::message``; the log
    shows ANSI escapes, so everything is :func:`printable` before it is escaped."""
    lines = []
    for d in diags:
        kind = {"error": "error", "warning": "warning", "note": "notice"}[d.severity.value]
        props = [f"title={_gh_escape(d.code, True)}"]
        if d.span:
            props = [
                f"file={_gh_escape(printable(d.span.file), True)}",
                f"line={d.span.line}",
                f"col={d.span.col}",
                f"endLine={d.span.end_line}",
                f"endColumn={d.span.end_col}",
            ] + props
        msg = d.message + (f" (help: {d.hint})" if d.hint else "")
        lines.append(f"::{kind} {','.join(props)}::{_gh_escape(msg)}")
    return "\n".join(lines) + ("\n" if lines else "")


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render_sarif(diags: Sequence[Diagnostic], sources: Sources | None = None) -> str:
    """SARIF 2.1.0 with one rule per diagnostic code, as GitHub code scanning
    expects (tool.driver.rules, ruleId, level, physicalLocation.region)."""
    from .. import __version__
    from ..codes import CODES

    used = sorted({d.code for d in diags})
    rules = [
        {
            "id": code,
            "name": CODES.get(code, code).replace(" ", "-"),
            "shortDescription": {"text": CODES.get(code, code)},
        }
        for code in used
    ]
    results = []
    for d in diags:
        r: dict = {
            "ruleId": d.code,
            "ruleIndex": used.index(d.code),
            "level": d.severity.value,
            "message": {"text": d.message + (f"\nhelp: {d.hint}" if d.hint else "")},
        }
        if d.span:
            uri = Path(d.span.file).as_posix()
            if os.path.isabs(uri):
                try:
                    uri = Path(uri).relative_to(Path.cwd()).as_posix()
                except ValueError:
                    uri = Path(uri).as_uri()
            r["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri},
                        "region": {
                            "startLine": d.span.line,
                            "startColumn": d.span.col,
                            "endLine": d.span.end_line,
                            "endColumn": max(d.span.end_col, d.span.col + 1)
                            if d.span.end_line == d.span.line
                            else d.span.end_col,
                        },
                    }
                }
            ]
        results.append(r)
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "dslc",
                        "version": __version__,
                        "informationUri": "https://github.com/dslc/dslc",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


RENDERERS = {"json": render_json, "github": render_github, "sarif": render_sarif}
