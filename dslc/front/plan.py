"""Lowering of one ``plan`` block: mesh, parallel options and training.

Defaults are made explicit here (see docs/language.md for the table).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace

from .. import arch as archs
from .. import ir
from ..diagnostics import error
from ..source import Span
from ..unknown import Unknown, known
from . import ast
from .defaults import BOUNDS, MAX_BLEND, MAX_RANKS, ROUTERS
from .defaults import DEFAULTS as D
from .keys import BLOCKS, EXPERT_KEYS, KEYS, MODEL_KEY
from .recompute import recompute_policy
from .schema import Fields, Reader, as_float, shown

# resolve(kind, fields, spans): the plan's model or cluster, by reference or inline
Resolve = Callable[[str, Fields, dict[str, Span]], object]


def microbatches_of(global_batch: int, micro_batch: int, data_ranks: int) -> int:
    """The micro-batches a step runs when the plan does not write them: derived from the
    global batch (E080 says when it does not divide)."""
    return max(1, global_batch // (micro_batch * data_ranks))


def lower_plan(r: Reader, block: ast.Block, resolve: Resolve) -> ir.Plan:
    """The plan of ``block``: whole, or partial where an error left a part unknown
    (``unknown.Unknown`` in its place: lint checks what does not read it, nothing compiles it)."""
    spans: dict[str, Span] = {}
    f = r.fields(block, KEYS["plan"], blocks=BLOCKS["plan"])
    for kind in ("model", "cluster"):
        r.single(f, kind)  # diagnoses a second inline block
    model = resolve("model", f, spans)
    cluster = resolve("cluster", f, spans)

    def sub(kind: str, axes=False) -> Fields:
        b = r.single(f, kind)
        if b is None:
            return Fields(ast.Block(kind, block.span, None, None, (), block.span))
        spans[kind] = b.kind_span
        if b.name is not None and kind not in ("optimizer", "lr_schedule"):
            r.diags.append(error("E013", b.name_span, f"a {kind} block takes no name", f"write `{kind} {{ … }}`"))
        sf = r.fields(b, KEYS[kind], BLOCKS.get(kind, ()), axes=axes)
        for key, a in sf.assigns.items():
            spans[f"{kind}.{key}"] = a.span
        return sf

    mesh = _mesh(r, sub("mesh", axes=True), cluster, spans)

    tpf = sub("tensor_parallel")
    tp = ir.TensorParallel(r.bool(tpf, "sequence_parallel", D["tensor_parallel.sequence_parallel"]), spans.get("tensor_parallel"))

    dpf = sub("data_parallel")
    dp = ir.DataParallel(r.int(dpf, "zero", D["data_parallel.zero"]), spans.get("data_parallel"),
                         r.bool(dpf, "reshard_after_forward", D["data_parallel.reshard_after_forward"]),
                         r.int(dpf, "shard", 0))  # 0: every dp rank (the docs' default `dp`)

    cpf = sub("context_parallel")
    cp = ir.ContextParallel(r.choice(cpf, "method", ir.CP_METHODS, D["context_parallel.method"]) or D["context_parallel.method"], r.bool(cpf, "load_balance", D["context_parallel.load_balance"]), spans.get("context_parallel"))

    # experts { } sets a mixtral model's expert options for this plan
    ef = sub("experts")
    if ef.assigns and model is not None:
        if not archs.of(model).moe:
            r.diags.append(error("E072", spans["experts"], f"an experts block needs a mixture-of-experts model, but {model.arch} is dense", "use arch = mixtral"))
        else:
            for key in EXPERT_KEYS:
                if key in ef.assigns and f"model.{MODEL_KEY.get(key, key)}" in spans:
                    r.diags.append(error("E011", ef.assigns[key].key_span, f"'{key}' is set both in the model and in the experts block"))
            model = replace(
                model,
                experts=r.int(ef, "count", model.experts),
                top_k=r.int(ef, "top_k", model.top_k),
                capacity_factor=capacity_factor(r, ef, model.capacity_factor),
                aux_loss_weight=r.float(ef, "aux_loss_weight", model.aux_loss_weight),
                router=r.choice(ef, "router", ROUTERS, model.router) or model.router,
                z_loss_weight=r.float(ef, "z_loss_weight", model.z_loss_weight),
                dense_layers=r.int(ef, "dense_layers", model.dense_layers),
                dense_ffn=r.int(ef, "dense_ffn", model.dense_ffn),
                shared_experts=r.int(ef, "shared", model.shared_experts),
            )
            spans.update({"model.experts": spans.get("experts.count", spans["experts"]), "model.top_k": spans.get("experts.top_k", spans["experts"])})
            spans.update({f"model.{MODEL_KEY.get(key, key)}": spans[f"experts.{key}"] for key in EXPERT_KEYS if key not in ("count", "top_k") and f"experts.{key}" in spans})

    if model is not None and archs.of(model).moe and model.experts == 0:
        r.diags.append(error("E012", spans.get("model", block.span), "a mixtral model needs its number of experts", "set `experts = 8` in the model, or `experts { count = 8 }` in the plan"))
        model = None

    tf = sub("train")
    ppf = sub("pipeline")
    micro_batch = r.int(tf, "micro_batch", D["train.micro_batch"])
    global_batch = r.int(tf, "global_batch", None)
    microbatches = r.int(ppf, "microbatches", None)
    if mesh is None:  # dp × ep unknown, and so what is derived from them
        microbatches = Unknown("pipeline.microbatches") if microbatches is None else microbatches
        global_batch = Unknown("train.global_batch") if global_batch is None else global_batch
    else:
        data_ranks = mesh.size("dp") * mesh.size("ep")
        if microbatches is None:
            microbatches = microbatches_of(global_batch, micro_batch, data_ranks) if global_batch else 1
        if global_batch is None:
            global_batch = micro_batch * microbatches * data_ranks
    layers_per_stage = _int_list(r, ppf, "layers_per_stage")
    schedule = r.choice(ppf, "schedule", ir.SCHEDULES, D["pipeline.schedule"]) or D["pipeline.schedule"]
    pipeline = ir.Pipeline(
        schedule,  # a V schedule implies its two chunks per rank
        r.int(ppf, "virtual_stages", 2 if schedule in ir.V_SHAPED else D["pipeline.virtual_stages"]),
        microbatches,
        layers_per_stage,
        spans.get("pipeline"),
    )

    train = _train(r, tf, block, cluster, micro_batch, global_batch, spans)
    model = _stage_seq_len(r, tf, model, spans)

    model, cluster, mesh, train = (Unknown(k) if v is None else v for k, v in (("model", model), ("cluster", cluster), ("mesh", mesh), ("train", train)))
    return ir.Plan(block.name, block.span.file, model, cluster, mesh, tp, dp, pipeline, cp, train, block.span, spans)


def _stage_seq_len(r: Reader, f: Fields, model: ir.Model | None, spans: dict[str, Span]) -> ir.Model | None:
    """``train { seq_len = N }``: this plan trains the model at N tokens a sequence (Llama 3
    trains at 8K, then at 128K). Everything after lowering reads ``model.seq_len``, so the
    plan's model is N long; a learned position table keeps the model's rows (N at most:
    E066, dslc.check), rotary positions have none."""
    seq_len = r.int(f, "seq_len", None)
    if seq_len is None or model is None:
        return model
    spans["model.seq_len"] = spans["train.seq_len"]  # checks of seq_len point at the override
    learned = archs.of(model).positions == "learned"
    return replace(model, seq_len=seq_len, max_positions=model.max_positions if learned else seq_len)


def capacity_factor(r: Reader, f: Fields, default: float) -> float | None:
    """``capacity_factor`` of a model or experts block. Left out, it is ``default`` (0.0 in
    the IR: dropless); written, it must be above 0 (E074): each expert takes at most
    ceil(capacity_factor · top_k · tokens / experts) tokens, so 0 would take none."""
    a = f.assigns.get("capacity_factor")
    if a is not None and isinstance(a.value, ast.Number) and as_float(a.value.value) <= 0:
        r.diags.append(error("E074", a.value.span, f"capacity_factor must be above 0, got {shown(a.value.value)}: an expert takes at most ceil(capacity_factor · top_k · tokens / experts) tokens, so it would take none",
                             "leave capacity_factor out for dropless routing"))
        return default
    return r.float(f, "capacity_factor", default)


def _int_list(r, f: Fields, key: str) -> tuple[int, ...] | None:
    a = f.assigns.get(key)
    if a is None:
        return None
    items = a.value.items if isinstance(a.value, (ast.List, ast.Tuple)) else None
    if items is None or not all(isinstance(i, ast.Number) and isinstance(i.value, int) for i in items):
        r.wrong(a, "a list of whole numbers such as [8, 8, 8, 8]")
        return None
    return tuple(i.value for i in items)


def _mesh(r: Reader, f: Fields, cluster: ir.Cluster | None, spans: dict[str, Span]) -> ir.Mesh | None:
    axes: list[ir.MeshAxis] = []
    ok = True
    written = list(f.axes)
    unplaced = set()  # `tp = 4` or `tp = 4 nvlink`: the link is missing (E036), the size is known
    for a in f.assigns.values():
        link = a.value.unit if isinstance(a.value, ast.Quantity) else "<link>"
        r.diags.append(error("E036", a.span, f"mesh axis '{a.key}' is not placed on a link", f"write `{a.key} = {getattr(a.value, 'value', 'N')} on {link}`"))
        size = ast.Number(a.value.value, str(a.value.value), a.value.span) if isinstance(a.value, ast.Quantity) else a.value
        unplaced.add(a.span)
        written.append(ast.Axis(a.key, a.key_span, size, "", a.span, a.span))
    for ax in sorted(written, key=lambda x: (x.span.line, x.span.col)):  # as written: the order is the mesh's
        if ax.name not in ir.AXES:
            r.diags.append(r.unknown("E033", f"unknown mesh axis '{ax.name}'", ax.name, ir.AXES, ax.name_span))
            ok = False
            continue
        if any(x.name == ax.name for x in axes):
            first = next(x for x in axes if x.name == ax.name)
            r.diags.append(error("E032", ax.name_span, f"mesh axis '{ax.name}' is given twice", f"first given at {first.span}"))
            ok = False
            continue
        size = ax.size.value if isinstance(ax.size, ast.Number) else None
        if not isinstance(size, int):
            r.diags.append(error("E013", ax.size.span, f"the size of axis '{ax.name}' must be a whole number"))
            ok = False
            continue
        if not 1 <= size <= BOUNDS["mesh.size"][1]:
            want = "positive" if size < 1 else f"at most {BOUNDS['mesh.size'][1]}"
            r.diags.append(error("E015", ax.size.span, f"the size of axis '{ax.name}' must be {want}, got {shown(size)}"))
            ok = False
            continue
        if cluster is not None and ax.span not in unplaced and cluster.link(ax.link) is None:
            names = [lk.name for lk in cluster.links]
            d = r.unknown("E031", f"axis '{ax.name}' is placed on '{ax.link}', which cluster '{cluster.name}' does not define", ax.link, names, ax.link_span)
            r.diags.append(d)  # the mesh is still sound: later checks run
        spans[f"mesh.{ax.name}"] = ax.span
        axes.append(ir.MeshAxis(ax.name, size, ax.link, ax.span))  # an unplaced axis's link is "", no link's name
    mesh = ir.Mesh(tuple(axes), spans.get("mesh", f.block.span)) if ok else None
    if mesh is not None and mesh.world_size > MAX_RANKS:
        desc = " × ".join(f"{a.name}={a.size}" for a in axes)
        r.diags.append(error("E037", mesh.span, f"mesh has {mesh.world_size} ranks ({desc}), more than the {MAX_RANKS} dslc plans for", "see the limits in docs/language.md"))
        return None
    return mesh


def _train(r: Reader, f: Fields, plan_block, cluster, micro_batch, global_batch, spans) -> ir.Train | None:
    steps = r.int(f, "steps", D["train.steps"])
    device = cluster.device if cluster is not None else None
    default_precision = ("fp32" if device.name == "cpu" else "bf16") if device is not None and known(device) else Unknown("train.precision")
    precision = r.choice(f, "precision", ir.PRECISIONS, None) or default_precision
    recompute, recompute_every = recompute_policy(r, f)
    grad_clip = r.float(f, "grad_clip", D["train.grad_clip"])
    seed = r.int(f, "seed", D["train.seed"])
    loss_scale = r.choice(f, "loss_scale", ir.LOSS_SCALES, D["train.loss_scale"]) or D["train.loss_scale"]

    opt_block = r.single(f, "optimizer")
    if opt_block is not None:
        spans["train.optimizer"] = opt_block.kind_span
        of = r.fields(opt_block, KEYS["optimizer"])
        name = opt_block.name or D["train.optimizer"]
        if name not in ir.OPTIMIZERS:
            r.diags.append(r.unknown("E019", f"unknown optimizer '{name}'", name, ir.OPTIMIZERS, opt_block.name_span))
            name = D["train.optimizer"]
    else:
        of, name = None, D["train.optimizer"]
    get = (lambda fn, key, default, **kw: fn(of, key, default, **kw)) if of else (lambda fn, key, default, **kw: default)
    lr = get(r.float, "lr", D["optimizer.lr"])
    betas = _betas(r, of) if of else D["optimizer.betas"]
    optimizer = ir.Optimizer(name, lr, betas, get(r.float, "eps", D["optimizer.eps"]), get(r.float, "weight_decay", D["optimizer.weight_decay"]), get(r.float, "momentum", D["optimizer.momentum"]), spans.get("train.optimizer"))

    sched_block = r.single(f, "lr_schedule")
    sname, sf = D["train.lr_schedule"], None
    if sched_block is not None:
        spans["train.lr_schedule"] = sched_block.kind_span
        sf = r.fields(sched_block, KEYS["lr_schedule"])
        sname = sched_block.name or D["train.lr_schedule"]
        if sname not in ir.LR_SCHEDULES:
            r.diags.append(r.unknown("E019", f"unknown lr schedule '{sname}'", sname, ir.LR_SCHEDULES, sched_block.name_span))
            sname = D["train.lr_schedule"]
    sget = (lambda fn, key, default, **kw: fn(sf, key, default, **kw)) if sf else (lambda fn, key, default, **kw: default)
    lr_schedule = ir.LRSchedule(sname, sget(r.int, "warmup", D["lr_schedule.warmup"]), sget(r.float, "min_lr", _tenth(lr or D["optimizer.lr"])), sget(r.int, "decay_steps", steps or D["train.steps"]), spans.get("train.lr_schedule"))

    data = _data(r, f, plan_block)

    ck_block = r.single(f, "checkpoint")
    checkpoint = None
    if ck_block is not None:
        spans["train.checkpoint"] = ck_block.kind_span
        cf = r.fields(ck_block, KEYS["checkpoint"])
        every, cdir = r.int(cf, "every", required=True), r.string(cf, "dir", required=True)
        if every is not None and cdir is not None:
            keep, restarts = r.int(cf, "keep", 0), r.int(cf, "max_restarts", 0)
            checkpoint = ir.Checkpoint(every, cdir, ck_block.span, keep, r.bool(cf, "async", False), restarts)
            spans["checkpoint.dir"] = cf.assigns["dir"].value.span
    evaluation = _eval(r, f, plan_block, spans)
    offload = _offload(r, f, spans)
    if None in (steps, grad_clip, seed, lr, micro_batch):
        return None
    if "eval" in f.blocks and evaluation is None:  # an error in it: unknown, as a bad data source
        evaluation = Unknown("train.eval")
    timeout = r.quantity(f, "timeout", "time", D["train.timeout"])
    return ir.Train(steps, micro_batch, global_batch, precision, recompute, grad_clip, seed, loss_scale, optimizer, lr_schedule, Unknown("train.data") if data is None else data, checkpoint, spans.get("train"), evaluation, timeout, _init(r, f, plan_block),
                    recompute_every=recompute_every, compile=r.bool(f, "compile"), float8=r.choice(f, "float8", ir.FLOAT8, None), offload=offload)


def _offload(r: Reader, f: Fields, spans) -> ir.Offload | None:
    """``offload { optimizer = true; activations = true }``: None without the block."""
    block = r.single(f, "offload")
    if block is None:
        return None
    spans["train.offload"] = block.kind_span
    of = r.fields(block, KEYS["offload"])
    spans.update((f"offload.{key}", a.span) for key, a in of.assigns.items())
    return ir.Offload(bool(r.bool(of, "optimizer", False)), bool(r.bool(of, "activations", False)), block.span)


def _init(r, f: Fields, plan_block) -> ir.Init | None:
    """``init = hf("DIR")``: a Hugging Face checkpoint folder, relative to the plan file."""
    a = f.assigns.get("init")
    if a is None:
        return None
    v = a.value
    if not (isinstance(v, ast.Call) and v.name == "hf" and len(v.args) == 1 and isinstance(v.args[0], ast.String) and not v.keywords):
        r.diags.append(error("E013", v.span, 'init takes a Hugging Face checkpoint folder, such as hf("checkpoints/llama")', "leave init out to draw the weights from the seed"))
        return None
    base = os.path.dirname(plan_block.span.file) if not plan_block.span.file.startswith("<") else ""
    path = v.args[0].value
    return ir.Init("hf", path, os.path.normpath(os.path.join(base, path)), v.span)


def _betas(r, of: Fields) -> tuple[float, float]:
    a = of.assigns.get("betas")
    if a is None:
        return D["optimizer.betas"]
    items = a.value.items if isinstance(a.value, ast.Tuple) else ()
    if len(items) != 2 or not all(isinstance(i, ast.Number) for i in items):
        r.wrong(a, "a pair of numbers such as (0.9, 0.95)")
        return D["optimizer.betas"]
    b1, b2 = (as_float(i.value) for i in items)
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        r.diags.append(error("E015", a.value.span, f"betas must each be in [0, 1), got ({b1:g}, {b2:g})"))
    return (b1, b2)


def _data(r, f: Fields, plan_block) -> ir.Data | None:
    a = f.assigns.get("data")
    if a is None:
        return ir.Data(D["train.data"], None, None, None)
    v = a.value
    if isinstance(v, ast.Ident) and v.name == "synthetic":
        return ir.Data("synthetic", None, None, a.span)
    base = os.path.dirname(plan_block.span.file) if not plan_block.span.file.startswith("<") else ""
    if isinstance(v, ast.Call) and v.name in ("text", "tokens"):
        return _file(r, v, base)
    if isinstance(v, ast.Call) and v.name == "blend":
        return _blend(r, v, base)
    word = v.name if isinstance(v, (ast.Ident, ast.Call)) else None
    if word:
        r.diags.append(r.unknown("E019", f"unknown data source '{word}'", word, ir.DATA_KINDS, v.span))
    else:
        r.wrong(a, _DATA_FORMS)
    return None


_DATA_FORMS = 'synthetic, text("file.txt"), tokens("file.bin") or blend(0.7, tokens("a.bin"), 0.3, tokens("b.bin"))'


def _file(r, v: ast.Call, base: str) -> ir.Data | None:
    """``text("f.txt")`` or ``tokens("f.bin")``, with ``dtype = uint32`` for a raw tokens file."""
    if len(v.args) != 1 or not isinstance(v.args[0], ast.String):
        r.diags.append(error("E013", v.span, f'{v.name}(…) takes one path in quotes, such as {v.name}("{"train.txt" if v.name == "text" else "train.bin"}")'))
        return None
    dtype, ok = None, True
    for kw in v.keywords:
        if kw.key != "dtype" or v.name == "text":
            r.diags.append(r.unknown("E010", f"unknown argument '{kw.key}' of {v.name}(…)", kw.key, ("dtype",) if v.name == "tokens" else (), kw.key_span))
            ok = False
        elif not isinstance(kw.value, ast.Ident) or kw.value.name not in ir.TOKEN_DTYPES:
            word = kw.value.name if isinstance(kw.value, ast.Ident) else "that"
            r.diags.append(r.unknown("E019", f"'{word}' is not a token id type", word, ir.TOKEN_DTYPES, kw.value.span))
            ok = False
        else:
            dtype = kw.value.name
    path = v.args[0].value
    return ir.Data(v.name, path, os.path.normpath(os.path.join(base, path)), v.span, dtype) if ok else None


def _blend(r, v: ast.Call, base: str) -> ir.Data | None:
    """``blend(w1, source1, w2, source2, …)``, as Megatron's ``--data-path 0.7 a 0.3 b``:
    each weight above 0, scaled to sum to 1; each source a text or tokens file."""
    pairs = list(zip(v.args[::2], v.args[1::2]))
    shape_ok = len(v.args) >= 2 and len(v.args) % 2 == 0 and not v.keywords
    if not shape_ok or not all(isinstance(w, ast.Number) and isinstance(d, ast.Call) and d.name in ("text", "tokens") for w, d in pairs):
        r.diags.append(error("E013", v.span, "blend(…) takes pairs of a weight and a file source, such as blend(0.7, tokens(\"a.bin\"), 0.3, tokens(\"b.bin\"))"))
        return None
    if len(pairs) > MAX_BLEND:
        r.diags.append(error("E015", v.span, f"a blend may have at most {MAX_BLEND} sources, got {len(pairs)}", "see the limits in docs/language.md"))
        return None
    parts, ok = [], True
    for w, d in pairs:
        weight = as_float(w.value)
        if not (weight > 0 and math.isfinite(weight)):
            r.diags.append(error("E015", w.span, f"a blend's weight must be a finite number above 0, got {shown(w.value)}", "leave the source out instead"))
            ok = False
        source = _file(r, d, base)
        ok = ok and source is not None
        parts.append((weight, source))
    if not ok:
        return None
    big = max(w for w, _ in parts)  # scaled by the largest first: a sum that cannot overflow
    total = sum(w / big for w, _ in parts)
    return ir.Data("blend", None, None, v.span, parts=tuple((w / big / total, d) for w, d in parts))


def _eval(r, f: Fields, plan_block, spans) -> ir.Eval | None:
    """``eval { every = N; batches = K; data = … }``: the validation loss."""
    b = r.single(f, "eval")
    if b is None:
        return None
    spans["train.eval"] = b.kind_span
    ef = r.fields(b, KEYS["eval"])
    every, batches = r.int(ef, "every", D["eval.every"]), r.int(ef, "batches", D["eval.batches"])
    if "data" not in ef.assigns:
        r._missing(ef, "data")
        return None
    data = _data(r, ef, plan_block)
    if None in (every, batches, data):
        return None
    return ir.Eval(every, batches, data, b.span)


def _tenth(lr: float) -> float:
    """The default min_lr, lr / 10, as a person would write it (3e-4 for lr = 3e-3, not
    the 3.0000000000000003e-4 that binary floating point gives): 15 significant digits."""
    return float(f"{lr / 10:.15g}")
