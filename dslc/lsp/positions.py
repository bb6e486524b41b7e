"""Positions in a document, counted the two ways the server meets them.

dslc's spans count lines at ``\\n`` only (as the parser does) and columns in characters,
from 1, the end exclusive. The protocol counts from 0, ends a line at ``\\n``, ``\\r\\n``
or ``\\r``, and counts columns in the code units of the encoding agreed at
initialization: UTF-16 unless the client offered another (a character beyond U+FFFF, an
emoji in a comment, is two UTF-16 units). Both are turned into offsets in the text, so a
stray ``\\r`` or a wide character shifts nothing.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from lsprotocol import types as lsp

from ..source import Span

_BREAK = re.compile(r"\r\n|\r|\n")


def _units(s: str, encoding: str) -> int:
    """``s``'s length in code units of ``encoding`` (utf-16, utf-8 or utf-32)."""
    if encoding == "utf-8":
        return len(s.encode("utf-8", "surrogatepass"))
    if encoding == "utf-32" or s.isascii():
        return len(s)
    return len(s) + sum(ord(c) > 0xFFFF for c in s)


class Text:
    """A document's text, with its line starts counted both ways."""

    def __init__(self, text: str, encoding: str = "utf-16"):
        self.text = text
        self.encoding = encoding
        self._lf = [0] + [m.end() for m in re.finditer("\n", text)]  # dslc's lines
        self._lines = [0] + [m.end() for m in _BREAK.finditer(text)]  # the protocol's

    # -- dslc's spans --------------------------------------------------------------------

    def span_offset(self, line: int, col: int) -> int:
        """The offset of a span's 1-based line and column, clamped to the text."""
        line = min(max(line, 1), len(self._lf))
        start = self._lf[line - 1]
        end = self._lf[line] - 1 if line < len(self._lf) else len(self.text)
        return min(start + max(col, 1) - 1, end)

    def range(self, span: Span) -> lsp.Range:
        start = self.span_offset(span.line, span.col)
        end = max(start, self.span_offset(span.end_line, span.end_col))
        return lsp.Range(self.position(start), self.position(end))

    # -- the protocol's positions --------------------------------------------------------

    def position(self, offset: int) -> lsp.Position:
        offset = min(max(offset, 0), len(self.text))
        line = bisect_right(self._lines, offset) - 1
        if offset > 0 and self.text[offset - 1] == "\r" and offset < len(self.text) and self.text[offset] == "\n":
            offset -= 1  # inside a \r\n: at the line's end
            line = bisect_right(self._lines, offset) - 1
        start = self._lines[line]
        return lsp.Position(line, _units(self.text[start:offset], self.encoding))

    def offset(self, pos: lsp.Position) -> int:
        """The offset of a protocol position; a character past the line's end is its end."""
        if pos.line >= len(self._lines):
            return len(self.text)
        start = self._lines[pos.line]
        end = self._lines[pos.line + 1] if pos.line + 1 < len(self._lines) else len(self.text)
        line = self.text[start:end].rstrip("\r\n")
        if self.encoding == "utf-32" or (line.isascii() and self.encoding != "utf-8"):
            return start + min(pos.character, len(line))
        units = 0
        for i, c in enumerate(line):
            if units >= pos.character:
                return start + i
            units += _units(c, self.encoding)
        return start + len(line)

    def end(self) -> lsp.Position:
        return self.position(len(self.text))
