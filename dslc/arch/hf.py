"""Hugging Face checkpoints: how our parameters are named and laid out in theirs.

Each architecture module lists its :class:`HFName` rows (our module → theirs) and its
:class:`HFFormat`; :func:`tensors` expands them over :func:`dslc.arch.base.weights` into
the rows the generated script loops over, and :func:`config` / :func:`checks` give the
``config.json`` it writes and the keys it compares when a plan starts from one. The
layouts: GPT-2's ``Conv1D`` stores its weight transposed ([in, out]) and fuses q, k, v
into ``c_attn`` along the outputs; Llama is a rename (HF's RoPE is the rotate-half
convention ours is); Mixtral's Hub format keeps one tensor per expert
(``experts.{e}.w1`` = gate, ``w3`` = up, ``w2`` = down) where we stack them in dim 0.
"""

from __future__ import annotations

import json
import os

from .. import reading
from ..ir import Model
from .base import Arch, weights


def tensors(arch: Arch, model: Model) -> list[tuple[str, str, bool, tuple[int, int] | None, bool]]:
    """(our name, their name, transposed, piece, expert) for every parameter of the
    serial model; an expert row's name has ``{e}`` and stands for E tensors of theirs.
    Empty for a DeepSeek-style model (:func:`deepseek`): no format maps it."""
    if deepseek(model):
        return []
    out = []
    for w in weights(arch, model):
        row = next(n for n in arch.hf.names if w.name == n.ours or w.name.startswith(n.ours + "."))
        theirs = row.theirs + w.name[len(row.ours):]
        out.append((w.name, theirs, row.conv1d and w.name.endswith(".weight"), row.piece, w.part == "expert"))
    return out


def config(arch: Arch, model: Model) -> dict:
    """The ``config.json`` of the exported checkpoint (its dtype keys say fp32: the script
    sets them to what ``--export-dtype`` wrote)."""
    m, fmt = model, arch.hf
    common = {"architectures": [fmt.architecture], "model_type": fmt.model_type, "vocab_size": m.vocab,
              "tie_word_embeddings": m.tie_embeddings, "torch_dtype": "float32", "dtype": "float32"}
    if arch.name == "gpt2":
        return common | {
            "n_embd": m.hidden, "n_layer": m.layers, "n_head": m.heads, "n_inner": m.ffn,
            "n_positions": m.max_positions, "layer_norm_epsilon": m.norm_eps,
            "activation_function": "gelu_new",  # GELU, tanh approximation: F.gelu(approximate="tanh")
            "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": 0.0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
        }
    out = common | {
        "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "intermediate_size": m.ffn,
        "max_position_embeddings": m.max_positions, "rms_norm_eps": m.norm_eps, "hidden_act": "silu",
        "rope_theta": m.rope_theta,  # transformers 4; 5 reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_theta},
        "attention_bias": False, "attention_dropout": 0.0,
    }
    if arch.name == "llama":
        return out | {"mlp_bias": False}
    return out | {"num_local_experts": m.experts, "num_experts_per_tok": m.top_k,
                  "router_aux_loss_coef": m.aux_loss_weight, "output_router_logits": False,
                  "router_jitter_noise": 0.0, "sliding_window": None}


def checks(arch: Arch, model: Model) -> list[tuple[str, tuple[str, ...], object, object]]:
    """(what, config keys in order of preference, value the plan needs, value when absent)
    for a checkpoint a plan starts from: whatever changes a weight's shape or the model's
    function. A dotted key is nested (transformers 5's ``rope_parameters.rope_theta``)."""
    m = model
    if arch.name == "gpt2":
        return [
            ("model_type", ("model_type",), "gpt2", None),
            ("hidden", ("n_embd",), m.hidden, None),
            ("layers", ("n_layer",), m.layers, None),
            ("heads", ("n_head",), m.heads, None),
            ("head_dim", ("head_dim",), m.head_dim, m.hidden // m.heads),  # GPT-2's is n_embd / n_head
            ("vocab", ("vocab_size",), m.vocab, None),
            ("ffn", ("n_inner",), m.ffn, 4 * m.hidden),
            ("seq_len", ("n_positions",), m.max_positions, None),
            ("norm_eps", ("layer_norm_epsilon",), m.norm_eps, 1e-5),
            ("tie_embeddings", ("tie_word_embeddings",), m.tie_embeddings, True),
        ]
    out = [
        ("model_type", ("model_type",), arch.hf.model_type, None),
        ("hidden", ("hidden_size",), m.hidden, None),
        ("layers", ("num_hidden_layers",), m.layers, None),
        ("heads", ("num_attention_heads",), m.heads, None),
        ("kv_heads", ("num_key_value_heads",), m.kv_heads, m.heads),
        ("head_dim", ("head_dim",), m.head_dim, m.hidden // m.heads),  # absent: hidden_size / heads
        ("vocab", ("vocab_size",), m.vocab, None),
        ("ffn", ("intermediate_size",), m.ffn, None),
        ("norm_eps", ("rms_norm_eps",), m.norm_eps, 1e-6 if arch.name == "llama" else 1e-5),
        ("rope_theta", ("rope_parameters.rope_theta", "rope_theta"), m.rope_theta, 10000.0),
        ("tie_embeddings", ("tie_word_embeddings",), m.tie_embeddings, False),
    ]
    if arch.moe:
        out += [("experts", ("num_local_experts",), m.experts, None),
                ("top_k", ("num_experts_per_tok",), m.top_k, None)]
    return out


def exportable(model: Model) -> str:
    """Why the model cannot be written as a Hugging Face checkpoint ("" when it can): the
    transformers classes compute Mixtral's router (softmax over the chosen logits),
    dropless; GPT-2's head size is n_embd / n_head."""
    if deepseek(model):
        return deepseek(model)
    if model.arch == "gpt2" and model.heads * model.head_dim != model.hidden:
        return f"head_dim = {model.head_dim}: transformers' GPT-2 heads are n_embd / n_head = {model.hidden / model.heads:g} wide"
    if model.is_moe and model.router != "topk_softmax":
        return f"router = {model.router}: transformers' Mixtral renormalizes the top-k probabilities (router = topk_softmax)"
    if model.is_moe and model.capacity_factor > 0:
        return f"capacity_factor = {model.capacity_factor:g}: transformers' Mixtral drops no tokens"
    return ""


MAX_CONFIG = 2**20  # bytes of config.json lint reads


def deepseek(model: Model) -> str:
    """Why a model with a dense prefix or shared experts has no Hugging Face mapping here
    ("" without them): transformers' DeepSeek-V3 routes by sigmoid scores over expert
    groups with a bias, not by Mixtral's softmax router that these models keep."""
    if model.is_moe and (model.dense_layers or model.shared_experts):
        return ("dense_layers and shared_experts: transformers' DeepSeek-V3 classes route by sigmoid scores over "
                "expert groups, not by this model's softmax router; no Hugging Face format holds it")
    return ""


def problem(arch: Arch, model: Model, folder: str) -> tuple[str, str] | None:
    """What lint finds wrong with the checkpoint in ``folder`` for ``model``, as (kind,
    message): kind "read" (no folder, no config.json or weights, not JSON) or "model"
    (the first key of config.json that differs from the plan); None when it fits."""
    conf = os.path.join(folder, "config.json")
    if deepseek(model):
        return "model", deepseek(model)
    if not os.path.isdir(folder):
        return "read", f"Hugging Face checkpoint {folder} " + ("is not a folder" if os.path.exists(folder) else "not found")
    if not any(os.path.isfile(os.path.join(folder, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
        return "read", f"{folder} holds no model.safetensors (nor model.safetensors.index.json)"
    try:
        config = reading.read_json(conf, MAX_CONFIG)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except OSError as e:
        return "read", f"{reading.shown(conf)}: cannot read it as a Hugging Face config ({e.strerror})"
    except ValueError as e:
        return "read", f"{reading.shown(conf)}: cannot read it as a Hugging Face config ({e})"
    for what, keys, want, default in checks(arch, model):
        got = next((v for v in (lookup(config, k) for k in keys) if v is not None), default)
        if got != want:
            return "model", f"{conf}: {keys[0]} = {json.dumps(got)}, but the plan's model has {what} = {json.dumps(want)}"
    return None


def lookup(config: dict, key: str) -> object:
    """``config[a][b]`` for the key "a.b"; None when absent."""
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config
