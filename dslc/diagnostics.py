"""Diagnostics: a code, a severity, a span, a message and a hint.

Errors are collected as values, never raised one at a time: every stage
returns ``list[Diagnostic]`` and the CLI renders them all at the end
(:mod:`dslc.report.diagnostics`). The codes are catalogued in :mod:`dslc.codes`.
"""

from __future__ import annotations

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


def has_errors(diags: Iterable[Diagnostic], strict: bool = False) -> bool:
    return any(d.is_error or (strict and d.severity is Severity.WARNING) for d in diags)
