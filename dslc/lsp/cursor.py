"""What surrounds a place in a document, read from the text alone: the blocks it is in and
the statement before it. The text being typed rarely parses (``train { recompute = }``),
so this is a tolerant scan, not the parser: comments and strings are skipped as the
grammar skips them, braces open and close blocks, and a newline (outside brackets) or
``;`` ends a statement, as in the grammar."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..front.textedit import TOKEN

WORD = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Context:
    """The place before ``offset``: the blocks around it, outermost first, as (kind, name);
    the tokens of its statement so far (words, strings with their quotes, punctuation), the
    keys the innermost block sets in its other statements, the word it is in the middle of (what a completion replaces), and whether it is in a
    comment or a string (``string``: the string's text so far, without its quote);
    ``start``: where its statement begins."""

    blocks: list[tuple[str, str | None]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)  # set (``key = …``) elsewhere in the innermost block
    word: str = ""
    comment: bool = False
    string: str | None = None
    start: int = 0

    @property
    def block(self) -> str:
        """The kind of the innermost block; "" at the top level of a file."""
        return self.blocks[-1][0] if self.blocks else ""

    @property
    def plan(self) -> str | None:
        """The name of the plan block it is in."""
        return next((name for kind, name in self.blocks[:1] if kind == "plan"), None)

    def after(self, *words: str) -> bool:
        """Whether the statement so far is ``words`` (``"*"`` matches any one token)."""
        return len(self.tokens) == len(words) and all(w in ("*", t) for w, t in zip(words, self.tokens))


def context(text: str, offset: int) -> Context:
    ctx = Context()
    frames: list[set[str]] = [set()]  # the keys each open block sets, the file's first
    depth = 0  # ( and [ : a newline inside them does not end the statement
    last = None

    def ended(tokens: list[str]) -> list[str]:
        if len(tokens) > 1 and tokens[1] == "=" and WORD.fullmatch(tokens[0]):
            frames[-1].add(tokens[0])
        return []

    for m in TOKEN.finditer(text, 0, offset):
        kind, tok = m.lastgroup, m.group()
        last = (kind, m)
        if kind in ("space", "comment"):
            continue
        if kind == "newline":
            if depth == 0:
                ctx.tokens = ended(ctx.tokens)
        elif tok == "{":
            words = [t for t in ctx.tokens if WORD.fullmatch(t)]
            ctx.blocks.append((words[0] if words else "", words[1] if len(words) > 1 else None))
            frames.append(set())
            ctx.tokens, depth = [], 0
        elif tok == "}":
            ctx.tokens, depth = ended(ctx.tokens), 0  # the block's last statement, then the block
            if ctx.blocks:
                ctx.blocks.pop()
                frames.pop()
        elif tok == ";" and depth == 0:
            ctx.tokens = ended(ctx.tokens)
        else:
            if kind == "other":
                depth = max(0, depth + (tok in "([") - (tok in ")]"))
            if not ctx.tokens:
                ctx.start = m.start()
            ctx.tokens.append(tok)
    if not ctx.tokens:
        ctx.start = offset
    if last is not None and last[1].end() == offset:
        kind, m = last
        if kind == "comment":
            ctx.comment = True
        elif kind == "string" and not (len(m.group()) > 1 and m.group().endswith('"')):
            ctx.string = m.group()[1:]
            ctx.tokens.pop()
        elif kind == "word":
            ctx.word = ctx.tokens.pop()
    ctx.keys = frames[-1] | _keys_after(text, offset)
    return ctx


def _keys_after(text: str, offset: int) -> set[str]:
    """The keys set in the rest of the block ``offset`` is in, after the statement at
    ``offset`` (which is being typed)."""
    keys: set[str] = set()
    tokens: list[str] | None = None  # None: still in the statement at offset
    level = depth = 0
    for m in TOKEN.finditer(text, offset):
        kind, tok = m.lastgroup, m.group()
        if kind in ("space", "comment"):
            continue
        ends = (kind == "newline" and depth == 0) or (tok == ";" and depth == 0) or tok in "{}"
        if ends:
            if level == 0 and tokens and len(tokens) > 1 and tokens[1] == "=" and WORD.fullmatch(tokens[0]):
                keys.add(tokens[0])
            if tok == "{":
                level += 1
            elif tok == "}":
                if level == 0:
                    break
                level -= 1
            tokens, depth = [], 0
        elif tokens is not None:
            if kind == "other":
                depth = max(0, depth + (tok in "([") - (tok in ")]"))
            tokens.append(tok)
    return keys


def word_at(text: str, offset: int) -> tuple[int, int] | None:
    """The start and end of the name or number under ``offset`` (or just before it)."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    end = offset
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return (start, end) if end > start else None


def string_at(text: str, offset: int) -> tuple[int, int] | None:
    """The start and end (its quotes included) of the string literal under ``offset``."""
    line_end = text.find("\n", offset)
    for m in TOKEN.finditer(text, text.rfind("\n", 0, offset) + 1, len(text) if line_end < 0 else line_end):
        if m.start() > offset or m.lastgroup == "comment":
            return None
        if m.lastgroup == "string" and offset < m.end():
            return m.start(), m.end()
    return None


def following(text: str, end: int) -> str:
    """The first character after ``end`` that is not a space or tab ("" at the line's end)."""
    m = re.compile(r"[ \t]*([^ \t\r\n]?)").match(text, end)
    return m.group(1) if m else ""
