"""The model's shapes, alone (E040, E042, E046: also of a model defined in a library file)
and split over tp (E041–E043, E047, W044)."""

from __future__ import annotations

from collections.abc import Callable

from .. import arch
from ..arch import vocab_per_rank
from ..diagnostics import Diagnostic, error, warning
from ..ir import Cluster, Model, Plan
from ..source import Span
from ..unknown import unless_unknown


def check_definition(d: Cluster | Model, spans: dict[str, Span]) -> list[Diagnostic]:
    """The rules of a model or cluster defined in a file without plans (a library): those of
    the model alone (a cluster's are the lowering's). ``spans``: its keys' (``model.heads``)."""
    if not isinstance(d, Model):
        return []

    def where(*keys: str) -> Span:
        return next((spans[k] for k in keys if k in spans), d.span)

    return list(_model_alone(d, where, "model.head_dim" in spans))


def model_shapes(plan: Plan):
    m, tp = plan.model, plan.tp
    yield from _model_alone(m, plan.where, "model.head_dim" in plan.spans)
    if tp == 1:
        return
    if m.heads % tp:
        yield error("E041", plan.where("mesh.tp"), f"heads={m.heads} is not divisible by tp={tp}", f"use a tp that divides {m.heads}")
    elif m.kv_heads % tp:
        yield error("E042", plan.where("mesh.tp"), f"kv_heads={m.kv_heads} is not divisible by tp={tp}", f"grouped-query attention splits the kv heads over tp; use tp ≤ {m.kv_heads} dividing it")
    if m.ffn % tp and not m.is_moe:  # experts are whole on every tp rank
        yield error("E043", plan.where("model.ffn", "mesh.tp"), f"ffn={m.ffn} is not divisible by tp={tp}", f"use an ffn that is a multiple of {tp}")
    elif m.is_moe and m.dense_layers and m.dense_ffn % tp:  # the dense prefix's MLP is split
        yield error("E043", plan.where("model.dense_ffn", "model.dense_layers", "mesh.tp"), f"dense_ffn={m.dense_ffn} (the MLP of the first {m.dense_layers} blocks, split over tp) is not divisible by tp={tp}", f"use a dense_ffn that is a multiple of {tp}")
    per_rank = vocab_per_rank(m, tp)
    if (tp - 1) * per_rank >= m.vocab:
        yield error("E047", plan.where("model.vocab", "mesh.tp"), f"vocab={m.vocab} is too small to split over tp={tp}: the last rank would hold no ids", f"use a vocab of at least {(tp - 1) * per_rank + 1}, or a smaller tp")
    elif m.vocab % tp:
        yield warning("W044", plan.where("model.vocab"), f"vocab={m.vocab} is not divisible by tp={tp}; it is padded to {per_rank * tp}", f"set vocab = {per_rank * tp} to make the padding explicit")


def _model_alone(m: Model, where: Callable[..., Span], given: bool):
    """The rules of the model whatever its layout; ``given``: head_dim is written (else it
    is hidden / heads). Each apart: a key an error left unknown holds back only its own."""
    with unless_unknown():
        if m.hidden % m.heads and not given:
            yield error("E040", where("model.hidden", "model.heads"), f"hidden={m.hidden} is not divisible by heads={m.heads}, and head_dim is not given",
                        "set head_dim (q is heads × head_dim wide, as in Gemma and Qwen3), or use heads that divide hidden")
    with unless_unknown():
        if m.heads % m.kv_heads:
            yield error("E042", where("model.kv_heads"), f"heads={m.heads} is not divisible by kv_heads={m.kv_heads}", "each key/value head serves a whole group of query heads")
    with unless_unknown():
        if arch.of(m).positions == "rope" and m.head_dim % 2:
            what = f"head_dim = {m.head_dim}" if given else f"head_dim = hidden/heads = {m.head_dim}"
            yield error("E046", where(*(("model.head_dim",) if given else ("model.hidden", "model.heads"))), f"RoPE rotates pairs of dimensions but {what} is odd",
                        "choose an even head_dim" if given else "choose hidden and heads with an even quotient, or set an even head_dim")
