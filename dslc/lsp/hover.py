"""What the hover shows, by what is under the cursor:

- a key (or a mesh axis, or a block's head): its type, default, range, units and meaning
  (:mod:`.keydocs`);
- a plan's name: ``dslc explain``'s summary (what it is, memory per GPU of each stage
  against the device's, the step, tokens/s and MFU), or the errors that stop it;
- the name of a cluster, model or link, where it is defined or used: its definition, and
  for a cluster its GPUs, for a model its parameters;
- a device: the catalog's numbers.
"""

from __future__ import annotations

import os

from lsprotocol import types as lsp

from .. import arch
from ..catalog import DEVICES, LINKS
from ..report import explain
from ..source import Span
from ..units import count, si, size
from . import keydocs
from .analysis import Analysis
from .cursor import WORD, context, following, string_at, word_at

MAX_LINES = 20  # of a definition shown


def hover(an: Analysis, offset: int) -> lsp.Hover | None:
    text = an.text.text
    quoted = string_at(text, offset)
    if quoted is not None:
        imported = an.import_at(quoted[0])
        md = _imported(an, imported[1]) if imported else None
        return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, md), an.text.range(imported[0].span)) if md else None
    found = word_at(text, offset)
    if found is None:
        return None
    start, end = found
    word, ctx = text[start:end], context(text, start)
    if ctx.comment or ctx.string is not None:
        return None
    after = following(text, end)
    if not ctx.tokens:  # the first word of a statement: a key, an axis or a block's head
        md = keydocs.markdown(ctx.block, word) if after == "=" else keydocs.markdown(ctx.block, word, head=True)
    elif len(ctx.tokens) == 1 and WORD.fullmatch(ctx.tokens[0]) and after == "{":  # a block's name
        md = _named(an, ctx.tokens[0], word, ctx.block, ctx.plan)
    elif ctx.after("*", "="):
        md = _value(an, ctx.block, ctx.tokens[0], word) or keydocs.markdown(ctx.block, ctx.tokens[0])
    elif ctx.tokens[-1] == "on":
        md = _link(an, ctx.plan, word)
    else:
        md = None
    if not md:
        return None
    return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, md), lsp.Range(an.text.position(start), an.text.position(end)))


def _named(an: Analysis, kind: str, name: str, block: str, plan: str | None) -> str | None:
    """The name in a block's head: ``plan NAME {``, ``cluster NAME {``, ``link ib {`` …"""
    if kind == "plan" and block == "":
        return plan_summary(an, name)
    if kind in ("cluster", "model") and block == "":
        return _definition(an, kind, name)
    if kind == "model":  # model llama { … } in a plan: the architecture
        return keydocs.markdown("model", "arch")
    if kind == "link":
        return _link(an, plan, name) if block == "cluster" and plan else _link_here(an, name)
    return keydocs.markdown(block, kind, head=True)


def _value(an: Analysis, block: str, key: str, word: str) -> str | None:
    if block == "plan" and key in ("cluster", "model"):
        return _definition(an, key, word)
    if key == "device" and word in DEVICES:
        d = DEVICES[word]
        return (f"**{word}** (the catalog, `dslc/catalog.py`)  \n{si(d.peak_flops, 'FLOP/s')} dense bf16 peak, "
                f"{size(d.memory)} of memory at {d.bandwidth / 1e12:g} TB/s")
    return None


def plan_summary(an: Analysis, name: str) -> str:
    ex = an.explained(name)
    head = f"**plan {name}**"
    if isinstance(ex, explain.Explanation):
        where = os.path.basename(an.path)
        return f"{head} — `dslc explain {where}` has the whole report\n```text\n" + "\n".join(explain.summary(ex)) + "\n```"
    if not ex:
        return f"{head}: not lowered yet"
    shown = ", ".join(f"{d.code} at {_at(an, d.span)}" for d in ex[:5]) + (", …" if len(ex) > 5 else "")
    return f"{head}: no estimate while the plan has errors ({len(ex)}: {shown})"


def _definition(an: Analysis, kind: str, name: str) -> str | None:
    d = an.defs.get((kind, name))
    if d is None:
        return None
    lines = [f"**{kind} {name}** — {_at(an, d.block.span)}"]
    if kind == "cluster":
        c = next((p.cluster for p in an.result.plans if p.cluster.name == name), None)
        if c is not None:
            dev = c.device
            lines.append(f"{c.nodes * c.gpus_per_node} GPUs: {c.nodes} × {c.gpus_per_node} {dev.name} "
                         f"({si(dev.peak_flops, 'FLOP/s')}, {size(dev.memory)} each)")
    else:
        m = next((p.model for p in an.result.plans if p.model.name == name), None)
        if m is not None:
            lines.append(f"{m.arch}: {count(arch.params(m).total)} parameters")
    return "  \n".join(lines) + _excerpt(an, d.block.span)


def _imported(an: Analysis, path: str) -> str:
    """An import: the file it names and what the file defines."""
    names = [f"{d.kind} `{d.name}`" for d in an.defs.values() if d.file == path]
    if an.result.asts.get(path) is None:
        return f"**{an.relative(path)}**: not read as a plan (the diagnostic at the import says why)"
    return f"**{an.relative(path)}**  \ndefines " + (", ".join(names) if names else "nothing")


def _link(an: Analysis, plan: str | None, name: str) -> str | None:
    """A link a plan's mesh names: as its cluster defines it, with its numbers."""
    lowered = an.plan(plan) if plan else None
    lk = lowered.cluster.link(name) if lowered else None
    block = next((b for b, _ in an.links(plan) if b.name == name), None)
    if lk is None and block is None:
        return None
    lines = [f"**link {name}**"]
    if lk is not None:
        lines.append(f"scope {lk.scope}: {lk.bandwidth / 1e9:g} GB/s per direction per GPU, latency {lk.latency * 1e6:g} us")
    return "  \n".join(lines) + (_excerpt(an, block.span) if block else "")


def _link_here(an: Analysis, name: str) -> str | None:
    """``link NAME { … }`` in a cluster of no plan: the catalog's numbers, if it has the name."""
    if name not in LINKS:
        return keydocs.markdown("cluster", "link", head=True)
    scope, bw, lat = LINKS[name]
    return (f"**link {name}** (the catalog: what a key left out is)  \n"
            f"scope {scope}: {bw / 1e9:g} GB/s per direction per GPU, latency {lat * 1e6:g} us")


def _at(an: Analysis, span: Span | None) -> str:
    if span is None:
        return "?"
    where = "" if span.file == an.path else an.relative(span.file) + ":"
    return f"{where}{span.line}:{span.col}"


def _excerpt(an: Analysis, span: Span) -> str:
    """The lines of a definition (at most :data:`MAX_LINES`), as written."""
    text = an.text_of(span.file)
    if text is None:
        return ""
    lines = text.text.split("\n")[span.line - 1 : span.end_line]
    cut = lines[:MAX_LINES] + ["…"] * (len(lines) > MAX_LINES)
    return "\n```dslc-plan\n" + "\n".join(line.rstrip("\r") for line in cut).replace("```", "`\u200b``") + "\n```"
