"""Go to definition: an import's path to the file it names; a plan's ``cluster = NAME`` or
``model = NAME`` to that block, in the document or in a file it imports; a mesh axis's
link (``tp = 8 on nvlink``) to the link block of the plan's cluster."""

from __future__ import annotations

import os

from lsprotocol import types as lsp

from .analysis import Analysis, uri_of
from .cursor import context, string_at, word_at

_START = lsp.Range(lsp.Position(0, 0), lsp.Position(0, 0))


def definition(an: Analysis, offset: int) -> lsp.Location | None:
    text = an.text
    quoted = string_at(text.text, offset)
    if quoted is not None:
        imported = an.import_at(quoted[0])
        return lsp.Location(uri_of(imported[1]), _START) if imported and os.path.isfile(imported[1]) else None
    found = word_at(text.text, offset)
    if found is None:
        return None
    word, ctx = text.text[found[0]:found[1]], context(text.text, found[0])
    if ctx.comment:
        return None
    if ctx.block == "plan" and (ctx.after("cluster", "=") or ctx.after("model", "=")):
        d = an.defs.get((ctx.tokens[0], word))
        return an.location(d.block.name_span or d.block.span) if d else None
    if ctx.block == "mesh" and ctx.tokens[-1:] == ["on"]:
        block = next((b for b, _ in an.links(ctx.plan) if b.name == word), None)
        return an.location(block.name_span or block.span) if block else None
    return None
