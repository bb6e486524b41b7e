"""Diagnostics: a code, a severity, a span, a message and a hint.

Errors are collected as values, never raised one at a time: every stage
returns ``list[Diagnostic]`` and the CLI renders them all at the end
(:mod:`dslc.report.diagnostics`). The codes are catalogued in :mod:`dslc.codes`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from .source import Span


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    span: Span | None
    message: str
    hint: str | None = None

    def __post_init__(self) -> None:  # escaped once here, so every renderer shows it safely
        object.__setattr__(self, "message", printable(self.message))
        if self.hint is not None:
            object.__setattr__(self, "hint", printable(self.hint))

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple:
        s = self.span
        return (s.file, s.line, s.col, self.code) if s else ("", 0, 0, self.code)


def error(code: str, span: Span | None, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code, Severity.ERROR, span, message, hint)


def warning(code: str, span: Span | None, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code, Severity.WARNING, span, message, hint)


def note(code: str, span: Span | None, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code, Severity.NOTE, span, message, hint)


def printable(s: str) -> str:
    """``s`` with every character a terminal or log viewer would act on written as an
    escape (``\\x1b``, ``\\r``, ``\\u202e``): C0 and C1 controls, bidirectional overrides
    and other format characters, line separators and lone surrogates. A plan's strings,
    names and file names reach messages, and a raw ESC or CR there could hide a
    diagnostic or fake a line of lint output."""
    return s if s.isprintable() else "".join(map(_escaped, s))


def _escaped(c: str) -> str:
    if c.isprintable() or unicodedata.category(c) == "Zs":  # spaces are harmless
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def has_errors(diags: Iterable[Diagnostic], strict: bool = False) -> bool:
    return any(d.is_error or (strict and d.severity is Severity.WARNING) for d in diags)
