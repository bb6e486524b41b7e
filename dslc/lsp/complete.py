"""Completion, by where the cursor is (:func:`dslc.lsp.cursor.context`):

- at the start of a statement: the keys and blocks of the enclosing block
  (:data:`dslc.front.keys.KEYS`) but the keys it already sets, each documented as its
  hover is; the mesh's axes it does not place yet; at the
  top level ``import``, ``cluster``, ``model`` and ``plan``;
- after ``key =``: the values of a closed set (architectures, devices, schedules,
  precisions, recompute policies, … from the tuples lowering checks against), the names of
  the clusters and models the file and its imports define, ``true``/``false``; after a
  number, the units of the key's dimension;
- after ``on`` in a mesh: the links of the plan's cluster;
- after ``optimizer``, ``lr_schedule``, ``link`` or a plan's ``model``: their names;
- in an import's string: folders and ``.plan`` files.

The names come from the document's last text that parsed; one that never parsed (opened
with the statement half typed) is read without the statement being typed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from lsprotocol import types as lsp

from .. import arch, ir
from ..catalog import DEVICES, LINKS
from ..front.defaults import ROUTERS
from ..front.keys import BLOCKS, KEYS
from ..units import UNITS, si, size
from . import keydocs
from .analysis import Analysis
from .cursor import Context, context
from .positions import Text

_K = lsp.CompletionItemKind
_DATA = ("synthetic", 'text("$1")', 'tokens("$1")', "blend($1)")
VALUES: dict[tuple[str, str], Iterable[str]] = {
    ("cluster", "device"): DEVICES,
    ("link", "scope"): ir.LINK_SCOPES,
    ("model", "arch"): arch.ARCHS,
    ("model", "router"): ROUTERS,
    ("experts", "router"): ROUTERS,
    ("data_parallel", "zero"): ("0", "1", "2", "3"),
    ("pipeline", "schedule"): ir.SCHEDULES,
    ("context_parallel", "method"): ir.CP_METHODS,
    ("train", "precision"): ir.PRECISIONS,
    ("train", "recompute"): ir.RECOMPUTE + ("full every ${1:2}",),
    ("train", "loss_scale"): ir.LOSS_SCALES,
    ("train", "data"): _DATA,
    ("eval", "data"): _DATA,
    ("train", "init"): ('hf("$1")',),
}
# the second word of a block's head, by the block it is in and its kind
HEAD_NAMES: dict[tuple[str, str], Iterable[str]] = {
    ("train", "optimizer"): ir.OPTIMIZERS,
    ("train", "lr_schedule"): ir.LR_SCHEDULES,
    ("cluster", "link"): LINKS,
    ("plan", "model"): arch.ARCHS,
}


def complete(an: Analysis | None, text: Text, offset: int, snippets: bool = True, trigger: str | None = None) -> list[lsp.CompletionItem]:
    """``trigger``: the character typed that asked; a space asks only after a word that
    calls for a value or a name (``=``, ``on``, ``optimizer``), not in indentation."""
    ctx = context(text.text, offset)
    if ctx.comment or (trigger == " " and (not ctx.tokens or ctx.word)):
        return []
    if ctx.string is not None:
        base = os.path.dirname(an.path) if an else "."
        return _paths(base, ctx.string, text, offset) if ctx.after("import") else []
    if an is not None and an.tree is None:
        an = _without_statement(an, ctx.start, offset)
    rng = lsp.Range(text.position(offset - len(ctx.word)), text.position(offset))
    return [_edited(i, rng, snippets) for i in _items(an, ctx)]


def _without_statement(an: Analysis, start: int, offset: int) -> Analysis:
    """The analysis of ``an``'s text with the statement from ``start`` to the end of its line,
    ``;`` or ``}`` blanked (so ``mesh { tp = 2 on  }`` reads ``mesh {            }``); ``an``
    itself if that does not parse either."""
    text = an.text.text
    end = offset + re.match(r"[^;{}\n]*", text[offset:]).end()
    blanked = Analysis(an.uri, text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:], an.text.encoding)
    return blanked if blanked.tree is not None else an


def _items(an: Analysis | None, ctx: Context) -> list[lsp.CompletionItem]:
    block = ctx.block
    if not ctx.tokens:
        return _statement(an, ctx)
    if len(ctx.tokens) == 1 and (block, ctx.tokens[0]) in HEAD_NAMES:
        return [_item(n, _K.EnumMember) for n in HEAD_NAMES[(block, ctx.tokens[0])]]
    if ctx.after("*", "="):
        return _values(an, block, ctx.tokens[0])
    if ctx.after("*", "=", "*") and keydocs.dimension(block, ctx.tokens[0]):
        return [_item(u, _K.Unit) for u in UNITS[keydocs.dimension(block, ctx.tokens[0])]]
    if block == "mesh" and ctx.after("*", "=", "*"):
        return [_item("on", _K.Keyword)]
    if block == "mesh" and ctx.tokens[-1] == "on" and an is not None:
        return [_item(b.name, _K.EnumMember, _link_detail(b.name)) for b, _ in an.links(ctx.plan)]
    return []


def _statement(an: Analysis | None, ctx: Context) -> list[lsp.CompletionItem]:
    block = ctx.block
    if block == "":
        return [_item("import", _K.Keyword, insert='import "$1"'),
                *(_item(k, _K.Struct, keydocs.markdown("", k, head=True), insert=f"{k} ${{1:name}} {{\n\t$0\n}}") for k in BLOCKS[""])]
    if block == "mesh":
        links = [b.name for b, _ in an.links(ctx.plan)] if an else []
        choice = "${2|" + ",".join(links) + "|}" if links else "${2:link}"
        return [_item(a, _K.Field, keydocs.markdown("mesh", a), insert=f"{a} = ${{1:2}} on {choice}")
                for a in KEYS["mesh"] if a not in ctx.keys]
    out = [_item(k, _K.Property, keydocs.markdown(block, k), insert=f"{k} = ") for k in KEYS.get(block, ()) if k not in ctx.keys]
    for kind in BLOCKS.get(block, ()):
        names = HEAD_NAMES.get((block, kind))
        if kind == "link" or (names is None and kind in KEYS.get(block, ())):  # link ib { }, a plan's cluster NAME { }
            name = " ${1:name}"
        else:
            name = " ${1|" + ",".join(names) + "|}" if names else ""
        out.append(_item(kind, _K.Struct, keydocs.markdown(block, kind, head=True), insert=f"{kind}{name} {{\n\t$0\n}}", sort="~"))
    return out


def _values(an: Analysis | None, block: str, key: str) -> list[lsp.CompletionItem]:
    if block == "plan" and key in ("cluster", "model"):
        defs = [d for d in (an.defs.values() if an else ()) if d.kind == key]
        return [_item(d.name, _K.Reference, f"{key} defined in {os.path.basename(d.file)}, line {d.block.span.line}") for d in defs]
    if (block, key) in VALUES:
        detail = {n: f"{si(d.peak_flops, 'FLOP/s')}, {size(d.memory)}" for n, d in DEVICES.items()} if key == "device" else {}
        return [_item(v, _K.EnumMember, detail.get(v), insert=v if "$" in v else None) for v in VALUES[(block, key)]]
    if keydocs.is_bool(block, key):
        return [_item("true", _K.Keyword), _item("false", _K.Keyword)]
    return []


def _paths(base: str, partial: str, text: Text, offset: int) -> list[lsp.CompletionItem]:
    """Folders and plan files for an import, relative to the document's folder."""
    folder, stem = os.path.split(partial)
    try:
        entries = sorted(os.scandir(os.path.join(base, folder) or "."), key=lambda e: e.name)
    except (OSError, ValueError):  # not a folder; a NUL or a lone surrogate in the name
        return []
    rng = lsp.Range(text.position(offset - len(stem)), text.position(offset))
    out = []
    for e in entries:
        try:
            if e.is_dir() and not e.name.startswith("."):
                out.append(lsp.CompletionItem(e.name + "/", kind=_K.Folder, text_edit=lsp.TextEdit(rng, e.name + "/")))
            elif e.name.endswith(".plan") and e.is_file():
                out.append(lsp.CompletionItem(e.name, kind=_K.File, text_edit=lsp.TextEdit(rng, e.name)))
        except OSError:
            continue
    return out


def _link_detail(name: str) -> str | None:
    if name not in LINKS:
        return None
    scope, bw, _ = LINKS[name]
    return f"catalog: {scope} scope, {bw / 1e9:g} GB/s"


def _item(label: str, kind, doc: str | None = None, insert: str | None = None, sort: str = "") -> lsp.CompletionItem:
    """``insert``: a snippet ($1, ${1|a,b|}, $0); ``doc``: markdown, or a short detail."""
    shown = label.replace("$1", "…").replace("${1:2}", "N")
    markdown = doc is not None and ("**" in doc or "\n" in doc)
    return lsp.CompletionItem(
        label=shown, kind=kind, detail=None if markdown else doc,
        documentation=lsp.MarkupContent(lsp.MarkupKind.Markdown, doc) if markdown else None,
        insert_text=insert or label, sort_text=sort + shown,
    )


def _edited(item: lsp.CompletionItem, rng: lsp.Range, snippets: bool) -> lsp.CompletionItem:
    """The item replacing the word typed so far; its snippet as plain text where the client
    takes no snippets (placeholders dropped, a choice's first option kept)."""
    text = item.insert_text or item.label
    if snippets and "$" in text:
        item.insert_text_format = lsp.InsertTextFormat.Snippet
    elif "$" in text:
        text = re.sub(r"\$\{\d+\|([^,|]*)[^}]*\}|\$\{\d+:([^}]*)\}|\$\d+", lambda m: m.group(1) or m.group(2) or "", text)
    item.text_edit, item.insert_text = lsp.TextEdit(rng, text), None
    return item
