"""Text → AST. The Lark parser is built once (LALR, strict) and cached; a
non-recursive Transformer turns its tree into frozen AST nodes, so no later
stage sees a Lark type and deep nesting never exhausts Python's stack.

Syntax errors become diagnostics that speak the language's words (a name, a
number, '{') rather than Lark's terminal names.
"""

from __future__ import annotations

import ast as pyast
import warnings
from functools import cache

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.visitors import Transformer_NonRecursive

from ..diagnostics import Diagnostic, error
from ..resources import resource_dir
from ..source import Span
from . import ast

MAX_BYTES = 4 * 1024 * 1024
# words, numbers, strings and symbols of one file (the largest example plan has 925): Lark
# parses some 50,000 a second, so no file within MAX_BYTES keeps a command for minutes
MAX_TOKENS = 2**16

# What each terminal is, in words a plan author knows.
_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "QUANTITY": "a number with a unit",
    "STRING": 'a string ("…")',
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "EQUAL": "'='",
    "SEMICOLON": "';'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "IMPORT": "'import'",
    "ON": "'on' and a link name",
    "EVERY": "'every' and a number",
    "TRUE": "true",
    "FALSE": "false",
    "$END": "the end of the file",
}


def _span(file: str, meta_or_tok) -> Span:
    m = meta_or_tok
    return Span(file, m.line, m.column, m.end_line, m.end_column)


def _number(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        return int(clean)
    except ValueError:
        return float(clean)


def split_quantity(text: str) -> tuple[str, str]:
    """A QUANTITY token's number and unit as written: ``"450GB/s"`` → ``("450", "GB/s")``."""
    i = len(text)
    while i > 0 and not (text[i - 1].isdigit() or text[i - 1] in "._"):
        i -= 1
    return text[:i].strip(), text[i:].strip()


def _unquote(tok: Token) -> str:
    """A string literal's value, with Python's escapes; an escape Python does not know
    (``"\\x4"``) is kept as written, and never raises inside the transformer (where any
    exception would be an internal error)."""
    if "\\" not in tok:
        return str(tok)[1:-1]
    try:
        with warnings.catch_warnings():  # "invalid escape sequence" on stderr
            warnings.simplefilter("ignore")
            return pyast.literal_eval(str(tok))
    except (ValueError, SyntaxError):
        return str(tok)[1:-1]


class _Build(Transformer_NonRecursive):
    """Lark parse-tree callbacks → frozen AST nodes (see ast.py)."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def sp(self, x) -> Span:
        return _span(self.file, x)

    # -- values -------------------------------------------------------------
    @v_args(inline=True)
    def number(self, tok: Token):
        return ast.Number(_number(tok), str(tok), self.sp(tok))

    @v_args(inline=True)
    def quantity(self, tok: Token):
        num, unit = split_quantity(str(tok))
        return ast.Quantity(_number(num), unit, self.sp(tok))

    @v_args(inline=True)
    def string(self, tok: Token):
        return ast.String(_unquote(tok), self.sp(tok))

    @v_args(meta=True)
    def true(self, meta, _):
        return ast.Bool(True, self.sp(meta))

    @v_args(meta=True)
    def false(self, meta, _):
        return ast.Bool(False, self.sp(meta))

    @v_args(inline=True)
    def ident(self, tok: Token):
        return ast.Ident(str(tok), self.sp(tok))

    @v_args(meta=True)
    def call(self, meta, children):
        name, *args = (a for a in children if a is not None)
        keywords = tuple(a for a in args if isinstance(a, ast.Assign))
        values = tuple(a for a in args if not isinstance(a, ast.Assign))
        return ast.Call(str(name), values, self.sp(meta), keywords)

    @v_args(meta=True)
    def every(self, meta, children):
        name, _, count = children
        return ast.Every(str(name), self.sp(name), count, self.sp(meta))

    @v_args(meta=True)
    def tuple(self, meta, children):
        return ast.Tuple(tuple(children), self.sp(meta))

    @v_args(meta=True)
    def list(self, meta, children):
        return ast.List(tuple(c for c in children if c is not None), self.sp(meta))

    # -- statements ---------------------------------------------------------
    @v_args(meta=True)
    def assign(self, meta, children):
        key, value = children
        return ast.Assign(str(key), self.sp(key), value, self.sp(meta))

    @v_args(meta=True)
    def axis(self, meta, children):
        name, size, link = children
        return ast.Axis(str(name), self.sp(name), size, str(link), self.sp(link), self.sp(meta))

    @v_args(meta=True)
    def block(self, meta, children):
        kind, name, *body = children
        return ast.Block(
            str(kind),
            self.sp(kind),
            str(name) if name is not None else None,
            self.sp(name) if name is not None else None,
            tuple(body),
            self.sp(meta),
        )

    @v_args(meta=True)
    def import_stmt(self, meta, children):
        (tok,) = children
        return ast.Import(_unquote(tok), self.sp(meta))


@cache
def _grammar_text() -> str:
    return (resource_dir("grammar") / "plan.lark").read_text(encoding="utf-8")


@cache
def parser() -> Lark:
    """The LALR parser, built once per process (LALR parsing is iterative, and
    so is the transformer that builds the AST: deep nesting never recurses)."""
    return Lark(
        _grammar_text(),
        parser="lalr",
        strict=True,
        propagate_positions=True,
        maybe_placeholders=True,
    )


@cache
def lexer() -> Lark:
    """The grammar's terminals alone (a basic lexer, no parser), built once: ``lexer().lex``
    scans a text that does not parse (Lark's ``lex`` of the LALR parser builds a lexer, with
    its terminals' collision checks, at every call)."""
    return Lark(_grammar_text(), parser=None, lexer="basic")


def size_text(size: int) -> str:
    """A file's size for E008: readers read at most ``MAX_BYTES + 1`` bytes, so a size of
    exactly that is "more than 4 MiB"."""
    return f"{size / 2**20:.1f} MiB" if size != MAX_BYTES + 1 else f"more than {MAX_BYTES // 2**20} MiB"


def too_large(size: int, file: str) -> Diagnostic:
    return error("E008", Span.point(file), "file " + too_large_text(size), "is this really a plan file?")


def too_large_text(size: int | None) -> str:
    """What E008 says of a file of ``size`` bytes (None: one within MAX_BYTES, but past
    MAX_TOKENS)."""
    if size is None:
        return f"has more than {MAX_TOKENS:,} tokens (words, numbers, strings and symbols); a plan file may have at most {MAX_TOKENS:,}"
    return f"is {size_text(size)}; a plan file may be at most {MAX_BYTES // 2**20} MiB"


def decode(data: bytes, file: str, size: int | None = None) -> tuple[str | None, list[Diagnostic]]:
    """Bytes → text, or a diagnostic for binary, non-UTF-8 or oversized input. ``size``: the
    file's size as its reader found it (:func:`dslc.reading.read_bytes` returns no byte
    of a file longer than ``MAX_BYTES``: its size says so)."""
    here = Span.point(file)
    if max(len(data), size or 0) > MAX_BYTES:
        return None, [too_large(max(len(data), size or 0), file)]
    if b"\0" in data:
        return None, [error("E004", here, "file is binary (contains NUL bytes), not a plan")]
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = e.start - (before.rfind(b"\n") + 1) + 1
        return None, [
            error(
                "E004",
                Span.point(file, line, col),
                f"file is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})",
                "plan files are UTF-8 text",
            )
        ]


def parse(text: str, file: str) -> tuple[ast.File | None, list[Diagnostic]]:
    """Parse one file's text. On a syntax error, or past MAX_TOKENS tokens, returns
    (None, [diagnostic])."""
    try:
        steps = parser().parse_interactive(text)
        for n, tok in enumerate(steps.iter_parse(), 1):
            if n > MAX_TOKENS:
                return None, [error("E008", _span(file, tok), "file " + too_large_text(None), "is this really a plan file?")]
        tree = _Build(file).transform(steps.feed_eof())
    except UnexpectedInput as e:
        return None, [_syntax_error(e, text, file)]
    items = tuple(c for c in tree.children if isinstance(c, (ast.Import, ast.Block)))
    return ast.File(file, items), []


# --------------------------------------------------------------------------
# syntax errors in plain words

# A catalogue of typical mistakes (lark's match_examples picks the closest).
_EXAMPLES = {
    "missing '=' between a key and its value": [
        "plan p { layers 32 }",
        'plan p { data "x" }',
        "plan p { train { steps 3 } }",
    ],
    "missing value after '='": [
        "plan p { layers = }",
        "plan p { layers = ; }",
        "plan p { train { steps = } }",
    ],
    "a block starts with a name and '{'": [
        "{ }",
        "= 3",
    ],
    "a value must be a number, a quantity, a string, a name, true or false": [
        "plan p { x = = }",
        "plan p { x = { } }",
    ],
}


def _describe_token(tok: Token) -> str:
    kind = tok.type
    if kind == "$END":
        return "the end of the file"
    if kind == "NAME":
        return f"name '{tok}'"
    if kind in ("NUMBER", "QUANTITY"):
        return f"number '{tok}'"
    if kind == "STRING":
        return f"string {tok}"
    return f"'{tok}'"


def _expected(names) -> str:
    words = sorted({_WORDS.get(n, n.lower()) for n in names})
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _open_blocks(text: str) -> list[tuple[str, int, int]]:
    """The blocks still open at the end of ``text``, innermost first: ``("train", line,
    col)``, ``("plan 'p'", …)`` (the kind and name written before the brace). Braces in
    strings and comments do not count; text the lexer cannot read ends the scan."""
    stack: list[tuple[str, int, int]] = []
    names: list[Token] = []
    try:
        for tok in lexer().lex(text):
            if tok.type == "LBRACE":
                words = [str(n) for n in names[-2:] if n.line == tok.line]
                what = " ".join(words[:1] + [f"'{w}'" for w in words[1:]]) or "a block"
                stack.append((what, tok.line, tok.column))
            elif tok.type == "RBRACE" and stack:
                stack.pop()
            names = names + [tok] if tok.type == "NAME" else []
    except UnexpectedInput:
        pass
    return stack[::-1]


def _syntax_error(e: UnexpectedInput, text: str, file: str) -> Diagnostic:
    line = getattr(e, "line", 1) or 1
    col = getattr(e, "column", 1) or 1
    if isinstance(e, UnexpectedEOF) or (
        isinstance(e, UnexpectedToken) and e.token.type == "$END"
    ):
        lines = text.removesuffix("\n").split("\n")  # lines as Lark counts them: at '\n'
        last = len(lines[-1].removesuffix("\r"))
        span = Span(file, len(lines), last + 1, len(lines), last + 2)
        opened = _open_blocks(text)
        if not opened:
            return error("E003", span, "unexpected end of file", "the last statement is incomplete")
        shown = ", ".join(f"{what} (opened at {line}:{col})" for what, line, col in opened[:3]) + ", …" * (len(opened) > 3)
        if len(opened) == 1:
            message = f"unexpected end of file: block {shown} is not closed"
        else:
            message = f"unexpected end of file: {len(opened)} blocks are not closed: {shown}"
        return error("E003", span, message, "add '}' where the block ends" if len(opened) == 1 else f"add {len(opened)} '}}', innermost first")
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else "?"
        shown = repr(ch)[1:-1] if not ch.isprintable() else ch
        return error(
            "E002",
            Span(file, line, col, line, col + 1),
            f"unexpected character '{shown}'",
            f"expected {_expected(e.allowed)}" if e.allowed else None,
        )
    assert isinstance(e, UnexpectedToken)
    tok = e.token
    width = max(1, len(str(tok))) if tok.end_line == tok.line else 1
    label = None
    try:
        label = e.match_examples(parser().parse, _EXAMPLES, use_accepts=True)
    except Exception:  # the catalogue is a nicety; never let it hide the error
        label = None
    message = f"unexpected {_describe_token(tok)}; expected {_expected(e.accepts or e.expected)}"
    return error("E001", Span(file, line, col, line, col + width), message, label)
