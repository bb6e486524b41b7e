"""The architectures dslc knows, one module each, and what follows from them.

Everything that differs between gpt2, llama and mixtral lives in their modules (an
:class:`~dslc.arch.base.Arch` each); parameter names and shapes, counts and FLOPs are
computed once, in :mod:`dslc.arch.base`, from that description. The functions here
take a model and use its architecture.
"""

from __future__ import annotations

import functools

from ..ir import Model
from . import base, gpt2, hf, llama, mixtral
from .base import (
    Arch,
    Params,
    Weight,
    attention_matmul_flops,
    kinds,
    layer_model,
    sc21_params,
    vocab_per_rank,
    widths,
)

ARCHS: dict[str, Arch] = {a.name: a for a in (gpt2.ARCH, llama.ARCH, mixtral.ARCH)}

__all__ = ["ARCHS", "Arch", "Params", "Weight", "attention_matmul_flops", "float8_weights", "FLOAT8_ALIGN", "hf", "kinds", "layer_flops", "layer_model", "layer_params", "layers_params", "model_flops_per_token",
           "of", "params", "sc21_params", "vocab_per_rank", "weights", "widths"]


def of(model: Model) -> Arch:
    return ARCHS[model.arch]


def weights(model: Model, t: int = 1) -> tuple[Weight, ...]:
    return base.weights(of(model), model, t)


FLOAT8_ALIGN = 16  # torch._scaled_mm multiplies operands whose dims are multiples of 16


def float8_weights(model: Model, t: int = 1) -> tuple[Weight, ...]:
    """The weights whose GEMMs ``train { float8 }`` runs in fp8: the blocks' linears and
    the experts, not the router (nor the embedding or the head)."""
    return tuple(w for w in weights(model, t) if len(w.shape) == 2 and w.part in ("layer", "expert") and not w.name.endswith("router"))


def params(model: Model) -> Params:
    return base.params(of(model), model)


@functools.lru_cache(maxsize=1024)
def layer_params(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(tp-sharded, replicated, expert) parameters of one block on a tp rank; kept for the
    next plan of the same model (memory, traffic and the search ask again and again)."""
    return base.layer_params(of(model), model, t)


def layers_params(model: Model, t: int = 1, ids=None) -> tuple[int, int, int]:
    """:func:`layer_params` summed over blocks ``ids`` (default every block), each by its
    kind (a dense prefix and MoE blocks, :func:`kinds`)."""
    per = [(n, layer_params(m, t)) for n, m in kinds(model, ids)]
    return tuple(sum(n * x[j] for n, x in per) for j in range(3))


def layer_flops(model: Model, seq: int, t: int = 1, causal: bool = True) -> tuple[float, float]:
    return base.layer_flops(of(model), model, seq, t, causal)


def model_flops_per_token(model: Model, causal: bool = True) -> int:
    return base.model_flops_per_token(of(model), model, causal)
