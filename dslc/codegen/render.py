"""Code generation: IR → view model → Jinja → black → ``generated/<plan>/``.

Every decision is made here, in :func:`view_model`: the templates under
``templates/`` receive a flat dict of validated identifiers, numbers, booleans
and Python literals, and only loop and branch (after openapi-python-client and
torchgen). Nothing from a plan reaches the output as code: names are checked
against a strict identifier pattern, strings (paths) are emitted through
``repr`` as literals, and text that lands in comments is escaped so it cannot
end the comment.

API for the CLI: :func:`render` (plan → ``{relative path: text}``), :func:`write`
(atomic: a temporary directory renamed into place, so a failure leaves the
previous output intact), :func:`stale` (for ``dslc compile --check``). A plan
the generator cannot compile raises :class:`Unsupported`; output that cannot be
written raises :class:`CodegenError` (its base class). Messages fit on one line.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import black
import jinja2

from ..ir import Plan
from ..resources import resource_dir
from .pipeline import pipeline_view

DEFAULT_ROOT = Path("generated")
FILES = ("train.py", "launch.sh")
SUPPORTED_AXES = ("dp", "tp", "pp")
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket size
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_NOT_YET = {
    "cp": "context parallel (cp) is not supported by the code generator yet",
    "ep": "expert parallel (ep) is not supported by the code generator yet",
}


class CodegenError(Exception):
    """Output that cannot be written, or an internal error; the message is one line."""


class Unsupported(CodegenError):
    """A valid plan that the generator cannot compile (yet); the message names why."""


# -- public API ---------------------------------------------------------------


def render(plan: Plan, root: Path = DEFAULT_ROOT) -> dict[str, str]:
    """The files of ``plan``'s output directory ``root/<plan>/``, by relative path.

    ``root`` only matters for the paths written into the files (the data file,
    relative to the generated script, and the stamp's regenerate command)."""
    view = view_model(plan, Path(root))
    env = _environment()
    out = {}
    for name in FILES:
        text = env.get_template(f"{name}.jinja").render(**view)
        out[name] = _format_python(text, name) if name.endswith(".py") else text
    return out


def write(plan: Plan, root: Path = DEFAULT_ROOT) -> Path:
    """Render ``plan`` and replace ``root/<plan>/`` with the result, atomically."""
    files = render(plan, root)  # a plan that cannot be rendered touches nothing
    root = Path(root)
    target = root / plan.name
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{plan.name}.", dir=root))
    except OSError as e:
        raise CodegenError(f"cannot write to {root}: {e.strerror or e}") from None
    old = None
    try:
        for name, text in files.items():
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755 if name.endswith(".sh") else 0o644)
        tmp.chmod(0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{plan.name}.old.", dir=root))
            target.rename(old / plan.name)
        tmp.rename(target)
    except OSError as e:
        if old is not None and not target.exists():
            (old / plan.name).rename(target)  # put the previous output back
        shutil.rmtree(tmp, ignore_errors=True)
        raise CodegenError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def stale(plan: Plan, root: Path = DEFAULT_ROOT) -> list[str]:
    """Paths under ``root/<plan>/`` that are missing or differ from a fresh render."""
    target = Path(root) / plan.name
    out = []
    for name, text in render(plan, root).items():
        path = target / name
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            out.append(str(path))
    return out


# -- the view model -----------------------------------------------------------


def view_model(plan: Plan, root: Path = DEFAULT_ROOT) -> dict:
    """Every value the templates need; raises CodegenError for unsupported plans."""
    name = _identifier(plan.name, "plan name")
    view = {"plan_name": name}
    view.update(_stamp(plan, root))
    view.update(_parallel(plan))
    view.update(pipeline_view(plan, Unsupported))
    view.update(_model(plan, view["tp"]))
    view.update(_training(plan))
    view.update(_data(plan, root / name))
    if view["use_dropout"] and view["tp"] > 1:
        raise Unsupported(
            f"dropout = {plan.model.dropout} with tp = {view['tp']} is not supported "
            "(tp ranks would need a shared dropout RNG); set dropout = 0"
        )
    return view


def _stamp(plan: Plan, root: Path) -> dict:
    """Where the output came from, relative to the project (the output root's parent)."""
    base = Path(os.path.abspath(root)).parent
    plan_file = os.path.relpath(os.path.abspath(plan.file), base)
    command = f"dslc compile {shlex.quote(plan_file)}"
    if Path(root).name != DEFAULT_ROOT.name:
        command += f" -o {shlex.quote(Path(root).name)}"
    return {"plan_file": _comment_safe(plan_file), "regenerate": _comment_safe(command)}


def _parallel(plan: Plan) -> dict:
    axes = [(a.name, a.size) for a in plan.mesh.axes]
    for axis, size in axes:
        if axis not in SUPPORTED_AXES and size > 1:
            raise Unsupported(
                _NOT_YET.get(axis, f"mesh axis {axis!r} is unknown")
            )
    if plan.data_parallel.zero > 1:
        raise Unsupported(
            f"ZeRO stage {plan.data_parallel.zero} is not supported by the code "
            "generator yet (stages 0 and 1 are)"
        )
    world = plan.world_size
    dp, tp = plan.dp, plan.tp
    zero = plan.data_parallel.zero == 1 and dp > 1
    sp = bool(plan.tensor_parallel.sequence_parallel) and tp > 1
    parts = [f"{a}{s}" for a, s in axes if s > 1]
    layout = " x ".join(parts) if parts else "serial, one process"
    if sp:
        layout += " with sequence parallel"
    if zero:
        layout += ", ZeRO-1"
    gpn = plan.cluster.gpus_per_node
    if world <= gpn:
        nnodes, nproc = 1, world
    elif world % gpn == 0:
        nnodes, nproc = world // gpn, gpn
    else:
        raise Unsupported(
            f"{world} ranks do not fill whole nodes of {gpn} GPUs "
            f"(cluster {plan.cluster.name})"
        )
    return {
        "mesh": repr(tuple((a, s) for a, s in axes)),
        "parallel_axes": [a for a, s in axes if s > 1],
        "world_size": world,
        "distributed": world > 1,
        "dp": dp,
        "tp": tp,
        "data_parallel": dp > 1,
        "tensor_parallel": tp > 1,
        "sequence_parallel": sp,
        "layout": layout,
        "nnodes": nnodes,
        "nproc_per_node": nproc,
        "zero": zero,
        "uses_all_gather": tp > 1 or zero,
        "uses_reduce_scatter": sp or zero,
        "column_linear": "ColumnParallelLinear" if tp > 1 else "Linear",
        "row_linear": "RowParallelLinear" if tp > 1 else "Linear",
        "bucket_bytes": BUCKET_BYTES,
    }


def _model(plan: Plan, tp: int) -> dict:
    m = plan.model
    if m.arch not in ("gpt2", "llama"):
        raise Unsupported(
            f"model architecture {m.arch!r} is not supported by the code generator yet"
            " (gpt2, llama)"
        )
    if m.hidden % m.heads:
        raise Unsupported(f"hidden = {m.hidden} is not a multiple of heads = {m.heads}")
    if m.heads % m.kv_heads:
        raise Unsupported(
            f"heads = {m.heads} is not a multiple of kv_heads = {m.kv_heads}"
        )
    for key, value in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn", m.ffn)):
        if value % tp:
            raise Unsupported(f"{key} = {value} is not divisible by tp = {tp}")
    if plan.tensor_parallel.sequence_parallel and tp > 1 and m.seq_len % tp:
        raise Unsupported(
            f"sequence parallel needs seq_len = {m.seq_len} divisible by tp = {tp}"
        )
    if m.arch == "llama" and m.head_dim % 2:
        raise Unsupported(f"RoPE needs an even head dim, got {m.head_dim}")
    per_rank = -(-m.vocab // tp)
    if (tp - 1) * per_rank >= m.vocab:
        raise Unsupported(f"vocab = {m.vocab} is too small to split over tp = {tp}")
    llama = m.arch == "llama"
    return {
        "arch": m.arch,
        "llama": llama,
        "model_title": (
            "Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention)"
            if llama
            else "GPT-2 (LayerNorm, learned positions, GELU MLP)"
        ),
        "summary": (
            f"{m.arch}, {m.layers} layers, hidden {m.hidden}, {m.heads} heads"
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
        "vocab_padded": per_rank * tp,
        "vocab_padding": per_rank * tp != m.vocab,
        "seq_len": m.seq_len,
        "norm_eps": _number(m.norm_eps, "norm_eps"),
        "rope_theta": _number(m.rope_theta, "rope_theta"),
        "tie_embeddings": bool(m.tie_embeddings),
        "bias": not llama,
        "norm": "RMSNorm" if llama else "LayerNorm",
        "dropout": _number(m.dropout, "dropout"),
        "use_dropout": m.dropout > 0,
        "peak_flops": _number(plan.cluster.device.peak_flops, "device peak FLOP/s"),
        "device_name": _comment_safe(plan.cluster.device.name),
    }


def _training(plan: Plan) -> dict:
    t, o, s = plan.train, plan.train.optimizer, plan.train.lr_schedule
    per_step = t.micro_batch * plan.microbatches * plan.data_parallel_size
    if t.global_batch != per_step:
        raise Unsupported(
            f"global_batch = {t.global_batch} is not micro_batch x microbatches x dp"
            f" = {t.micro_batch} x {plan.microbatches} x {plan.data_parallel_size} = {per_step}"
        )
    choices = {
        "precision": (t.precision, ("fp32", "bf16", "fp16")),
        "optimizer": (o.name, ("adamw", "adam", "sgd")),
        "lr_schedule": (s.name, ("constant", "cosine", "linear")),
        "recompute": (t.recompute, ("none", "selective", "full")),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise Unsupported(f"{key} {value!r} is not one of {', '.join(allowed)}")
    if not 0 <= t.seed < 2**63:
        raise Unsupported(f"seed = {t.seed} is outside 0 .. 2**63 - 1")
    ck = t.checkpoint
    return {
        "steps": t.steps,
        "micro_batch": t.micro_batch,
        "micro_steps": plan.microbatches,
        "global_batch": t.global_batch,
        "precision": t.precision,
        "mixed": t.precision in _DTYPES,
        "param_dtype": _DTYPES.get(t.precision, "torch.float32"),
        "loss_scaling": t.precision == "fp16" and t.loss_scale == "dynamic",
        "recompute": t.recompute,
        "seed": t.seed,
        "grad_clip": _number(t.grad_clip, "grad_clip"),
        "clip": t.grad_clip > 0,
        "optimizer": o.name,
        "optimizer_title": f"{o.name}, {s.name} learning rate"
        + (f" with {s.warmup} warmup step{'s' if s.warmup > 1 else ''}" if s.warmup else ""),
        "lr": _number(o.lr, "lr"),
        "betas": repr(tuple(float(_number(b, "betas")) for b in o.betas)),
        "eps": _number(o.eps, "eps"),
        "momentum": _number(o.momentum, "momentum"),
        "weight_decay": _number(o.weight_decay, "weight_decay"),
        "lr_schedule": s.name,
        "warmup": s.warmup,
        "min_lr": _number(s.min_lr, "min_lr"),
        "decay_steps": s.decay_steps,
        "checkpoint": ck is not None,
        "checkpoint_every": ck.every if ck else 0,
        "checkpoint_dir": repr(ck.dir) if ck else "None",
    }


def _data(plan: Plan, out_dir: Path) -> dict:
    d, m = plan.train.data, plan.model
    if d.kind == "synthetic":
        return {
            "data_kind": "synthetic",
            "data_file": False,
            "data_path": "None",
            "data_relative": False,
        }
    if d.kind not in ("text", "tokens") or not d.path:
        raise Unsupported(
            f"data {d.kind!r} is not synthetic, text(...) or tokens(...)"
        )
    if d.kind == "text" and m.vocab < 256:
        raise Unsupported(
            f"text data is byte-level (ids 0..255) but vocab = {m.vocab} < 256"
        )
    if d.kind == "tokens" and m.vocab > 65536:
        raise Unsupported(f"tokens files hold uint16 ids but vocab = {m.vocab}")
    resolved = d.resolved_path or d.path
    if os.path.isabs(d.path):
        path, relative = d.path, False
    else:  # relative to the generated script, so the output moves with the repository
        path, relative = os.path.relpath(os.path.abspath(resolved), os.path.abspath(out_dir)), True
    return {
        "data_kind": d.kind,
        "data_file": True,
        "data_path": repr(path),
        "data_relative": relative,
    }


# -- helpers ------------------------------------------------------------------


def _identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENT.match(value):
        raise Unsupported(f"{what} {value!r} is not an identifier (letters, digits, _)")
    return value


def _number(value: float, what: str) -> str:
    """A finite number as a Python literal."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"{what} = {value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise Unsupported(f"{what} = {value!r} is not finite")
    return repr(value)


def _comment_safe(text: str) -> str:
    """Text for a comment: printable as is, else escaped by repr (no line breaks survive)."""
    return text if text.isprintable() else repr(text)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def templates_dir() -> Path:
    """``templates/`` next to the package (a checkout) or inside it (a wheel)."""
    try:
        return resource_dir("templates")
    except FileNotFoundError as e:
        raise CodegenError(str(e)) from None


def _format_python(text: str, name: str) -> str:
    try:
        return black.format_str(text, mode=black.Mode())
    except black.InvalidInput as e:  # a template bug, not a plan error
        raise CodegenError(f"internal error: generated {name} is not valid Python: {e}") from None
