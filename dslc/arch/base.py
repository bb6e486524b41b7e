"""What an architecture is, in one dataclass, and the formulas every architecture shares.

An :class:`Arch` says how a transformer block is built (norm, biases, positions, MLP,
experts); :func:`weights` lists the parameters of the generated model with their names,
their shape on one tensor-parallel rank and the dim split over tp, and every count
(:func:`params`, :func:`layer_params`) and FLOP figure (:func:`layer_flops`) is derived
from that one description. The code generator names its modules the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from ..ir import Model


@dataclass(frozen=True)
class HFName:
    """Our module (or parameter) ``ours`` is their ``theirs`` (``{i}`` the layer, ``{e}``
    an expert). ``conv1d``: their weight is stored transposed; ``piece``: we hold piece k
    of n equal parts of their outputs (a fused projection)."""

    ours: str
    theirs: str
    conv1d: bool = False
    piece: tuple[int, int] | None = None


@dataclass(frozen=True)
class HFFormat:
    architecture: str  # the transformers class: GPT2LMHeadModel, LlamaForCausalLM, ...
    model_type: str
    names: tuple[HFName, ...]


@dataclass(frozen=True)
class Arch:
    name: str
    title: str  # for a person: what the block is made of
    norm: str  # "LayerNorm" (weight and bias) | "RMSNorm" (weight)
    bias: bool  # linear layers carry biases
    positions: str  # "learned" (a table of seq_len rows) | "rope" (rotary, no parameters)
    mlp: str  # "gelu" (up, down) | "swiglu" (gate, up, down)
    tie_embeddings: bool  # default: the head reuses the token embedding
    moe: bool  # the MLP is a mixture of experts
    # context-parallel methods the generated model can run, and why not the others
    cp_methods: tuple[str, ...] = ("ring", "ulysses")
    cp_why: str = ""
    hf: HFFormat | None = None  # its Hugging Face checkpoints' names (dslc.arch.hf)

    def default_ffn(self, hidden: int) -> int:
        """GELU: 4h. SwiGLU: 2/3 of 4h (same parameters), rounded up to a multiple of 256."""
        return 4 * hidden if self.mlp == "gelu" else -(-int(8 * hidden / 3) // 256) * 256

    @property
    def norm_params(self) -> int:
        """Vectors of hidden size per norm: weight (and bias for LayerNorm)."""
        return 2 if self.norm == "LayerNorm" else 1

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2


@dataclass(frozen=True)
class Weight:
    """One parameter of the generated model on one tp rank. ``name`` has ``{i}`` for the
    layer; ``tp_dim`` is the dim split over tp (None: every tp rank holds all of it);
    ``part`` groups the parameters as :class:`Params` does. An expert weight (part
    ``expert``) is the script's tensor of every expert stacked in dim 0; ``shape`` is one
    expert's."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    part: str  # embedding | positions | layer | expert | final_norm | head

    @property
    def numel(self) -> int:
        return prod(self.shape)


def widths(model: Model, t: int = 1) -> tuple[int, int, int]:
    """(q, kv, ffn) widths on one tp rank; kv heads are replicated when fewer than t."""
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    return q // t, (kv // t if model.kv_heads % t == 0 else kv), model.ffn // t


def vocab_per_rank(model: Model, t: int = 1) -> int:
    """Rows of the vocab-parallel embedding and head on one of t tp ranks: the vocabulary
    padded up to a multiple of t (Megatron pads the same way)."""
    return ceil(model.vocab / t)


def weights(arch: Arch, model: Model, t: int = 1) -> tuple[Weight, ...]:
    """Every parameter of ``model`` on one of ``t`` tp ranks (Megatron's layout: q, k, v,
    the MLP's first matrices and their biases split by rows, the output projections by
    columns with a replicated bias; embedding and head split by vocabulary, padded to a
    multiple of t). A mixture of experts is not split over tp: every tp rank holds its
    experts whole (``tp_dim`` None) and runs them on the tokens it holds."""
    h, (q, kv, f) = model.hidden, widths(model, t)
    kv_dim = 0 if model.kv_heads % t == 0 else None
    out = [Weight("wte.weight", (vocab_per_rank(model, t), h), 0, "embedding")]
    if arch.positions == "learned":
        out.append(Weight("wpe.weight", (model.seq_len, h), None, "positions"))

    def norm(prefix: str, part: str) -> list[Weight]:
        names = ("weight", "bias")[: arch.norm_params]
        return [Weight(f"{prefix}.{n}", (h,), None, part) for n in names]

    def linear(prefix: str, rows: int, cols: int, tp_dim: int | None, part: str) -> list[Weight]:
        w = [Weight(f"{prefix}.weight", (rows, cols), tp_dim, part)]
        return w + ([Weight(f"{prefix}.bias", (rows,), 0 if tp_dim == 0 else None, part)] if arch.bias else [])

    block = "blocks.{i}."
    out += norm(block + "attn_norm", "layer")
    out += linear(block + "attn.q_proj", q, h, 0, "layer")
    out += linear(block + "attn.k_proj", kv, h, kv_dim, "layer")
    out += linear(block + "attn.v_proj", kv, h, kv_dim, "layer")
    out += linear(block + "attn.o_proj", h, q, 1, "layer")
    out += norm(block + "mlp_norm", "layer")
    names = ("gate_proj", "up_proj", "down_proj") if arch.mlp == "swiglu" else ("up_proj", "down_proj")
    if arch.moe:  # bias-free experts, whole on every tp rank (split over ep, replicated over tp)
        out.append(Weight(block + "mlp.router", (model.experts, h), None, "layer"))
        f = model.ffn
        out += [Weight(block + "mlp." + n, (h, f) if n == "down_proj" else (f, h), None, "expert") for n in names]
    else:  # the first matrices split by rows (column-parallel), down_proj by columns
        for n in names:
            out += linear(block + "mlp." + n, *((h, f, 1) if n == "down_proj" else (f, h, 0)), "layer")
    out += norm("norm", "final_norm")
    if not model.tie_embeddings:
        out.append(Weight("lm_head", (vocab_per_rank(model, t), h), 0, "head"))
    return tuple(out)


@dataclass(frozen=True)
class Params:
    """Exact parameter count of the generated model, by part."""

    embedding: int  # V·h token embedding
    positions: int  # s·h learned positions (gpt2)
    layer: int  # one layer without its experts
    experts: int  # all experts of one layer (mixtral)
    final_norm: int
    head: int  # V·h, 0 when tied to the embedding
    layers: int

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.layers * (self.layer + self.experts) + self.final_norm + self.head


def params(arch: Arch, model: Model) -> Params:
    by_part: dict[str, int] = {}
    for w in weights(arch, model):
        by_part[w.part] = by_part.get(w.part, 0) + w.numel
    experts = by_part.get("expert", 0) * model.experts
    return Params(by_part["embedding"], by_part.get("positions", 0), by_part["layer"], experts,
                  by_part["final_norm"], by_part.get("head", 0), model.layers)


def layer_params(arch: Arch, model: Model, t: int = 1) -> tuple[int, int, int]:
    """(tp-sharded, tp-replicated, expert) parameters of one layer on one tp rank; expert:
    all E experts of the layer, whole (not divided by t, nor yet by ep)."""
    sharded = replicated = expert = 0
    for w in weights(arch, model, t):
        if w.part == "expert":
            expert += w.numel * model.experts
        elif w.part == "layer" and w.tp_dim is None:
            replicated += w.numel
        elif w.part == "layer":
            sharded += w.numel
    return sharded, replicated, expert


def layer_flops(arch: Arch, model: Model, seq: int, t: int = 1) -> tuple[float, float]:
    """(matmul, attention-core) forward FLOPs per token of one layer on one tp rank.

    Matmuls 2·h·(q + 2kv) + 2·q·h, MLP 2·2·h·f (GELU) or 3·2·h·f (SwiGLU; MoE: top_k of them
    plus the router 2·h·E); attention core 2·2·s·q (QKᵀ and AV, no causal saving), as in
    Narayanan et al. SC21 (who count GPT: 24h² + 4sh per token per layer). With t > 1 the
    MoE term is f/t per token: a rank's real expert work depends on the tokens it routes,
    which :func:`dslc.cost.flops.layer_rank_flops` counts."""
    h = model.hidden
    q, _, f = widths(model, t)
    mlp = 2 * arch.mlp_matrices * h * f
    if arch.moe:
        mlp = model.top_k * mlp + 2 * h * model.experts
    return attention_matmul_flops(model, t) + mlp, 4 * seq * q


def attention_matmul_flops(model: Model, t: int = 1) -> int:
    """Forward FLOPs per token of the attention's linear layers on one tp rank: the q, k, v
    projections 2·h·(q + 2kv) and the output projection 2·q·h."""
    q, kv, _ = widths(model, t)
    return 2 * model.hidden * (q + 2 * kv) + 2 * q * model.hidden


def model_flops_per_token(arch: Arch, model: Model) -> int:
    """Forward and backward (3 passes) FLOPs per token of the whole model, what MFU counts:
    3·(l·(matmul + core) + 2·h·V). For GPT this is 72·l·h²(1 + s/(6h) + V/(12lh)) per token
    (Narayanan et al. SC21 without recompute). Both ``dslc explain`` and the generated
    script's MFU use this number."""
    mm, core = layer_flops(arch, model, model.seq_len)
    return int(3 * (model.layers * (mm + core) + 2 * model.hidden * model.vocab))


def sc21_params(l: int, h: int, V: int, s: int) -> float:
    """The parameter count of Narayanan et al. (SC21): 12·l·h²(1 + 13/(12h) + (V+s)/(12lh))
    for GPT with a tied head; it leaves out the final LayerNorm (2h)."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
