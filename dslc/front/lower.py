"""AST → IR: resolve names, check keys, types and units, fill in every default, and
build the frozen IR of each plan of a unit (:mod:`dslc.front.load` reads the unit).

Names (clusters, models, plans) are global within a unit. Diagnostics are collected,
never raised: a bad key gets its default so that every other error of the file is
still reported, and the checks read it as unknown (:func:`checked`), as they do a part
an error left out (a partial plan: :mod:`dslc.unknown`). The plan block itself is
:mod:`dslc.front.plan`.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass, replace
from typing import NamedTuple

from .. import arch as archs
from .. import ir
from ..catalog import DEVICES, LINKS
from ..diagnostics import Diagnostic, error, warning
from ..source import Span
from ..unknown import Unknown, unknowns
from . import ast
from .defaults import DEFAULTS as D
from .defaults import MAX_RANKS, ROUTERS
from .keys import BLOCKS, KEYS, MODEL_EXPERT_KEYS, TOP_BLOCKS
from .load import Unit
from .plan import capacity_factor, lower_plan
from .schema import Fields, Reader

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# --------------------------------------------------------------------------
# definitions


Library = list[tuple[ir.Cluster | ir.Model, dict[str, Span]]]


class Lowered(NamedTuple):
    plans: list[ir.Plan]  # whole: what compile writes
    views: list[ir.Plan]  # of each plan, what the checks read (keys written wrong unknown: checked)
    partial: list[ir.Plan]  # ``unknown.Unknown`` where an error left a part unknown: for the checks only
    library: Library  # the clusters and models no plan uses, each lowered on its own with its keys' spans
    diags: list[Diagnostic]


def lower_unit(unit: Unit, asts: dict[str, ast.File | None]) -> Lowered:
    """The unit's plans, its partial plans, the definitions no plan uses (so that lint checks
    each, used or not) and every diagnostic."""
    diags: list[Diagnostic] = []
    r = Reader(diags)
    defs: dict[str, dict[str, ast.Block]] = {k: {} for k in TOP_BLOCKS}
    unnamed: list[ast.Block] = []  # blocks not in defs (no name, a bad one, twice): checked all the same
    for path in unit.files:
        tree = asts.get(path)
        if tree is None:
            continue
        for item in tree.items:
            if isinstance(item, ast.Import):
                continue
            if item.kind not in TOP_BLOCKS:
                diags.append(r.unknown("E016", f"unknown block '{item.kind}'", item.kind, TOP_BLOCKS, item.kind_span))
                continue
            seen = defs[item.kind].get(item.name or "")
            if item.name is None:
                diags.append(error("E012", item.kind_span, f"a top-level {item.kind} needs a name", f"write `{item.kind} my_{item.kind} {{ … }}`"))
            elif not IDENT.match(item.name):
                diags.append(error("E020", item.name_span, f"'{item.name}' is not a valid {item.kind} name", "names start with a letter or '_' and hold letters, digits and '_'"))
            elif seen is not None:
                diags.append(error("E017", item.name_span, f"{item.kind} '{item.name}' is defined twice", f"first defined at {seen.name_span}"))
            else:
                defs[item.kind][item.name] = item
                continue
            if item.kind != "plan" or item.name is not None:  # a plan without a name has no message
                unnamed.append(item)

    lw = Lowerer(r, defs)
    plans, partial = [], []
    for block in defs["plan"].values():
        plan = lw.plan(block)
        (partial if unknowns(plan) else plans).append(plan)
    partial += [lw.plan(b) for b in unnamed if b.kind == "plan"]  # checked, never compiled

    # Definitions that no plan uses: a warning in a file that holds plans, not in a library's;
    # each checked on its own all the same (its errors are the file's, used or not).
    plan_files = {b.span.file for b in defs["plan"].values()}
    library: Library = []
    for kind in ("cluster", "model"):
        unused = [(n, b) for n, b in defs[kind].items() if n not in lw.used[kind]] + [(None, b) for b in unnamed if b.kind == kind]
        for name, block in unused:
            if name is not None and name not in lw.named[kind] and block.span.file in plan_files:
                diags.append(warning("W022", block.name_span, f"{kind} '{name}' is defined but no plan uses it", f"remove it, or use it with `{kind} = {name}`"))
            if (lowered := lw._lower_def(kind, block)) is not None:
                library.append((lowered, {f"{kind}.{a.key}": a.span for a in block.body if isinstance(a, ast.Assign)}))
    return Lowered(plans, [checked(p, r.guessed) for p in plans], [checked(p, r.guessed) for p in partial], library, diags)


BATCH = {"train.micro_batch", "pipeline.microbatches", "train.global_batch"}  # each left out is derived from the others


def checked(plan: ir.Plan, guessed: set[Span]) -> ir.Plan:
    """What the checks read of a whole ``plan``: each key whose value was written wrong (and
    so lowered as its default, ``Reader.guessed``) unknown, and the batch sizes derived from
    one, so that no rule reports on the default. The plan itself, when there is none."""
    keys = {k for k, span in plan.spans.items() if span in guessed}
    if keys & BATCH:
        keys |= BATCH - plan.spans.keys()
    parts: dict[str, object] = {}
    for key in sorted(keys):
        part, _, name = key.partition(".")
        value = parts.get(part, getattr(plan, part, None))
        if part not in ("spans", "span") and is_dataclass(value) and name in {f.name for f in fields(value)}:
            parts[part] = replace(value, **{name: Unknown(key)})
    return replace(plan, **parts) if parts else plan


class Lowerer:
    def __init__(self, reader: Reader, defs: dict[str, dict[str, ast.Block]]):
        self.r = reader
        self.defs = defs
        self.used: dict[str, set[str]] = {"cluster": set(), "model": set()}
        self.named: dict[str, set[str]] = {"cluster": set(), "model": set()}  # by a plan that also gives one inline (E011)
        self._cache: dict[tuple[str, int], object] = {}

    # -- references ---------------------------------------------------------
    def resolve(self, kind: str, fields: Fields, spans: dict[str, Span]):
        """``model = name`` / ``cluster = name``, or an inline block."""
        ref, blocks = fields.assigns.get(kind), fields.blocks.get(kind, [])
        if ref is not None and blocks:  # which one is meant is unknown: the plan's checks that read it wait
            self.r.diags.append(error("E011", blocks[0].kind_span, f"{kind} is given twice: by name on line {ref.span.line} and inline here", f"keep one: `{kind} = …` or the inline `{kind} {{ … }}` block"))
            if (name := self.r.ident(ref)) in self.defs[kind]:
                self.named[kind].add(name)  # no W022: checked as a definition no plan uses
            self._lower_def(kind, blocks[0])  # its own errors
            return None
        if ref is not None:
            spans[kind] = ref.span
            name = self.r.ident(ref)
            if name is None:
                return None
            block = self.defs[kind].get(name)
            if block is None:
                self.r.diags.append(self.r.unknown("E018", f"unknown {kind} '{name}'", name, self.defs[kind], ref.value.span))
                return None
            self.used[kind].add(name)
        elif blocks:
            block = blocks[0]
            spans[kind] = block.kind_span
        else:
            block = None
        if block is not None:
            for a in block.body:
                if isinstance(a, ast.Assign):
                    spans[f"{kind}.{a.key}"] = a.span
            return self._lower_def(kind, block)
        self.r.diags.append(error("E012", fields.block.name_span or fields.block.kind_span, f"plan '{fields.block.name}' has no {kind}", f"add `{kind} = <name>` or an inline `{kind} … {{ }}` block"))
        return None

    def _lower_def(self, kind: str, block: ast.Block):
        key = (kind, id(block))
        if key not in self._cache:  # lower a shared definition once
            self._cache[key] = self.cluster(block) if kind == "cluster" else self.model(block)
        return self._cache[key]

    # -- cluster ------------------------------------------------------------
    def cluster(self, block: ast.Block) -> ir.Cluster | None:
        r = self.r
        f = r.fields(block, KEYS["cluster"], blocks=BLOCKS["cluster"])
        nodes = r.int(f, "nodes", required=True)
        gpn = r.int(f, "gpus_per_node", required=True)
        dev_name = r.choice(f, "device", tuple(DEVICES), required=True)
        dev = DEVICES.get(dev_name) if dev_name else None
        peak = r.quantity(f, "peak_flops", "flops", dev.peak_flops if dev else None)
        fp8 = r.quantity(f, "fp8_flops", "flops", dev.fp8_flops if dev else None)
        mem = r.quantity(f, "device_memory", "size", dev.memory if dev else None)
        efficiency = r.float(f, "efficiency")
        host_memory, host_bw = r.quantity(f, "host_memory", "size"), r.quantity(f, "host_bandwidth", "rate", 0.0)
        links: list[ir.Link] = []
        for lb in f.blocks.get("link", []):
            if lb.name is None:
                r.diags.append(error("E012", lb.kind_span, "a link needs a name", "write `link nvlink { … }`"))
                continue
            if any(lk.name == lb.name for lk in links):
                r.diags.append(error("E017", lb.name_span, f"link '{lb.name}' is defined twice"))
                continue
            cat = LINKS.get(lb.name)
            lf = r.fields(lb, KEYS["link"])
            scope = r.choice(lf, "scope", ir.LINK_SCOPES, cat[0] if cat else None, required=cat is None)
            bw = r.quantity(lf, "bandwidth", "rate", cat[1] if cat else None, required=cat is None, catalog=lb.name)
            lat = r.quantity(lf, "latency", "time", cat[2] if cat else D["link.latency"], catalog=lb.name if cat else None)
            if scope and bw is not None and lat is not None:
                links.append(ir.Link(lb.name, scope, float(bw), float(lat), lb.span))
        if nodes is not None and gpn is not None and nodes * gpn > MAX_RANKS:
            r.diags.append(error("E037", block.name_span or block.kind_span, f"cluster '{block.name}' has {nodes * gpn} GPUs ({nodes} nodes × {gpn}), more than the {MAX_RANKS} dslc plans for", "see the limits in docs/language.md"))
            return None
        # an error in a key leaves it unknown, not the cluster: its links and GPU count still serve
        device = Unknown("cluster.device") if None in (dev, peak, mem) else ir.Device(dev.name, float(peak), int(mem), dev.bandwidth, float(fp8 or 0))
        nodes, gpn = (Unknown(k) if v is None else v for k, v in (("cluster.nodes", nodes), ("cluster.gpus_per_node", gpn)))
        return ir.Cluster(block.name or "cluster", nodes, gpn, device, tuple(links), block.span, efficiency,
                          None if host_memory is None else int(host_memory), float(host_bw or 0.0))

    # -- model --------------------------------------------------------------
    def model(self, block: ast.Block) -> ir.Model | None:
        r = self.r
        f = r.fields(block, KEYS["model"])
        names = tuple(archs.ARCHS)
        default_arch = block.name if block.name in names else None
        arch = r.choice(f, "arch", names, default_arch)
        if arch is None and "arch" not in f.assigns:
            r.diags.append(error("E012", block.name_span or block.kind_span, f"model '{block.name}' has no architecture", f"add `arch = llama` (one of {', '.join(names)}), or name the block after its architecture"))
            return None
        layers = r.int(f, "layers", required=True)
        hidden = r.int(f, "hidden", required=True)
        heads = r.int(f, "heads", required=True)
        vocab = r.int(f, "vocab", required=True)
        seq_len = r.int(f, "seq_len", required=True)
        kv_heads = r.int(f, "kv_heads", heads)
        # hidden / heads unless written (E040 when that is not whole: check.model_shapes)
        head_dim = r.int(f, "head_dim", max(1, hidden // heads) if hidden and heads else None)
        spec = archs.ARCHS.get(arch)
        ffn = r.int(f, "ffn", spec.default_ffn(hidden) if spec and hidden else None)
        norm_eps = r.float(f, "norm_eps", D["model.norm_eps"])
        rope_theta = r.float(f, "rope_theta", D["model.rope_theta"])
        tie = r.bool(f, "tie_embeddings", spec.tie_embeddings if spec else False)
        dropout = r.float(f, "dropout", D["model.dropout"])
        moe = bool(spec and spec.moe)
        for key in MODEL_EXPERT_KEYS:
            if not moe and key in f.assigns:
                r.diags.append(error("E072", f.assigns[key].span, f"'{key}' is an expert option but {arch} is a dense model", "use arch = mixtral for a mixture of experts"))
        # may also come from the plan's experts block; lower_plan checks it is set
        experts = r.int(f, "experts", 0) if moe else 0
        top_k = r.int(f, "top_k", D["model.top_k"]) if moe else 0
        cap = capacity_factor(r, f, D["model.capacity_factor"]) if moe else 0.0
        aux = r.float(f, "aux_loss_weight", D["model.aux_loss_weight"]) if moe else 0.0
        router = (r.choice(f, "router", ROUTERS, D["model.router"]) or D["model.router"]) if moe else ""
        z_loss = r.float(f, "z_loss_weight", D["model.z_loss_weight"]) if moe else 0.0
        # DeepSeek-style: a dense prefix (its MLP dense_ffn wide, ffn if left out) and shared experts
        deepseek = {k: r.int(f, k, D[f"model.{k}"] if k != "dense_ffn" else 0) if moe else 0 for k in ("dense_layers", "dense_ffn", "shared_experts")}
        values = (arch, layers, hidden, heads, kv_heads, ffn, vocab, seq_len, norm_eps, rope_theta, tie, dropout, experts, top_k, cap, aux, router, z_loss)
        if arch is None or any(v is None for v in deepseek.values()):
            return None
        # a key an error left out is unknown, not the model: the rules that read the others run
        keys = [f.name for f in fields(ir.Model)][1 : len(values) + 1]  # of values: the fields after the name
        values = tuple(Unknown(f"model.{k}") if v is None else v for k, v in zip(keys, values))
        head_dim = Unknown("model.head_dim") if head_dim is None else head_dim
        return ir.Model(block.name or arch, *values, block.span, head_dim=head_dim, max_positions=values[keys.index("seq_len")], **deepseek)

    # -- plan ---------------------------------------------------------------
    def plan(self, block: ast.Block) -> ir.Plan:
        return lower_plan(self.r, block, self.resolve)
