"""The view model: every value the templates need, decided here.

The templates under ``templates/`` receive a flat dict of validated identifiers,
numbers, booleans and Python literals, and only loop and branch (after
openapi-python-client and torchgen). Nothing from a plan reaches the output as code:
names are checked against a strict identifier pattern, strings (paths) are emitted
through ``repr`` as literals, and text that lands in comments is escaped so it cannot
end the comment.

A plan that :func:`dslc.check.check_plan` rejects is refused with its errors' messages;
the refusals stated here are the generator's own (what it cannot emit yet), all named at once.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .. import arch, tokenfiles
from ..check import check_plan
from ..cost import loss
from ..cost import memory as mem
from ..cost.flops import peak_flops
from ..cost.memory import expert_capacity, grad_group
from ..front.recompute import EAGER_POLICIES
from ..groups import axes_of, group_mesh, replica_group
from ..ir import Plan
from .errors import Unsupported
from .float8 import float8_view
from .grads import grads_view, kinds, norm_groups, zero_stage
from .health import health_view
from .hf import hf_view
from .launchers import launcher_view
from .literals import comment_safe, identifier, number
from .offload import offload_view
from .package import package
from .pipeline import pipeline_view

DEFAULT_ROOT = Path("generated")
SUPPORTED_AXES = ("dp", "tp", "pp", "cp", "ep")
BUCKET_BYTES = f"{mem.BUCKET_BYTES // 2**20} * 2**20"  # DDP's default bucket size, as dslc explain
_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def view_model(plan: Plan, root: Path = DEFAULT_ROOT) -> dict:
    """Every value the templates need; raises Unsupported for plans it cannot compile."""
    name = identifier(plan.name, "plan name")
    missing = _missing_features(plan)
    if missing:
        raise Unsupported(*missing)
    errors = [d.message for d in check_plan(plan) if d.is_error]
    if errors:
        raise Unsupported(*errors)
    view = {
        "plan_name": name,
        **_stamp(plan, Path(root)),
        **_parallel(plan), **pipeline_view(plan), **_model(plan),
        **_experts(plan), **_context(plan), **_training(plan), **float8_view(plan), **offload_view(plan),
        **_checkpoint(plan),
        **_data(plan, Path(root) / name),
        **hf_view(plan, _script_path(plan.train.init, Path(root) / name) if plan.train.init else None),
        **launcher_view(plan, name, _project_paths(plan, Path(root))[1], bool(_data_files(plan))),
    }
    # schedule.json, the data files and init's checkpoint (unless absolute) are found from the script's folder
    view["needs_script_dir"] = view["pipeline_parallel"] or view["reads_files"] or view["hf_init"]
    view |= health_view(plan, view["param_dtype"], view["multi_node"])
    view["package"] = package(view)
    return view


def _missing_features(plan: Plan) -> list[str]:
    """What an IR made by hand may hold that no plan text can (the front end and
    :mod:`dslc.check` refuse the rest, so that lint accepts what compile accepts): every
    one, so that E100 names them all (an unknown axis or architecture stops the list)."""
    unknown = [f"mesh axis {a.name!r} is unknown" for a in plan.mesh.axes if a.name not in SUPPORTED_AXES and a.size > 1]
    m = plan.model
    if m.arch not in arch.ARCHS:
        unknown.append(f"model architecture {m.arch!r} is unknown")
    if unknown:
        return unknown
    missing = []
    if arch.of(m).moe != m.is_moe:  # the front end sets both; a hand-made IR may not
        kind = "a mixture of experts" if arch.of(m).moe else "dense"
        missing.append(f"arch {m.arch} is {kind}, but the model has experts = {m.experts}")
    return missing


def _project_paths(plan: Plan, root: Path) -> tuple[str, str]:
    """The plan file and the whole ``-o``, relative to the project, the deepest folder
    that holds both; absolute when they share no folder but /."""
    plan_path, out = os.path.abspath(plan.file), os.path.abspath(root)
    base = os.path.commonpath([os.path.dirname(plan_path), out])
    if os.path.dirname(base) == base:  # only the file system's root in common
        return plan_path, out
    return os.path.relpath(plan_path, base), os.path.relpath(out, base)


def _stamp(plan: Plan, root: Path) -> dict:
    """Where the output came from: the plan file and the whole ``-o`` (left out when it is
    the default), relative to the project (:func:`_project_paths`); run there, the
    command writes this folder again."""
    plan_file, out_dir = _project_paths(plan, root)
    command = f"dslc compile {shlex.quote(plan_file)}"
    if Path(out_dir) != DEFAULT_ROOT:
        command += f" -o {shlex.quote(out_dir)}"
    return {
        "plan_file": comment_safe(plan_file),
        "regenerate": comment_safe(command),
        "regenerate_literal": repr(comment_safe(command)),
    }


def _parallel(plan: Plan) -> dict:
    axes = [(a.name, a.size) for a in plan.mesh.axes]
    parallel = [a for a, s in axes if s > 1]
    world, dp, tp = plan.world_size, plan.dp, plan.tp
    grad_axes = grad_group(plan, expert=False)  # () without data parallelism
    zero = zero_stage(plan)
    shard_optimizer = zero >= 1
    sp = bool(plan.tensor_parallel.sequence_parallel) and tp > 1
    # one process group over each parallel axis, and one over the gradients' axes; HSDP:
    # the ZeRO shard group (grad_axes), the replicas and every data rank (the loss); and
    # each group a gradient norm is summed over (normally among them already)
    data_axes, replicas = axes_of(plan.mesh, ("dp", "cp", "ep")), replica_group(plan)
    expert_axes = grad_group(plan, expert=True) if plan.model.is_moe else ()
    norms = [tuple(g.split("+")) for k in kinds(plan) for g in norm_groups(plan, k)]
    group_axes = [(a,) for a in parallel]
    for g in (grad_axes, expert_axes, replicas, data_axes, *norms):
        if g and g not in group_axes:
            group_axes.append(g)
    moe_stats = plan.model.is_moe and len(parallel) > 1  # the router's log: summed over all
    if moe_stats and tuple(parallel) not in group_axes:
        group_axes.append(tuple(parallel))
    # ep ranks take their own rows of the batch, as dp ranks do (dp-major)
    data = tuple(a for a in ("dp", "ep") if plan.mesh.size(a) > 1)
    layout = " x ".join(f"{a}{s}" for a, s in axes if s > 1) or "serial, one process"
    layout += " with sequence parallel" * sp + f", ZeRO-{zero}" * shard_optimizer
    layout += f" sharded over {plan.data_parallel.shard} dp ranks (HSDP)" * bool(replicas)
    layout += f", {plan.context_parallel.method} attention" * (plan.cp > 1)
    nnodes = max(1, world // plan.cluster.gpus_per_node)  # whole nodes (_missing_features)
    return {
        "mesh": repr(tuple(axes)),
        "group_axes": repr(tuple(group_axes)),
        "world_size": world,
        "distributed": world > 1,
        "dp": dp,
        "tp": tp,
        "data_parallel": bool(grad_axes),
        "data_group": "+".join(data_axes),  # the loss's mean: every data rank
        "hsdp": bool(replicas),
        "dp_shard": plan.data_parallel.shard,
        "replica_group": "+".join(replicas),
        "group_mesh": repr(tuple((a.name, a.size) for a in group_mesh(plan).axes)),
        **grads_view(plan),
        "world_group": "+".join(parallel),
        "data_ranks": _data_ranks(plan),
        "loss_ranks": _loss_ranks(plan),
        "splits_rows": bool(data),  # dp (and ep) ranks take their own rows of the batch
        "data_rank": {("ep",): 'COORDS["ep"]', ("dp", "ep"): '(COORDS["dp"] * EP + COORDS["ep"])'}.get(data, 'COORDS["dp"]'),
        "tensor_parallel": tp > 1,
        "sequence_parallel": sp,
        "layout": layout,
        "nnodes": nnodes,
        "multi_node": nnodes > 1,
        "nproc_per_node": world // nnodes,
        "zero_stage": zero,
        "zero3": zero == 3,
        "reshard_after_forward": plan.data_parallel.reshard_after_forward,
        "shard_optimizer": shard_optimizer,
        "column_linear": "ColumnParallelLinear" if tp > 1 else "Linear",
        "row_linear": "RowParallelLinear" if tp > 1 else "Linear",
        "bucket_bytes": BUCKET_BYTES,
    }


def _model(plan: Plan) -> dict:
    m, tp, a = plan.model, plan.tp, arch.of(plan.model)
    rope, per_rank = a.positions == "rope", arch.vocab_per_rank(m, tp)
    return {
        "model_title": a.title,
        "summary": (
            f"{m.arch}, {m.layers} layers, hidden {m.hidden}, {m.heads} heads"
            + (f" of {m.head_dim}" if m.heads * m.head_dim != m.hidden else "")
            + (f" ({m.kv_heads} kv heads)" if m.kv_heads != m.heads else "")
            + f", vocab {m.vocab}, sequence {m.seq_len}"
        ),
        "n_layer": m.layers,
        "n_embd": m.hidden,
        "n_head": m.heads,
        "n_kv_head": m.kv_heads,
        "head_dim": m.head_dim,
        "gqa": m.kv_heads != m.heads,
        "ffn": m.ffn,
        "vocab": m.vocab,
        "vocab_per_rank": per_rank,
        "vocab_padding": per_rank * tp != m.vocab,
        "loss_chunk_rows": loss.chunk_rows(plan), "loss_chunks": loss.chunks(plan),  # dslc.cost.loss
        "seq_len": m.seq_len,
        # learned positions: the table's rows, the model's seq_len (N_POSITIONS when the plan
        # trains at a shorter one, train.seq_len)
        "longer_positions": m.max_positions != m.seq_len and not rope,
        "position_rows": "N_POSITIONS" if m.max_positions != m.seq_len and not rope else "SEQ_LEN",
        "n_positions": m.max_positions,
        "norm_eps": number(m.norm_eps, "norm_eps"),
        "rope": rope,
        # the token embedding without tp, learned positions: an Embedding module
        "plain_embedding": tp == 1 or not rope,
        "rope_theta": number(m.rope_theta, "rope_theta"),
        "rms_norm": a.norm == "RMSNorm",
        "norm": a.norm,
        "swiglu": a.mlp == "swiglu",
        "tie_embeddings": bool(m.tie_embeddings),
        "bias": a.bias,
        "dropout": number(m.dropout, "dropout"),
        "use_dropout": m.dropout > 0,
        "model_flops_per_token": f"{arch.model_flops_per_token(m):_}",
        "peak_flops": number(peak_flops(plan), "device peak FLOP/s"),
        "device_name": comment_safe(plan.cluster.device.name),
    }


def _data_ranks(plan: Plan) -> str:
    """The ranks that split the global batch, as an expression of the script's constants."""
    return "DATA_RANKS" if plan.ep > 1 else "DP"


def _loss_ranks(plan: Plan) -> str:
    """The ranks whose mean losses average to the global batch's: the data ranks, and
    the cp ranks, each of which holds an equal share of every sequence's tokens."""
    return _data_ranks(plan) + " * CP" * (plan.cp > 1)


def _context(plan: Plan) -> dict:
    """Context parallel: how the sequence is split over cp and how attention sees it whole."""
    cp, c = plan.cp, plan.context_parallel
    ring = cp > 1 and c.method == "ring"
    return {
        "context_parallel": cp > 1,
        "cp": cp,
        "ring": ring,  # otherwise Ulysses
        # ring: 2·cp chunks, rank r holding r and 2·cp − 1 − r (every rank the same causal work)
        "load_balance": ring and c.load_balance,
    }


def _experts(plan: Plan) -> dict:
    """The mixture of experts: routing, capacity and the router losses (none when dense)."""
    m, ep = plan.model, plan.ep
    if not m.is_moe:
        return {"moe": False, "ep": 1, "expert_parallel": False, "dense_layers": 0, "shared_experts": 0}
    cf, capacity = m.capacity_factor, expert_capacity(plan) or 0
    return {
        "moe": True,
        # DeepSeek-style: a dense prefix of blocks (their MLP dense_ffn wide), shared experts
        "dense_layers": m.dense_layers,
        "dense_ffn": m.dense_ffn,
        "moe_layers": "MOE_LAYERS" if m.dense_layers else "N_LAYER",  # the blocks that route
        "shared_experts": m.shared_experts,
        "ep": ep,
        "expert_parallel": ep > 1,
        "n_experts": m.experts,
        "top_k": m.top_k,
        "router": m.router,
        "capacity": capacity,
        "capacity_factor": number(cf, "capacity_factor"),
        "aux_loss_weight": number(m.aux_loss_weight, "aux_loss_weight"),
        "z_loss": m.z_loss_weight > 0,
        "router_losses": ["aux", "z"] if m.z_loss_weight > 0 else ["aux"],  # what ROUTING sums
        "z_loss_weight": number(m.z_loss_weight, "z_loss_weight"),
    }


def _training(plan: Plan) -> dict:
    t, o, s = plan.train, plan.train.optimizer, plan.train.lr_schedule
    decays = s.name != "constant"
    scaling = t.precision == "fp16" and t.loss_scale == "dynamic"
    warmup = f" with {s.warmup} warmup step{'s' * (s.warmup > 1)}" if s.warmup else ""
    return {
        "steps": t.steps,
        "micro_batch": t.micro_batch,
        "micro_steps": plan.microbatches,
        "global_batch": t.global_batch,
        "precision": t.precision,
        "mixed": t.precision in _DTYPES,
        "param_dtype": _DTYPES.get(t.precision, "torch.float32"),
        "loss_scaling": scaling,
        # what each micro-batch's loss is multiplied by before backward
        "loss_grad_scale": f"{'scaler.scale' if scaling else '1.0'} / (MICRO_STEPS * {_loss_ranks(plan)})",
        # the router losses' (MoE): cp ranks' losses add up to their sequences', not average
        "router_grad_scale": f"{'scaler.scale' if scaling else '1.0'} / (MICRO_STEPS * {_data_ranks(plan)})",
        "recompute": t.recompute,
        "recomputes": t.recompute != "none",
        "recompute_every": t.recompute_every,  # full every N: blocks N-1, 2N-1, ... only
        "compile": repr(t.compile),  # None: on CUDA only
        "compilable": t.recompute not in EAGER_POLICIES,
        "reruns_blocks": t.recompute in ("selective_ops", "full"),  # backward re-runs a block's forward
        "seed": t.seed,
        "grad_clip": number(t.grad_clip, "grad_clip"),
        "clip": t.grad_clip > 0,
        "optimizer": o.name,
        "optimizer_title": f"{o.name}, {s.name} learning rate{warmup}",
        "lr": number(o.lr, "lr"),
        "betas": "(" + ", ".join(number(float(b), "betas") for b in o.betas) + ")",
        "eps": number(o.eps, "eps"),
        "momentum": number(o.momentum, "momentum"),
        "weight_decay": number(o.weight_decay, "weight_decay"),
        "lr_schedule": s.name,
        "warmup": s.warmup,
        "has_warmup": s.warmup > 0,
        "decays": decays,
        "warmup_constant": s.warmup > 0 or decays,  # get_lr reads WARMUP
        "min_lr": number(s.min_lr, "min_lr"),
        "decay_steps": s.decay_steps,
        "timeout": number(t.timeout, "timeout"),
    }


# what the optimizer keeps per parameter, besides the step
_MOMENTS = {"adamw": ("exp_avg", "exp_avg_sq"), "adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


def _checkpoint(plan: Plan) -> dict:
    """The checkpoint's settings, and the fingerprint a checkpoint carries: what must
    match for another run to resume from it (every layout of the same model and data)."""
    ck, m, t = plan.train.checkpoint, plan.model, plan.train
    model = {k: getattr(m, k) for k in ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "max_positions", "ffn", "vocab", "norm_eps", "rope_theta", "tie_embeddings", "experts", "top_k", "router")}
    model |= {k: getattr(m, k) for k in ("dense_layers", "dense_ffn", "shared_experts") if m.dense_layers or m.shared_experts}
    sources = [[w, s.kind, os.path.basename(s.path)] for w, s in (t.data.parts or ((1.0, t.data),)) if s.path]
    data = {"sources": sources or "synthetic", "seq_len": m.seq_len, "global_batch": t.global_batch}
    if not sources:
        data["seed"] = t.seed  # the random tokens are drawn from it
    moments = _MOMENTS[t.optimizer.name] if t.optimizer.name != "sgd" or t.optimizer.momentum else ()
    return {
        "checkpoint": ck is not None,
        "checkpoint_every": ck.every if ck else 0,
        "checkpoint_dir": repr(ck.dir) if ck else "None",
        "checkpoint_keep": ck.keep if ck else 0,
        "checkpoint_async": bool(ck and ck.async_save),
        "max_restarts": ck.max_restarts if ck else 0,
        "moments": list(moments),
        "fingerprint": repr({"model": model, "data": data}),
    }


def _data(plan: Plan, out_dir: Path) -> dict:
    """The training data's sources and the validation's, as (weight, format, path
    literal, raw id type) rows, each path below the folder that holds them all
    (``data_root``: relative to the generated script unless a file's path is absolute, so
    the output moves with the repository; ``--data-root`` reads that folder elsewhere, as
    a pod reads its data volume)."""
    d, m, ev = plan.train.data, plan.model, plan.train.eval
    files = _data_files(plan)
    root = os.path.commonpath([os.path.dirname(f) for f in files.values()]) if files else ""

    def sources(data) -> list[tuple[str, str, str, str]]:
        parts = data.parts or (((1.0, data),) if data.files else ())
        return [(number(w, "weight"), s.kind, repr(os.path.relpath(files[s.path], root)), s.raw_dtype(m.vocab) if s.kind == "tokens" else "uint8") for w, s in parts]

    train = sources(d)
    evals = sources(ev.data) if ev else []
    absolute = any(os.path.isabs(p) for p in files)
    return {
        "data_file": bool(train),
        "reads_files": bool(train or evals),  # the data section, mmap, a folder to look in
        "data_root": repr(root if absolute else os.path.relpath(root, os.path.abspath(out_dir))) if files else None,
        "token_files": any(s[1] == "tokens" for s in train + evals),  # the formats' readers
        "data_blend": d.kind == "blend",
        "data_sources": train,
        "eval": ev is not None,
        "eval_every": ev.every if ev else 0,
        "eval_batches": ev.batches if ev else 0,
        "eval_sources": evals,
        # the formats' constants, as lint reads them (dslc/tokenfiles.py)
        "llmc": "{" + ", ".join(f"{magic}: ({version}, torch.{ids})" for magic, (version, ids) in tokenfiles.LLMC.items()) + "}",
        "llmc_header": tokenfiles.LLMC_HEADER,
        "megatron_magic": repr(tokenfiles.MEGATRON_MAGIC),
        "megatron_header": tokenfiles.MEGATRON_FIXED,
        "megatron_dtypes": "{" + ", ".join(f"{code}: torch.{t}" for code, t in tokenfiles.MEGATRON_DTYPES.items()) + "}",
        "halves_scan": f"2**{tokenfiles.HALVES_SCAN.bit_length() - 1}",
    }


def _data_files(plan: Plan) -> dict[str, str]:
    """{path as the plan writes it: the file on this machine, absolute} for every data file
    the script reads (training and validation)."""
    ev = plan.train.eval
    sources = plan.train.data.files + (ev.data.files if ev else ())
    return {s.path: _here(s) for s in sources}


def _here(source) -> str:
    """A file a plan names (data, init), absolute, where it is on this machine (a relative
    path from the plan's folder)."""
    return os.path.normpath(source.path if os.path.isabs(source.path) else os.path.abspath(source.resolved_path or source.path))


def _script_path(d, out_dir: Path) -> str:
    return d.path if os.path.isabs(d.path) else os.path.relpath(_here(d), os.path.abspath(out_dir))
