"""How values of a plan become text of the generated files: identifiers are checked,
numbers are written as a person writes them (``989e12``, ``1e-5``, ``0.95``) and
evaluate to exactly the same value, and text bound for a comment cannot end it."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import Unsupported

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENT.match(value):
        raise Unsupported(f"{what} {value!r} is not an identifier (letters, digits, _)")
    return value


def number(value: float, what: str) -> str:
    """A finite int or float as a Python literal (see :func:`float_literal`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"{what} = {value!r} is not a number")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise Unsupported(f"{what} = {value!r} is not finite")
    return float_literal(value)


def float_literal(x: float) -> str:
    """``repr`` between 0.01 and 10⁴ (``0.95``, ``1.0``); outside it the shortest
    scientific form: an integer mantissa below 1000 with an exponent that is a multiple
    of three (``989e12``, ``3e-3``), else one digit before the point (``1e-5``,
    ``1.5e-4``). Evaluates to exactly ``x``."""
    text = repr(x)
    if "e" not in text and (x == 0 or 1e-2 <= abs(x) < 1e4):
        return text
    sign, digits, exponent = Decimal(text).normalize().as_tuple()
    mantissa = "".join(map(str, digits))
    if exponent > 0 and exponent % 3 == 0 and len(mantissa) <= 3:
        sci = f"{mantissa}e{exponent}"
    else:
        point = f"{mantissa[0]}.{mantissa[1:]}" if len(mantissa) > 1 else mantissa
        sci = f"{point}e{exponent + len(mantissa) - 1}"
    sci = "-" * sign + sci
    if float(sci) != x or ("e" not in text and len(sci) >= len(text)):
        return text
    return sci


def comment_safe(text: str) -> str:
    """Text for a comment: printable ASCII as is, else escaped by ``ascii`` (a quoted
    literal), so no line break, control character or non-ASCII letter survives."""
    return text if text.isascii() and text.isprintable() else ascii(text)
