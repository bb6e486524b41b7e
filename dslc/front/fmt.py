"""One canonical layout for plan files (``dslc fmt``).

The layout keeps what the author chose and decides the rest:

- kept: the order of everything, which statements share a line (joined by ``"; "``),
  which blocks are written on one line, one blank line where there were any, every
  comment, its text and whether it ends a line of code or stands on its own line;
- decided: four spaces a level, one space around ``=``, none before ``;`` or after
  ``{`` of a block written over several lines, ``{}`` for an empty block, a top-level
  import or block alone on its line, numbers as Black writes Python's (``1.5e9``, not
  ``1.5E+9``; ``0.5``, not ``.5``; underscores kept), a quantity as its number, one
  space and the unit (``450 GB/s``, ``2 us`` for ``2µs``), a call's keywords after its
  positional arguments;
- aligned, over lines that follow each other in one block: the ``on`` of mesh axes each
  on its line, the ``{`` of one-line blocks each on its line (and their statements as
  columns when they set the same keys: the links of a cluster), and comments that end
  lines of code; a line much wider than those around it is not aligned with them.

A comment written inside a statement (between the items of a list spread over lines)
cannot stay there once the statement is on one line: it goes on its own line just before.

:func:`format_text` is bounded: alignment pads a cell by at most :data:`ALIGN_SPREAD`
characters, and a text longer than a plan file may be (4 MiB), given or formatted, is E008,
left as it is. It is safe: it parses what it wrote and raises :class:`FormatError`,
writing nothing, unless that is the same syntax tree (spans aside; numbers by value,
units by meaning) with the same comments in the same order: the same tree lowers to the
same IR, so a formatted plan means what it meant.
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from ..diagnostics import Diagnostic, error
from ..units import UNITS
from . import ast
from .parse import MAX_BYTES, parse, split_quantity, too_large, too_large_text
from .textedit import TOKEN

INDENT = "    "
MAX_DEPTH = 100  # blocks and brackets nested: a deeper file is left as it is
# Alignment pads a cell (an axis's name or size, a one-line block's head or statement, the
# code before a comment) to the widest of its column, but only among lines whose cells are
# at most this many characters apart: a line much wider than its neighbours starts a
# column of its own (as rustfmt's struct_field_align_threshold, or gofmt's ratio, cut a
# run), so one long line cannot pad every line after it (a 4,000-character import before
# 5,000 commented ones made 134 KB 19 MiB). A line grows by at most this much a cell.
ALIGN_SPREAD = 32

# a unit with two spellings is written one way
_UNIT = {u: "us" for u, v in UNITS["time"].items() if v == 1e-6 and u != "us"}
_NUMBER = re.compile(r"([-+]?)([\d_]*)(?:\.([\d_]*))?(?:[eE]([-+]?)(\d+))?")


class FormatError(Exception):
    """The text is left as it is: a syntax error (:attr:`diagnostic`), nesting deeper than
    :data:`MAX_DEPTH`, or a layout the formatter could not keep (a bug: please report it)."""

    def __init__(self, message: str, diagnostic: Diagnostic | None = None):
        super().__init__(message)
        self.diagnostic = diagnostic


def format_text(text: str, file: str = "<stdin>") -> str:
    """``text`` (a plan file's) in the canonical layout; :class:`FormatError` when it cannot be."""
    _check_size(text, file)
    tree, diags = parse(text, file)
    if tree is None:
        raise FormatError(f"{diags[0].span}: {diags[0].message}", diags[0])
    marks = [m for m in TOKEN.finditer(text) if m.lastgroup in ("comment", "other")]
    _check_depth(marks, file)
    out = _Formatter(text, marks).file(tree)
    _check_size(out, file, formatted=True)
    again, _ = parse(out, file)
    if again is None or _shape(again.items) != _shape(tree.items):
        raise FormatError(f"{file}: the formatted text would not mean the same; left as it is (a bug of dslc fmt: please report it)")
    if _comments(out) != _comments(text):
        raise FormatError(f"{file}: the formatted text would lose or move a comment; left as it is (a bug of dslc fmt: please report it)")
    return out


def number_text(text: str) -> str:
    """A number as fmt writes it: ``+.5E+03`` → ``0.5e3``; the digits and underscores kept."""
    m = _NUMBER.fullmatch(text)
    if m is None:
        return text
    sign, whole, frac, esign, exp = m.groups()
    out = ("-" if sign == "-" else "") + (whole or "0")
    if frac is not None:
        out += "." + (frac or "0")
    if exp is not None:
        digits = exp.lstrip("0")
        out += "e" + ("-" if esign == "-" and digits else "") + (digits or "0")
    return out


# --------------------------------------------------------------------------
# the checks around formatting


def _check_size(text: str, file: str, formatted: bool = False) -> None:
    """E008, as lint says it, for a text longer than a plan file may be: the text given (an
    editor's), or the formatted one (spaces added to a file near the bound)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= MAX_BYTES:
        return
    d = too_large(size, file)
    if formatted:
        d = error("E008", d.span, "formatted, the file " + too_large_text(size), "it is left as it is")
    raise FormatError(f"{d.span}: {d.message}", d)


def _check_depth(marks, file: str) -> None:
    depth = deepest = 0
    for m in marks:
        if m.group() in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif m.group() in "})]":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise FormatError(f"{file}: blocks and brackets nest {deepest} deep; dslc fmt formats files up to {MAX_DEPTH} deep and leaves this one as it is")


def _comments(text: str) -> list[str]:
    return [m.group().rstrip() for m in TOKEN.finditer(text) if m.lastgroup == "comment"]


def _shape(node):
    """``node`` without its spans, numbers by type and value, units by their one spelling."""
    if isinstance(node, ast.Quantity):
        return ("Quantity", type(node.value).__name__, node.value, _UNIT.get(node.unit, node.unit))
    if isinstance(node, ast.Number):
        return ("Number", type(node.value).__name__, node.value)
    if isinstance(node, tuple):
        return tuple(_shape(n) for n in node)
    if dataclasses.is_dataclass(node):
        return (type(node).__name__,) + tuple(_shape(getattr(node, f.name)) for f in dataclasses.fields(node)
                                              if not f.name.endswith("span"))
    return node


# --------------------------------------------------------------------------
# the layout


@dataclass
class _Line:
    depth: int
    code: str  # "" with no comment: a blank line
    comment: str = ""
    axis: tuple[str, str, str] | None = None  # (name, size, link): a mesh axis alone on its line
    block: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None  # (head, statements, keys): a one-line block alone
    follows: bool = False  # a comment alone on its line that goes on the one that ends the line above

    def text(self) -> str:
        if not self.code:  # a comment on its own line, or a blank line
            return INDENT * self.depth + self.comment if self.comment else ""
        code = INDENT * self.depth + self.code
        return f"{code}  {self.comment}" if self.comment else code


@dataclass
class _Comment:
    pos: int
    line: int
    col: int
    text: str
    own_line: bool  # nothing but spaces before it on its line


class _Formatter:
    def __init__(self, text: str, marks):
        self.text = text
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.newline = "\r\n" if "\r\n" in text else "\n"
        self.braces = [m.start() for m in marks if m.group() == "{"]
        self.comments = []
        for m in marks:
            if m.lastgroup == "comment":
                line = self.line_of(m.start())
                col = m.start() - self.starts[line - 1] + 1
                self.comments.append(_Comment(m.start(), line, col, m.group().rstrip(), not text[self.starts[line - 1] : m.start()].strip()))
        self.comment_pos = [c.pos for c in self.comments]

    def pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col - 1

    def source(self, span) -> str:
        return self.text[self.pos(span.line, span.col) : self.pos(span.end_line, span.end_col)]

    def inside(self, lo: int, hi: int) -> list[_Comment]:
        return self.comments[bisect_left(self.comment_pos, lo) : bisect_left(self.comment_pos, hi)]

    def line_of(self, pos: int) -> int:
        return bisect_right(self.starts, pos)

    def span_pos(self, node) -> tuple[int, int]:
        return self.pos(node.span.line, node.span.col), self.pos(node.span.end_line, node.span.end_col)

    # -- the file and its blocks ---------------------------------------------
    def file(self, tree: ast.File) -> str:
        lines, _ = self.body(tree.items, 0, 0, len(self.text), 0)
        return "".join(line.text() + self.newline for line in lines)

    def body(self, stmts, depth: int, lo: int, hi: int, open_line: int) -> tuple[list[_Line], str]:
        """The lines of the statements (and comments) between ``lo`` and ``hi``, and the
        comment that ends the line of the ``{`` that opens them (``open_line``)."""
        spans = [self.span_pos(s) for s in stmts]  # in order, none inside another
        starts = [a for a, _ in spans]

        def free(c: _Comment) -> bool:  # not inside one of the statements
            i = bisect_right(starts, c.pos) - 1
            return i < 0 or c.pos >= spans[i][1]

        comments = [(c.pos, c) for c in self.inside(lo, hi) if free(c)]
        items = sorted([(a, s) for a, s in zip(starts, stmts)] + comments, key=lambda x: x[0])
        lines: list[_Line] = []
        group: list = []
        hoisted: list[_Comment] = []
        head_comment = ""
        last = open_line  # the line the last item ended on
        trail = 0  # the column of the comment that ends that line, when one does

        def flush():
            for c in hoisted:
                lines.append(_Line(depth, "", c.text))
            if group:
                lines.append(self.group_line(group, depth))
            group.clear()
            hoisted.clear()

        for _, item in items:
            start = item.line if isinstance(item, _Comment) else item.span.line
            if isinstance(item, _Comment) and not item.own_line and item.line == last:
                flush()
                if lines:
                    lines[-1].comment, trail = item.text, item.col
                else:
                    head_comment = item.text
                continue
            if isinstance(item, _Comment) and lines and trail == item.col and item.line == last + 1:
                lines.append(_Line(depth, "", item.text, follows=True))  # written under the comment above it
                last = item.line
                continue
            trail = 0
            multi = isinstance(item, ast.Block) and item.span.line != item.span.end_line
            joins = (isinstance(item, (ast.Assign, ast.Axis, ast.Block)) and not multi and group and depth > 0
                     and start == last)
            if not joins:
                flush()
                if lines and start - last >= 2:
                    lines.append(_Line(depth, ""))
            if isinstance(item, _Comment):
                lines.append(_Line(depth, "", item.text))
                last = item.line
                continue
            if multi:
                lines.extend(self.block_lines(item, depth))
            else:
                hoisted.extend(self.inside(*self.span_pos(item)))
                group.append(item)
            last = item.span.end_line
        flush()
        _align(lines)
        return lines, head_comment

    def block_lines(self, block: ast.Block, depth: int) -> list[_Line]:
        lo, hi = self.span_pos(block)
        brace = self.braces[bisect_left(self.braces, lo)]
        lines = [_Line(depth, "", c.text) for c in self.inside(lo, brace)]  # between its words and '{'
        body, comment = self.body(block.body, depth + 1, brace + 1, hi - 1, self.line_of(brace))
        if not body and not comment:
            return lines + [_Line(depth, self.head(block) + " {}")]
        return lines + [_Line(depth, self.head(block) + " {", comment), *body, _Line(depth, "}")]

    def group_line(self, group: list, depth: int) -> _Line:
        line = _Line(depth, "; ".join(self.stmt(s) for s in group))
        if len(group) == 1 and isinstance(group[0], ast.Axis):
            a = group[0]
            line.axis = (a.name, self.value(a.size), a.link)
        elif len(group) == 1 and isinstance(group[0], ast.Block) and group[0].body:
            b = group[0]
            keys = tuple(s.key if isinstance(s, ast.Assign) else "" for s in b.body)
            line.block = (self.head(b), tuple(self.stmt(s) for s in b.body), keys)
        return line

    # -- statements and values -------------------------------------------------
    @staticmethod
    def head(block: ast.Block) -> str:
        return block.kind if block.name is None else f"{block.kind} {block.name}"

    def stmt(self, s) -> str:
        if isinstance(s, ast.Import):
            src = self.source(s.span)
            return "import " + src[src.index('"'):]
        if isinstance(s, ast.Assign):
            return f"{s.key} = {self.value(s.value)}"
        if isinstance(s, ast.Axis):
            return f"{s.name} = {self.value(s.size)} on {s.link}"
        inner = "; ".join(self.stmt(x) for x in s.body)
        return f"{self.head(s)} {{ {inner} }}" if inner else f"{self.head(s)} {{}}"

    def value(self, v) -> str:
        if isinstance(v, ast.Number):
            return number_text(v.text)
        if isinstance(v, ast.Quantity):
            number, unit = split_quantity(self.source(v.span))
            return f"{number_text(number)} {_UNIT.get(unit, unit)}"
        if isinstance(v, ast.String):
            return self.source(v.span)
        if isinstance(v, ast.Bool):
            return "true" if v.value else "false"
        if isinstance(v, ast.Ident):
            return v.name
        if isinstance(v, ast.Call):
            args = [self.value(a) for a in v.args] + [f"{k.key} = {self.value(k.value)}" for k in v.keywords]
            return f"{v.name}({', '.join(args)})"
        if isinstance(v, ast.Tuple):
            return "(" + ", ".join(self.value(x) for x in v.items) + ")"
        if isinstance(v, ast.List):
            return "[" + ", ".join(self.value(x) for x in v.items) + "]"
        assert isinstance(v, ast.Every)
        return f"{v.name} every {self.value(v.count)}"


# --------------------------------------------------------------------------
# alignment over lines that follow each other


def _runs(lines: list[_Line], member) -> list[list[_Line]]:
    runs, run = [], []
    for line in lines + [_Line(0, "")]:
        if (line.code or line.follows) and member(line):
            run.append(line)
        else:
            if len(run) > 1:
                runs.append(run)
            run = []
    return runs


def _groups(run: list[_Line], cells) -> list[list[_Line]]:
    """``run`` cut, in order, into groups whose every column is at most :data:`ALIGN_SPREAD`
    characters wider in one line than in another: ``cells(line)`` the widths of a line's
    columns (None: a comment under the one that ends the line above, which goes with it)."""
    groups: list[list[_Line]] = [[]]
    lo = hi = None  # each column's narrowest and widest in the group
    for ln in run:
        widths = cells(ln)
        if widths is not None:
            lo2 = widths if lo is None else tuple(map(min, lo, widths))
            hi2 = widths if hi is None else tuple(map(max, hi, widths))
            if any(b - a > ALIGN_SPREAD for a, b in zip(lo2, hi2)):
                groups.append([])
                lo2 = hi2 = widths
            lo, hi = lo2, hi2
        groups[-1].append(ln)
    return groups


def _align(lines: list[_Line]) -> None:
    for run in _runs(lines, lambda ln: ln.axis is not None):
        for group in _groups(run, lambda ln: (len(ln.axis[0]), len(ln.axis[1]))):
            names = max(len(ln.axis[0]) for ln in group)
            sizes = max(len(ln.axis[1]) for ln in group)
            for ln in group:
                name, size, link = ln.axis
                ln.code = f"{name:<{names}} = {size:<{sizes}} on {link}"
    for run in _runs(lines, lambda ln: ln.block is not None):
        for group in _groups(run, lambda ln: (len(ln.block[0]), *(len(s) for s in ln.block[1][:-1]))):
            heads = max(len(ln.block[0]) for ln in group)
            same = len({ln.block[2] for ln in group}) == 1 and "" not in group[0].block[2]
            widths = [max(len(ln.block[1][i]) + 1 for ln in group) for i in range(len(group[0].block[1]) - 1)] if same else []
            for ln in group:
                head, stmts, _ = ln.block
                cells = [f"{s};".ljust(w) for s, w in zip(stmts, widths)] if same else [f"{s};" for s in stmts[:-1]]
                ln.code = f"{head:<{heads}} {{ {' '.join(cells + [stmts[-1]])} }}"
    for run in _runs(lines, lambda ln: bool(ln.comment)):
        for group in _groups(run, lambda ln: None if ln.follows else (len(ln.code),)):
            width = max(len(ln.code) for ln in group) or 1
            for ln in group:
                ln.code = ln.code.ljust(width)
