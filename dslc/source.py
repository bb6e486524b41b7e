"""Where things come from in a plan's text: spans and the source files read.

Every stage keeps spans so a diagnostic found late (in the checks, the search) still
points at a line of the user's file.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Span:
    """A region of a source file: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    @classmethod
    def point(cls, file: str, line: int = 1, col: int = 1) -> Span:
        return cls(file, line, col, line, col + 1)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass
class Sources:
    """The text of every file read, so renderers can quote source lines.

    Only files in ``quoted`` are quoted: the files named on the command line. An
    imported file may be any file on the machine (plans come from pull requests and
    are linted in CI), so its text never reaches the log; its diagnostics still name
    its file, line and column."""

    texts: dict[str, str] = field(default_factory=dict)
    quoted: set[str] = field(default_factory=set)
    _lines: dict[str, tuple[str, list[str]]] = field(default_factory=dict, repr=False, compare=False)  # file: (its text, split)

    def line(self, file: str, line: int) -> str | None:
        """Line ``line`` of ``file`` as the parser counts lines (at '\\n' only, so a
        stray CR or form feed never shifts the quote), or None when not to quote."""
        text = self.texts.get(file)
        if text is None or file not in self.quoted:
            return None
        if self._lines.get(file, (None,))[0] is not text:  # split once a text: a file may have 10^5 diagnostics
            self._lines[file] = (text, text.split("\n"))
        lines = self._lines[file][1]
        return lines[line - 1].removesuffix("\r") if 0 < line <= len(lines) else ""
