"""The syntax tree: frozen dataclasses built by parse.py, each with its span.

The tree mirrors the generic grammar (blocks of assignments, axes and nested
blocks); what each block means is decided in lower.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..source import Span


@dataclass(frozen=True)
class Number:
    value: int | float
    text: str
    span: Span


@dataclass(frozen=True)
class Quantity:
    value: int | float
    unit: str
    span: Span


@dataclass(frozen=True)
class String:
    value: str
    span: Span


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Value, ...]  # positional
    span: Span
    keywords: tuple[Assign, ...] = ()  # `dtype = uint32`


@dataclass(frozen=True)
class Tuple:
    items: tuple[Value, ...]
    span: Span


@dataclass(frozen=True)
class List:
    items: tuple[Value, ...]
    span: Span


@dataclass(frozen=True)
class Every:
    """A name applied to every N-th layer: ``full every 2`` (``count`` is the value after
    ``every``, checked where the key is read)."""

    name: str
    name_span: Span
    count: Value
    span: Span


Value = Number | Quantity | String | Bool | Ident | Call | Tuple | List | Every


@dataclass(frozen=True)
class Assign:
    key: str
    key_span: Span
    value: Value
    span: Span


@dataclass(frozen=True)
class Axis:
    """A mesh axis: ``tp = 4 on nvlink``."""

    name: str
    name_span: Span
    size: Value
    link: str
    link_span: Span
    span: Span


@dataclass(frozen=True)
class Block:
    kind: str  # the first word: cluster, model, plan, mesh, link, …
    kind_span: Span
    name: str | None  # the optional second word
    name_span: Span | None
    body: tuple[Stmt, ...]
    span: Span


Stmt = Assign | Axis | Block


@dataclass(frozen=True)
class Import:
    path: str
    span: Span


@dataclass(frozen=True)
class File:
    path: str
    items: tuple[Import | Block, ...]
