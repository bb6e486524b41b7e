"""A part of a plan that an error left unknown, and how the checks step around it.

Lowering reports every error of a file, and a plan with one is still checked: the rules
that do not read what the error spoiled run, the others wait for the fix. So a plan whose
mesh axis has no link (E036) still hears that its mesh has more ranks than the cluster has
GPUs (E030) and that its batch does not add up (E080), in the same run.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from dataclasses import fields, is_dataclass
from typing import TypeVar

T = TypeVar("T")


class UnknownValue(Exception):
    """Raised by any use of an :class:`Unknown`: the check that used it is skipped."""


class Unknown:
    """A part of a plan that an error of its lowering left unknown: the cluster of a plan
    whose ``cluster = c`` names none, a cluster's device that is misspelt, data whose source
    is not one. A *partial* plan holds one in place of each such part, so that lint can still
    run the checks that do not read it: any use of the value (an attribute, arithmetic, a
    comparison, its truth, its text) raises :class:`UnknownValue`, and ``check.check_plan``
    skips the rule that raised it rather than report on a guess. Partial plans go to the
    checks only, never to the cost model or the generator."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        object.__setattr__(self, "what", what)  # the dotted key it stands for: "cluster.device"

    def __repr__(self) -> str:
        return f"Unknown({self.what!r})"

    def __getattr__(self, name: str):
        raise UnknownValue(self.what)

    def _use(self, *args, **kwargs):
        raise UnknownValue(self.what)

    for _name in ("eq", "ne", "lt", "le", "gt", "ge", "hash", "bool", "len", "iter", "contains", "getitem", "call",
                  "index", "int", "float", "str", "format", "fspath", "neg", "pos", "abs", "invert", "round", "trunc",
                  "floor", "ceil", "reversed", *(f"{r}{op}" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv",
                  "mod", "divmod", "pow", "lshift", "rshift", "and", "xor", "or") for r in ("", "r"))):
        locals()[f"__{_name}__"] = _use
    del _name


def known(value: object) -> bool:
    """Whether ``value`` is not :class:`Unknown` (for the lowering, which builds partial
    plans and so reads their parts with care)."""
    return not isinstance(value, Unknown)


def unknowns(value: object, depth: int = 2) -> list[str]:
    """The keys of the :class:`Unknown` parts of ``value`` and of its parts, ``depth`` deep
    (a plan's: ``cluster``, ``cluster.device``, ``train.data``); none for a whole plan."""
    if isinstance(value, Unknown):
        return [value.what]
    if depth == 0 or not is_dataclass(value):
        return []
    return [k for f in fields(value) for k in unknowns(getattr(value, f.name), depth - 1)]


def until_unknown(found: Iterable[T]) -> list[T]:
    """What a rule yields (diagnostics) until it reads a value an error left unknown: found
    from known values only, so true; the rest of the rule waits for the fix, no guess."""
    out: list[T] = []
    try:
        out.extend(found)
    except UnknownValue:
        pass
    return out


def unless_unknown() -> suppress:
    """A part of a rule that reads a value the others do not (``with unless_unknown(): …``):
    skipped when that value is unknown, and the rule goes on, so an error holds back only
    the parts that read what it spoiled (:func:`until_unknown` stops a rule at the first)."""
    return suppress(UnknownValue)
