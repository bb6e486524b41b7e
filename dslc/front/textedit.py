"""Editing a plan file's text at the spans of its syntax tree, so that everything not
edited (comments, spacing, key order) stays as the user wrote it; and writing strings
and comments that mean exactly what they say (:mod:`dslc.front.edit` uses both).

Offsets are counted as the parser counts lines and columns: lines end at '\\n' only,
columns are characters, 1-based, the end exclusive.
"""

from __future__ import annotations

import re

from ..source import Span
from . import ast

_COMMENT = ("//", "#")
# A tolerant scan of a plan's text: comments and strings as the grammar reads them (a '"'
# starts a string, '//' or '#' outside one a comment), words, newlines, spaces, and one
# character of anything else ('{', '=', ...). It never fails: an unfinished string is a
# string to the line's end (dslc fmt scans text that parses, dslc lsp text being typed).
TOKEN = re.compile(
    r"(?P<comment>(?://|\#)[^\n]*)"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*"?)'
    r"|(?P<word>[A-Za-z0-9_µ%]+)"
    r"|(?P<newline>\n)"
    r"|(?P<space>[ \t\r\f\v]+)"
    r"|(?P<other>.)",
    re.DOTALL,
)


def quote(s: str) -> str:
    """``s`` as a string literal that the grammar's STRING reads back as ``s``
    (:func:`dslc.front.parse._unquote`): backslashes and quotes escaped, and every character
    that is not printable (a newline, a tab, U+2028, a lone surrogate) written as an escape."""
    return '"' + "".join("\\\\" if ch == "\\" else '\\"' if ch == '"' else _printable(ch) for ch in s) + '"'


def _printable(ch: str) -> str:
    if ch.isprintable():
        return ch
    if ch in "\n\t\r":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch]
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


class Editor:
    """One file's text and the edits made to it; :meth:`render` applies those in a range."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.newline = "\r\n" if "\r\n" in text else "\n"
        self._edits: list[tuple[int, int, int, str]] = []

    # -- positions -----------------------------------------------------------
    def pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col - 1

    def range(self, span: Span) -> tuple[int, int]:
        return self.pos(span.line, span.col), self.pos(span.end_line, span.end_col)

    def line_start(self, p: int) -> int:
        return self.text.rfind("\n", 0, p) + 1

    def line_end(self, p: int) -> int:
        """The position of the '\\n' that ends ``p``'s line (a '\\r' before it belongs to the line)."""
        i = self.text.find("\n", p)
        return len(self.text) if i < 0 else i

    def after_line(self, p: int) -> int:
        """The start of the line after ``p``'s (the end of the text on the last line)."""
        return min(self.line_end(p) + 1, len(self.text))

    def head_blank(self, p: int) -> bool:
        """Only spaces before ``p`` on its line."""
        return not self.text[self.line_start(p) : p].strip()

    def tail_free(self, p: int) -> bool:
        """Nothing but spaces, ';' and a comment after ``p`` on its line."""
        rest = self.text[p : self.line_end(p)].lstrip(" \t\r;")
        return not rest or rest.startswith(_COMMENT)

    def trailing_comment(self, p: int) -> str:
        """The comment after ``p`` on its line, when only spaces and ';' come before it."""
        rest = self.text[p : self.line_end(p)].lstrip(" \t;").rstrip("\r")
        return rest if rest.startswith(_COMMENT) else ""

    def indent(self, p: int) -> str:
        line = self.text[self.line_start(p) : self.line_end(p)]
        return line[: len(line) - len(line.lstrip(" \t"))]

    def brace(self, block: ast.Block) -> int:
        """The position of the block's '{' (after its kind and name; only spaces and
        comments can come between)."""
        p = self.range(block.name_span or block.kind_span)[1]
        while self.text[p] != "{":
            if self.text.startswith(_COMMENT, p):
                p = self.line_end(p)
            p += 1
        return p

    # -- edits ---------------------------------------------------------------
    def replace(self, start: int, end: int, new: str) -> None:
        self._edits.append((start, end, len(self._edits), new))

    def set(self, node, new: str) -> None:
        """Replace the text of a node (a value, a name)."""
        self.replace(*self.range(node if isinstance(node, Span) else node.span), new)

    def insert_after(self, stmt, text: str) -> None:
        """``text`` as the statement after ``stmt``, on its line: ``stmt; text``."""
        self.replace(self.range(stmt.span)[1], self.range(stmt.span)[1], "; " + text)

    def insert_before(self, stmt, text: str) -> None:
        """``text`` as the statement before ``stmt``, on its line: ``text; stmt``."""
        self.replace(self.range(stmt.span)[0], self.range(stmt.span)[0], text + "; ")

    def insert_line_after(self, stmt, text: str) -> None:
        """``text`` on a line of its own after ``stmt``'s (indented as it), or after it on
        its line when more statements follow there. ``text`` may span lines: each is indented."""
        s, e = self.range(stmt.span)
        if not self.tail_free(e):
            self.insert_after(stmt, text)
            return
        ind = self.indent(s)
        body = self.newline.join(ind + line if line else line for line in text.split("\n"))
        end = self.line_end(e)
        end -= self.text[end - 1 : end] == "\r"
        self.replace(end, end, self.newline + body)

    def insert_first(self, block: ast.Block, text: str) -> None:
        """``text`` as the block's first statement."""
        b = self.brace(block)
        if self.tail_free(b + 1) and self.line_end(b) < self.range(block.span)[1] - 1:
            first = block.body[0] if block.body else None
            ind = self.indent(self.range(first.span)[0]) if first is not None else self.indent(b) + "    "
            end = self.line_end(b)
            end -= self.text[end - 1 : end] == "\r"
            self.replace(end, end, self.newline + ind + text)
        else:
            self.replace(b + 1, b + 1, " " + text + (";" if block.body else ""))

    def delete(self, body: tuple, gone: list) -> None:
        """Delete the statements ``gone`` of a block whose statements are ``body``. Each run
        of them (no kept statement between) goes at once: the whole lines when it has them
        to itself (its trailing comments too), else with the ';' that joined it."""
        runs: list[list] = []
        joined = False  # the statement before was deleted too
        for st in body:
            if any(st is g for g in gone):
                runs[-1:] = [runs[-1] + [st]] if joined else [*runs[-1:], [st]]
                joined = True
            else:
                joined = False
        for run in runs:
            s, e = self.range(run[0].span)[0], self.range(run[-1].span)[1]
            if self.head_blank(s) and self.tail_free(e):
                self.replace(self.line_start(s), self.after_line(e), "")
                continue
            after = self.text[e : self.line_end(e)]
            before = self.text[self.line_start(s) : s]
            if m := re.match(r"[ \t]*;[ \t]*", after):
                self.replace(s, e + m.end(), "")
            elif m := re.search(r"[ \t]*;[ \t]*\Z", before):
                self.replace(s - (len(before) - m.start()), e, "")
            else:
                spaces = re.match(r"[ \t]*", after).end() if before.endswith((" ", "\t")) else 0
                self.replace(s, e + spaces, "")

    def render(self, start: int, end: int) -> str:
        """The text of ``[start, end)`` with the edits inside it made."""
        out, at = [], start
        for s, e, _, new in sorted(x for x in self._edits if start <= x[0] and x[1] <= end):
            if s < at:
                raise AssertionError(f"overlapping edits at offset {s}")
            out += [self.text[at:s], new]
            at = e
        out.append(self.text[at:end])
        return "".join(out)
