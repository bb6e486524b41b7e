"""What an architecture is, in one dataclass, and the formulas every architecture shares.

An :class:`Arch` says how a transformer block is built (norm, biases, positions, MLP,
experts); :func:`weights` lists the parameters of the generated model with their names,
their shape on one tensor-parallel rank and the dim split over tp, and every count
(:func:`params`, :func:`layer_params`) and FLOP figure (:func:`layer_flops`) is derived
from that one description. The code generator names its modules the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    positions: str  # "learned" (a table of the model's seq_len rows) | "rope" (rotary, no parameters)
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
    # which blocks have it: "" every one; "dense" the dense prefix, "moe" the MoE blocks
    # (a model with dense_layers, whose blocks are of two kinds)
    layers: str = ""

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def in_layer(self, model: Model, i: int) -> bool:
        return not self.layers or (self.layers == "moe") == model.moe_layer(i)


def layer_model(model: Model, i: int) -> Model:
    """Block ``i`` as a model whose every block is like it (what the per-layer formulas
    take): the model itself, unless it has a dense prefix (DeepSeek-style): then, for a
    block of the prefix, the model without experts and with an MLP dense_ffn wide, and
    for a MoE block, the model without the prefix."""
    if not (model.is_moe and model.dense_layers):
        return model
    if model.moe_layer(i):
        return replace(model, dense_layers=0)
    return replace(model, ffn=model.dense_ffn, experts=0, top_k=0, capacity_factor=0.0, aux_loss_weight=0.0, router="",
                   z_loss_weight=0.0, dense_layers=0, dense_ffn=0, shared_experts=0)


def kinds(model: Model, ids=None) -> tuple[tuple[int, Model], ...]:
    """(how many, the :func:`layer_model` of their kind) of blocks ``ids`` (default all) for
    each kind of block among them: one pair unless the model has a dense prefix."""
    ids = range(model.layers) if ids is None else ids
    if not (model.is_moe and model.dense_layers):
        return ((len(ids), model),)
    dense = sum(1 for i in ids if i < model.dense_layers)
    pairs = ((dense, layer_model(model, 0)), (len(ids) - dense, layer_model(model, model.dense_layers)))
    return tuple((n, m) for n, m in pairs if n)


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
    experts whole (``tp_dim`` None) and runs them on the tokens it holds, and so are its
    shared experts (one MLP of shared_experts · ffn, not split over ep either). With a dense
    prefix, the weights of both kinds of block, tagged (``Weight.layers``)."""
    if model.is_moe and model.dense_layers:
        dense, moe = weights(arch, layer_model(model, 0), t), weights(arch, layer_model(model, model.dense_layers), t)
        both = {w.name for w in dense} & {w.name for w in moe}
        last = max(i for i, w in enumerate(dense) if w.name not in both)  # the dense MLP's end
        tagged = [w if w.name in both else replace(w, layers="dense") for w in dense]
        return tuple(tagged[: last + 1] + [replace(w, layers="moe") for w in moe if w.name not in both] + tagged[last + 1 :])
    h, (q, kv, f) = model.hidden, widths(model, t)
    kv_dim = 0 if model.kv_heads % t == 0 else None
    out = [Weight("wte.weight", (vocab_per_rank(model, t), h), 0, "embedding")]
    if arch.positions == "learned":
        out.append(Weight("wpe.weight", (model.max_positions, h), None, "positions"))

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
    if model.is_moe:  # bias-free experts, whole on every tp rank (split over ep, replicated over tp)
        out.append(Weight(block + "mlp.router", (model.experts, h), None, "layer"))
        f = model.ffn
        out += [Weight(block + "mlp." + n, (h, f) if n == "down_proj" else (f, h), None, "expert") for n in names]
        fs = model.shared_experts * f  # shared experts: one MLP, as DeepSeek's
        out += [Weight(f"{block}mlp.shared_experts.{n}.weight", (h, fs) if n == "down_proj" else (fs, h), None, "layer")
                for n in names if fs]
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
    layer: int  # one layer without its experts (a MoE layer, with a dense prefix)
    experts: int  # all experts of one layer (mixtral)
    final_norm: int
    head: int  # V·h, 0 when tied to the embedding
    layers: int
    dense_layer: int = 0  # one layer of the dense prefix (DeepSeek-style)
    dense_layers: int = 0

    @property
    def total(self) -> int:
        moe = (self.layers - self.dense_layers) * (self.layer + self.experts)
        return self.embedding + self.positions + moe + self.dense_layers * self.dense_layer + self.final_norm + self.head


def params(arch: Arch, model: Model) -> Params:
    by_part: dict[str, int] = {}
    for w in weights(arch, layer_model(model, model.layers - 1)):
        by_part[w.part] = by_part.get(w.part, 0) + w.numel
    experts = by_part.get("expert", 0) * model.experts
    dense = sum(layer_params(arch, layer_model(model, 0))) if model.is_moe and model.dense_layers else 0
    return Params(by_part["embedding"], by_part.get("positions", 0), by_part["layer"], experts,
                  by_part["final_norm"], by_part.get("head", 0), model.layers, dense, model.dense_layers if dense else 0)


def layer_params(arch: Arch, model: Model, t: int = 1) -> tuple[int, int, int]:
    """(tp-sharded, tp-replicated, expert) parameters of one layer on one tp rank; expert:
    all E experts of the layer, whole (not divided by t, nor yet by ep). With a dense
    prefix: a MoE layer's (:func:`kinds` gives both)."""
    model = layer_model(model, model.layers - 1)
    sharded = replicated = expert = 0
    for w in weights(arch, model, t):
        if w.part == "expert":
            expert += w.numel * model.experts
        elif w.part == "layer" and w.tp_dim is None:
            replicated += w.numel
        elif w.part == "layer":
            sharded += w.numel
    return sharded, replicated, expert


def layer_flops(arch: Arch, model: Model, seq: int, t: int = 1, causal: bool = True) -> tuple[float, float]:
    """(matmul, attention-core) forward FLOPs per token of one layer on one tp rank.

    Matmuls 2·h·(q + 2kv) + 2·q·h, MLP 2·2·h·f (GELU) or 3·2·h·f (SwiGLU; MoE: top_k of them
    plus the router 2·h·E, and shared_experts more); attention core 2·s·q: QKᵀ and AV over
    the s/2 keys a token sees on average under the causal mask, which is what the fused
    kernels compute (they skip the masked blocks) and how FlashAttention's benchmarks and
    Megatron's ``causal_tflops`` count it. ``causal=False`` counts the whole square, 4·s·q,
    as Narayanan et al. SC21 (GPT: 24h² + 4sh per token per layer), PaLM, torchtitan and
    nanoGPT do: only to read a FLOP rate those sources publish. With t > 1 the MoE term is
    f/t per token: a rank's real expert work depends on the tokens it routes, which
    :func:`dslc.cost.flops.layer_rank_flops` counts. With a dense prefix: a MoE layer's
    (:func:`kinds`)."""
    model = layer_model(model, model.layers - 1)
    h = model.hidden
    q, _, f = widths(model, t)
    mlp = 2 * arch.mlp_matrices * h * f
    if model.is_moe:
        mlp = (model.top_k + model.shared_experts) * mlp + 2 * h * model.experts
    return attention_matmul_flops(model, t) + mlp, (2 if causal else 4) * seq * q


def attention_matmul_flops(model: Model, t: int = 1) -> int:
    """Forward FLOPs per token of the attention's linear layers on one tp rank: the q, k, v
    projections 2·h·(q + 2kv) and the output projection 2·q·h."""
    q, kv, _ = widths(model, t)
    return 2 * model.hidden * (q + 2 * kv) + 2 * q * model.hidden


def model_flops_per_token(arch: Arch, model: Model, causal: bool = True) -> int:
    """Forward and backward (3 passes) FLOPs per token of the whole model, what MFU counts:
    3·(l·(matmul + core) + 2·h·V). For GPT this is 72·l·h²(1 + s/(12h) + V/(12lh)) per token
    (Narayanan et al. SC21 without recompute, the attention core causal: s/(6h) with
    ``causal=False``, as they count it). Both ``dslc explain`` and the generated script's
    MFU use this number."""
    per_layer = sum(n * sum(layer_flops(arch, m, model.seq_len, causal=causal)) for n, m in kinds(model))
    return int(3 * (per_layer + 2 * model.hidden * model.vocab))


def sc21_params(l: int, h: int, V: int, s: int) -> float:
    """The parameter count of Narayanan et al. (SC21): 12·l·h²(1 + 13/(12h) + (V+s)/(12lh))
    for GPT with a tied head; it leaves out the final LayerNorm (2h)."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
