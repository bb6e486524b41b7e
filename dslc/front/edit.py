"""A plan file that holds a layout the search found (``dslc search PLAN -o FILE``).

The file is the input plan's own text, edited at its spans (:mod:`dslc.front.textedit`): its
comments, key order, imports and style stay; the mesh's body is rewritten, the parallel blocks
edited, inserted or removed, ``train`` gets the micro-batch and the recompute policy (and the
global batch, when the search was given another; an ``offload`` block, when it offloads). The other plans of the file are left out,
with the clusters and models only they use. Relative paths are rewritten for the new file's
folder: imports, and the data and init paths, which lower resolves against the plan file's
folder; ``checkpoint.dir`` is relative to the run's working directory, so it stays as written.
:func:`layout_text` lowers what it wrote and raises :class:`WriteError` unless it is the layout
(:func:`same_layout`) with no error or warning; :func:`dslc.driver.layout_file` lints it too.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .. import ir
from ..diagnostics import Diagnostic, printable
from ..knobs import offload_text
from ..source import Sources
from . import ast
from .load import Loader
from .lower import IDENT, lower_unit
from .same import same_layout
from .textedit import Editor, quote

HEADER = "// Written by `dslc search` from "
KEYWORDS = ("true", "false", "import", "on", "every")  # not a plan name: the grammar reads them as words
# the plan's entries in the order plans write them: a new block goes after the last before it
ORDER = ("model", "cluster", "mesh", "tensor_parallel", "data_parallel", "pipeline", "context_parallel", "experts", "train")


class WriteError(Exception):
    """The text written is not the layout, or does not lint clean: a bug of the writer."""


def can_name_a_plan(name: str) -> bool:
    """Whether ``name`` reads back as a plan's name (an identifier, not a keyword)."""
    return bool(IDENT.match(name)) and name not in KEYWORDS


def layout_text(plan: ir.Plan, layout: ir.Plan, out_path: str, name: str,
                changes: list[str] | tuple[str, ...] | None = None, source: str | None = None) -> str:
    """The text of a plan file, to be written at ``out_path``, that defines one plan ``name``
    equal to ``layout``: ``plan``'s file edited where the layout differs from it (mesh,
    parallel blocks, micro-batch, recompute, the cluster's size). ``changes`` go in the
    header (by default the fields that differ); ``source`` is the plan file's text when it
    was not read from ``plan.file`` (standard input)."""
    if not can_name_a_plan(name):
        raise ValueError(f"{name!r} cannot name a plan: a name starts with a letter or '_' and holds letters, digits and '_'")
    loader = Loader(Sources(), [])
    loader.read(plan.file, None if source is None else source.encode("utf-8"))
    text, expected = _Writer(plan, layout, out_path, name, loader).write(changes)
    _verify(text, out_path, name, expected)
    return text


# ---------------------------------------------------------------------------- comparing


def _verify(text: str, out_path: str, name: str, expected: ir.Plan) -> None:
    """Lower the text as ``dslc lint`` reads it at ``out_path``: no error or warning, and
    the plan is ``expected``."""
    loader = Loader(Sources(), [])
    loader.read(out_path, text.encode("utf-8"))
    plans, _, _, _, diags = lower_unit(loader.unit(out_path), loader.asts)
    bad = [d for d in [*loader.diags, *diags] if d.severity.value in ("error", "warning")]
    got = next((p for p in plans if p.name == name and p.file == out_path), None)
    differ = same_layout(got, expected) if got is not None else [f"plan {name} (not lowered)"]
    if bad or differ:
        raise WriteError(problems(f"the plan written for {out_path}", bad, differ))


def problems(what: str, diags: list[Diagnostic], differ: list[str]) -> str:
    lines = [f"{d.span}: {d.severity.value}[{d.code}]: {d.message}" for d in diags]
    lines += [f"differs from the layout in {', '.join(differ)}"] if differ else []
    return f"{what} is wrong (a bug of dslc's plan writer): " + "; ".join(lines)


# ---------------------------------------------------------------------------- writing


def _find(block: ast.Block | None, kind: str) -> ast.Block | None:
    return next((s for s in block.body if isinstance(s, ast.Block) and s.kind == kind), None) if block else None


def _assign(block: ast.Block | None, key: str) -> ast.Assign | None:
    return next((s for s in block.body if isinstance(s, ast.Assign) and s.key == key), None) if block else None


def _key(st) -> str:
    return st.key if isinstance(st, ast.Assign) else st.kind if isinstance(st, ast.Block) else st.name


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _resized(old: ir.Cluster, new: ir.Cluster) -> str:  # grown from 16 GPUs (2 × 8) to 1024 (128 × 8), or cut
    return f"{'grown' if new.world_size > old.world_size else 'cut'} from {old.world_size} GPUs ({old.nodes} × {old.gpus_per_node}) to {new.world_size} ({new.nodes} × {new.gpus_per_node})"


def _path_strings(v) -> list[ast.String]:
    """The paths of a ``data`` or ``init`` value: text(…), tokens(…), hf(…), in a blend too."""
    if not isinstance(v, ast.Call):
        return []
    if v.name in ("text", "tokens", "hf") and v.args and isinstance(v.args[0], ast.String):
        return [v.args[0]]
    return [s for a in v.args for s in _path_strings(a)] if v.name == "blend" else []


class _Writer:
    def __init__(self, plan: ir.Plan, layout: ir.Plan, out_path: str, name: str, loader: Loader):
        self.plan, self.layout, self.out, self.name, self.loader = plan, layout, out_path, name, loader
        self.unit = loader.unit(plan.file)
        self.tree = loader.asts[plan.file]
        if self.tree is None:
            raise ValueError(f"{plan.file} is not a plan file")
        self.block = next((i for i in self.tree.items if isinstance(i, ast.Block) and i.kind == "plan" and i.name == plan.name), None)
        if self.block is None:
            raise ValueError(f"{plan.file} defines no plan {plan.name}")
        self.ed = Editor(loader.sources.texts[plan.file])
        self.gone: list = []  # statements of the plan block to delete
        self.new: list[tuple[str, str]] = []  # (kind, text) of blocks to add to it

    def write(self, changes) -> tuple[str, ir.Plan]:
        ed, block, lay = self.ed, self.block, self.layout
        ed.set(block.name_span, self.name)
        cref = _assign(block, "cluster")
        resized = (lay.cluster.nodes, lay.cluster.gpus_per_node) != (self.plan.cluster.nodes, self.plan.cluster.gpus_per_node)
        cluster_name, new_cluster = self.plan.cluster.name, ""
        if resized and cref is None:  # an inline cluster: edit it in place
            self._resize(ed, _find(block, "cluster"))
        elif resized:
            cluster_name, new_cluster = self._copy_cluster(cref.value.name)
            ed.set(cref.value, cluster_name)
        self._mesh()
        for kind, keys in self._parallel().items():
            self._block(kind, keys)
        self._train()
        self._add_blocks()
        ed.delete(block.body, self.gone)
        for s in [s for a in self._assigns_with_paths() for s in _path_strings(a.value)]:
            if (moved := self._moved(s.value)) is not None:
                ed.set(s, quote(moved))
        text = self._header(changes) + self._assemble(cref.value.name if cref is not None and not resized else None, new_cluster)
        return text, replace(lay, cluster=replace(lay.cluster, name=cluster_name))

    # -- the file ------------------------------------------------------------
    def _assemble(self, cluster_def: str | None, new_cluster: str) -> str:
        """The prologue (the file's first comments, without an earlier header of ours),
        then each kept item with the comments and blank lines before it."""
        ed, items = self.ed, self.tree.items
        mref = _assign(self.block, "model")
        model_def = mref.value.name if mref is not None and isinstance(mref.value, ast.Ident) else None
        bounds = [ed.range(i.span) for i in items]
        starts = [ed.line_start(bounds[0][0])] + [
            ed.after_line(e) if ed.line_end(e) < s else s for (_, e), (s, _) in zip(bounds, bounds[1:])]
        ends = starts[1:] + [ed.after_line(bounds[-1][1])]
        out = [self._prologue(ed.text[: starts[0]])]
        for item, start, end in zip(items, starts, ends):
            if isinstance(item, ast.Import):
                if (moved := self._moved(item.path)) is not None:
                    ed.set(item, "import " + quote(moved))
            elif item is self.block:
                out.append(new_cluster)
            elif not (item.kind == "cluster" and item.name == cluster_def or item.kind == "model" and item.name == model_def):
                continue
            out.append(ed.render(start, end))
        text = "".join(out)
        return text if text.endswith("\n") else text + ed.newline

    def _prologue(self, text: str) -> str:
        if not text.startswith(HEADER):
            return text
        lines = text.split("\n")
        blank = next((i for i, line in enumerate(lines) if not line.strip()), len(lines) - 1)
        return "\n".join(lines[blank + 1 :])

    def _header(self, changes) -> str:
        nl, old, new = self.ed.newline, self.plan.cluster, self.layout.cluster
        lines = [f"{HEADER}{printable(self.plan.file)} (plan {self.plan.name}), as plan {self.name}."]
        # the search's changes are of the layout on the searched cluster: its size changed too
        resized = [f"cluster {old.name} {_resized(old, new)}"] if changes is not None and old.world_size != new.world_size else []
        changes = resized + list(changes) if changes is not None else same_layout(self.plan, self.layout)
        lines += ["// Changed: " + (printable(changes[0]) if changes else "nothing: this is the plan's own layout")]
        lines += [f"//          {printable(c)}" for c in changes[1:]]
        if os.path.abspath(os.path.dirname(self.out)) != os.path.abspath(os.path.dirname(self.plan.file)):
            lines += ["// Paths are relative to this file; checkpoint.dir stays relative to the run's working directory."]
        return nl.join(lines) + nl + nl

    def _moved(self, path: str) -> str | None:
        """``path`` (relative to the plan file's folder) relative to the output's, or None
        when it already names the same file from there (or is absolute)."""
        if os.path.isabs(path) or "\0" in path:
            return None
        base = os.path.dirname(self.plan.file) if not self.plan.file.startswith("<") else ""
        target = os.path.abspath(os.path.normpath(os.path.join(base, path)))
        here = os.path.abspath(os.path.dirname(self.out))
        if os.path.abspath(os.path.normpath(os.path.join(here, path))) == target:
            return None
        return os.path.relpath(target, here)

    def _assigns_with_paths(self) -> list[ast.Assign]:
        train = _find(self.block, "train")
        return [a for a in (_assign(train, "data"), _assign(train, "init"), _assign(_find(train, "eval"), "data")) if a]

    # -- the cluster ---------------------------------------------------------
    def _resize(self, ed: Editor, block: ast.Block) -> None:
        c = self.layout.cluster
        for key, value in (("nodes", c.nodes), ("gpus_per_node", c.gpus_per_node)):
            if (a := _assign(block, key)) is not None:
                ed.set(a.value, str(value))
            else:
                ed.insert_first(block, f"{key} = {value}")

    def _copy_cluster(self, name: str) -> tuple[str, str]:
        """A copy of cluster ``name``'s block (of this file or an imported one), renamed and
        resized: (its name, its text with the comment before it)."""
        found = [(f, i) for f in self.unit.files for i in getattr(self.loader.asts.get(f), "items", ())
                 if isinstance(i, ast.Block) and i.kind == "cluster"]
        file, block = next((f, i) for f, i in found if i.name == name)
        c = self.layout.cluster
        taken = {i.name for _, i in found}
        base = f"{name}_{c.world_size}gpus"
        new = next(n for n in [base] + [f"{base}_{k}" for k in range(2, len(taken) + 3)] if n not in taken)
        ed = Editor(self.loader.sources.texts[file])
        ed.set(block.name_span, new)
        self._resize(ed, block)
        nl, note = self.ed.newline, f"// {name} {_resized(self.plan.cluster, c)} by dslc search"
        return new, nl + note + nl + ed.render(*ed.range(block.span)) + nl

    # -- the layout ----------------------------------------------------------
    def _mesh(self) -> None:
        """The mesh block's body: one axis a line, indented as the first axis was, each with
        the trailing comment its axis had (a mesh written on one line stays on one line)."""
        ed, mb, axes = self.ed, _find(self.block, "mesh"), self.layout.mesh.axes
        lines = [f"{a.name} = {a.size} on {a.link}" for a in axes]
        if mb is None:
            if lines:
                self.new.append(("mesh", "mesh {\n" + "".join(f"    {line}\n" for line in lines) + "}"))
            return
        if not axes:
            self.gone.append(mb)
            return
        said = {ax.name: ed.trailing_comment(ed.range(ax.span)[1]) for ax in mb.body if isinstance(ax, ast.Axis)}
        lines = [line + (f"  {said[a.name]}" if said.get(a.name) else "") for line, a in zip(lines, axes)]
        b, c, nl = ed.brace(mb), ed.range(mb.span)[1] - 1, ed.newline
        if ed.tail_free(b + 1) and ed.head_blank(c) and ed.line_end(b) < c:
            start, end = ed.after_line(b), ed.line_start(c)
            first = ed.range(mb.body[0].span)[0] if mb.body else None
            ind = ed.indent(first) if first is not None and ed.head_blank(first) else ed.indent(c) + "    "
            own = [line.rstrip("\r") for line in ed.text[start:end].split("\n") if line.strip().startswith(("//", "#"))]
            ed.replace(start, end, "".join(line + nl for line in own) + "".join(ind + line + nl for line in lines))
        elif ed.line_end(b) > c:  # a mesh on one line stays on one line
            ed.replace(b + 1, c, " " + "; ".join(f"{a.name} = {a.size} on {a.link}" for a in axes) + " ")
        else:
            ind = ed.indent(b)
            ed.replace(b + 1, c, nl + "".join(f"{ind}    {line}{nl}" for line in lines) + ind)

    def _written(self, kind: str, key: str) -> bool:
        return _assign(_find(self.block, kind), key) is not None

    def _parallel(self) -> dict[str, dict[str, str | None]]:
        """Each parallel block's keys: the value to write, or None to leave the key out. A key
        is written when the plan wrote it or its value is not the default, and never where
        it has no effect (W057, W063, W079, W102); the choices the search makes between
        equals (sequence parallel under tp, the schedule, the cp method, the ZeRO stage
        where ranks share weights) are always written."""
        lay, w = self.layout, self._written
        sp, d, pl, c = lay.tensor_parallel.sequence_parallel, lay.data_parallel, lay.pipeline, lay.context_parallel
        pp, cp = lay.pp > 1, lay.cp > 1
        # without microbatches, lower derives them from the global batch (when written)
        derived = max(1, lay.train.global_batch // (lay.train.micro_batch * lay.data_parallel_size)) if self._written("train", "global_batch") else 1
        split = "[" + ", ".join(map(str, pl.layers_per_stage or ())) + "]"
        return {
            "tensor_parallel": {"sequence_parallel": _bool(sp) if lay.tp > 1 else None},
            "data_parallel": {
                "zero": str(d.zero) if d.zero or lay.dp * lay.cp * lay.ep > 1 else None,
                "shard": str(d.shard) if d.shard else None,
                "reshard_after_forward": _bool(d.reshard_after_forward) if d.zero == 3 and (not d.reshard_after_forward or w("data_parallel", "reshard_after_forward")) else None,
            },
            "pipeline": {
                "schedule": pl.schedule if pp else None,
                "virtual_stages": str(pl.virtual_stages) if pp and pl.virtual_stages != 1 else None,
                "microbatches": str(pl.microbatches) if w("pipeline", "microbatches") or pl.microbatches != derived else None,
                "layers_per_stage": split if pp and pl.layers_per_stage else None,
            },
            "context_parallel": {
                "method": c.method if cp else None,
                "load_balance": _bool(c.load_balance) if cp and (not c.load_balance or w("context_parallel", "load_balance")) else None,
            },
        }

    def _block(self, kind: str, keys: dict[str, str | None]) -> None:
        """Edit, add or remove one of the parallel blocks, which hold only these keys."""
        ed, b = self.ed, _find(self.block, kind)
        if b is None:
            items = [f"{k} = {v}" for k, v in keys.items() if v is not None]
            if items:
                self.new.append((kind, f"{kind} {{ {'; '.join(items)} }}"))
            return
        assigns = [a for a in b.body if isinstance(a, ast.Assign)]
        kept = [a for a in assigns if keys.get(a.key) is not None]
        new = [f"{k} = {v}" for k, v in keys.items() if v is not None and all(a.key != k for a in assigns)]
        if not kept and not new:
            self.gone.append(b)
        elif not kept:
            ed.set(b, f"{kind} {{ {'; '.join(new)} }}")
        else:
            for a in kept:
                ed.set(a.value, keys[a.key])
            ed.delete(b.body, [a for a in assigns if a.key in keys and keys[a.key] is None])
            order = list(keys)
            for key in (k for k, v in keys.items() if v is not None and all(a.key != k for a in assigns)):
                before = [a for a in kept if order.index(a.key) < order.index(key)]
                if before:  # after the kept key before it in the block's order, else before the first
                    ed.insert_after(before[-1], f"{key} = {keys[key]}")
                else:
                    ed.insert_before(kept[0], f"{key} = {keys[key]}")

    def _train(self) -> None:
        """``micro_batch = N``, ``recompute = …`` and a new ``global_batch`` in train, each
        after the key it reads best after when it was not written."""
        t, w = self.layout.train, self._written
        keys = {"micro_batch": str(t.micro_batch) if t.micro_batch != 1 or w("train", "micro_batch") else None,
                "recompute": t.recompute_label if t.recompute_label != "none" or w("train", "recompute") else None,
                "global_batch": str(t.global_batch) if t.global_batch != self.plan.train.global_batch or w("train", "global_batch") else None}
        after = {"micro_batch": ("steps",), "recompute": ("precision", "global_batch", "micro_batch", "steps"), "global_batch": ("micro_batch", "steps")}
        tb = _find(self.block, "train")
        o, was = t.offload, self.plan.train.offload
        offload = offload_text(o) if o and (o.optimizer, o.activations) != (was and was.optimizer, was and was.activations) else None
        if tb is None:
            items = [f"{k} = {v}" for k, v in keys.items() if v is not None] + [offload] * bool(offload)
            if items:
                self.new.append(("train", f"train {{ {'; '.join(items)} }}"))
            return
        if offload and _find(tb, "offload") is not None:  # the search offloads more than it did
            self.ed.set(_find(tb, "offload"), offload)
        elif offload and tb.body:
            self.ed.insert_line_after(tb.body[-1], offload)
        elif offload:
            self.ed.insert_first(tb, offload)
        assigns = [a for a in tb.body if isinstance(a, ast.Assign)]
        for key, value in keys.items():
            a = _assign(tb, key)
            if a is not None and value is not None:
                self.ed.set(a.value, value)
            elif value is not None:
                anchor = next((x for k in after[key] for x in assigns if x.key == k), assigns[-1] if assigns else None)
                if anchor is not None:
                    self.ed.insert_after(anchor, f"{key} = {value}")
                else:
                    self.ed.insert_first(tb, f"{key} = {value}")

    def _add_blocks(self) -> None:
        """The new blocks, each on a line after the last entry of the plan that comes before
        it in :data:`ORDER` (and that stays)."""
        body = [s for s in self.block.body if not any(s is g for g in self.gone)]
        for kind, text in self.new:
            before = [s for s in body if _key(s) in ORDER[: ORDER.index(kind)]]
            anchor = before[-1] if before else (body[-1] if body else None)
            if anchor is not None:
                self.ed.insert_line_after(anchor, text)
            else:
                self.ed.insert_first(self.block, text)
