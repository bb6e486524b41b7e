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
from math import prod

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
            ("activation", ("activation_function",), "gelu_new", "gelu_new"),  # GELU, tanh approximation
            ("attention scaling", ("scale_attn_weights",), True, True),
            ("attention scaling by layer", ("scale_attn_by_inverse_layer_idx",), False, False),
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
        ("activation", ("hidden_act",), "silu", "silu"),
        ("rope_type", ("rope_parameters.rope_type",), "default", "default"),  # transformers 5
        ("rope_type", ("rope_scaling.rope_type", "rope_scaling.type"), "default", "default"),  # 4: Llama 3.1's "llama3"
        ("attention_bias", ("attention_bias",), False, False),
        ("mlp_bias", ("mlp_bias",), False, False),
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


def deepseek(model: Model) -> str:
    """Why a model with a dense prefix or shared experts has no Hugging Face mapping here
    ("" without them): transformers' DeepSeek-V3 routes by sigmoid scores over expert
    groups with a bias, not by Mixtral's softmax router that these models keep."""
    if model.is_moe and (model.dense_layers or model.shared_experts):
        return ("dense_layers and shared_experts: transformers' DeepSeek-V3 classes route by sigmoid scores over "
                "expert groups, not by this model's softmax router; no Hugging Face format holds it")
    return ""


# What lint reads of a checkpoint, in bytes: config.json, the index (DeepSeek-V3's: 9 MB),
# one safetensors header (the format's own bound), and all the headers together
MAX_CONFIG, MAX_INDEX, MAX_HEADER, MAX_HEADERS = 2**20, 64 * 2**20, 100_000_000, 256 * 2**20
INDEX = "model.safetensors.index.json"
MAX_DIMS = 64  # of a tensor's shape
# safetensors' dtypes and their bits; a weight is read from a floating one only (fp32 in
# the script), never from an int, a bool or fp8 (whose scales are other tensors)
DTYPE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6} | dict.fromkeys(["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"], 8)
DTYPE_BITS |= dict.fromkeys(["I16", "U16", "F16", "BF16"], 16) | dict.fromkeys(["I32", "U32", "F32"], 32)
DTYPE_BITS |= dict.fromkeys(["I64", "U64", "F64", "C64"], 64)
WEIGHT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}  # torch's names


class Refused(Exception):
    """What lint finds wrong with a checkpoint: args (kind, message) as :func:`problem`
    returns them."""


def problem(arch: Arch, model: Model, folder: str) -> tuple[str, str] | None:
    """What lint finds wrong with the checkpoint in ``folder`` for ``model``, as (kind,
    message): kind "read" (no folder, no config.json or weights), "file" (a file that
    cannot be read safely: not a regular file inside the folder, over its bound, or not
    a well-formed config, index or safetensors file) or "model" (the first key of config.json that differs from the plan, a tensor
    the model needs that is missing, of another shape or not floating-point); None when
    it fits. Of the weights, it reads the index and each file's header, never the data."""
    if deepseek(model):
        return "model", deepseek(model)
    if not os.path.isdir(folder):
        return "read", f"Hugging Face checkpoint {folder} " + ("is not a folder" if os.path.exists(folder) else "not found")
    if not any(os.path.lexists(os.path.join(folder, f)) for f in ("model.safetensors", INDEX)):
        return "read", f"{folder} holds no model.safetensors (nor {INDEX})"
    try:
        checkpoint = Checkpoint(folder)
        config = checkpoint.read_json("config.json", MAX_CONFIG, "a Hugging Face config")
        for what, keys, want, default in checks(arch, model):
            got = next((v for v in (lookup(config, k) for k in keys) if v is not None), default)
            if got != want:
                return "model", f"{checkpoint.path('config.json')}: {keys[0]} = {json.dumps(got)}, but the plan's model has {what} = {json.dumps(want)}"
        checkpoint.compare(expected(arch, model))
    except Refused as e:
        return e.args
    return None


def expected(arch: Arch, model: Model) -> dict[str, tuple[list[int], str]]:
    """{their name: (its shape, our name)} of every tensor the serial model reads from a
    checkpoint: our weight's shape, times n in dim 0 for a piece of n fused ones (gpt2's
    c_attn), reversed where theirs is stored transposed."""
    shapes = {w.name: w.shape for w in weights(arch, model)}
    out = {}
    for ours, theirs, transposed, piece, expert in tensors(arch, model):
        shape = list(shapes[ours])
        shape[0] *= piece[1] if piece else 1
        for i in range(model.layers) if "{i}" in ours else [0]:
            for e in range(model.experts) if expert else [None]:
                out.setdefault(theirs.format(i=i, e=e), (shape[::-1] if transposed else shape, ours.format(i=i)))
    return out


class Checkpoint:
    """The files of a Hugging Face folder, read as the generated script reads them
    (templates/hf_init.py.jinja's HFCheckpoint): through :mod:`dslc.reading`, each file a
    plain name inside the folder (or, in the Hugging Face cache, its blobs); a failure
    raises :class:`Refused`."""

    def __init__(self, folder: str):
        self.folder, real = folder, os.path.realpath(folder)
        cached = os.path.basename(os.path.dirname(real)) == "snapshots"  # snapshots/REV/ links to ../../blobs/
        self.root = os.path.dirname(os.path.dirname(real)) if cached else real
        self.budget = MAX_HEADERS

    def path(self, name: str) -> str:
        path = os.path.join(self.folder, name)
        if not reading.inside(path, self.root):
            raise Refused("file", f"{reading.shown(path)}: leads out of the checkpoint's folder")
        return path

    def read_json(self, name: str, limit: int, what: str) -> dict:
        path = self.path(name)
        try:
            found = reading.read_json(path, limit)
            if not isinstance(found, dict):
                raise ValueError("not a JSON object")
        except reading.NotAFile as e:
            raise Refused("file", f"{reading.shown(path)}: not a regular file ({e.kind})") from None
        except OSError as e:
            raise Refused("file", f"{reading.shown(path)}: cannot read it as {what} ({e.strerror})") from None
        except ValueError as e:
            raise Refused("file", f"{reading.shown(path)}: cannot read it as {what} ({e})") from None
        return found

    def compare(self, want: dict[str, tuple[list[int], str]]) -> None:
        """Every tensor of ``want`` in its file, of its shape and a floating dtype."""
        weight_map = {theirs: "model.safetensors" for theirs in want}  # their name: its file
        if os.path.lexists(os.path.join(self.folder, INDEX)):
            weight_map = self.read_json(INDEX, MAX_INDEX, "a safetensors index").get("weight_map")
            pairs = weight_map.items() if isinstance(weight_map, dict) else [(0, 0)]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
                raise Refused("file", f"{reading.shown(self.path(INDEX))}: its weight_map is not an object of tensor names to file names")
            for name in weight_map.values():
                if not name or "/" in name or "\0" in name or name in (".", ".."):
                    raise Refused("file", f"{reading.shown(self.path(INDEX))}: names {name!r}, not a file of the folder")
        read = {}  # a real file's (device, inode): the entries of its header the model reads
        headers = {name: self.header(name, read, want) for name in sorted(set(weight_map.values()))}
        for theirs, (shape, ours) in want.items():
            name = weight_map.get(theirs)
            entry = headers[name].get(theirs) if name else None
            if entry is None:
                raise Refused("model", f"{reading.shown(self.path(name or INDEX))}: no tensor {theirs} (the model's {ours})")
            if entry["dtype"] not in WEIGHT_DTYPES:
                raise Refused("model", f"{reading.shown(self.path(name))}: {theirs} is {entry['dtype']}, not a floating-point weight (the model's {ours})")
            if entry["shape"] != shape:
                raise Refused("model", f"{reading.shown(self.path(name))}: {theirs} has shape {entry['shape']}, not the {shape} of the model's {ours}")

    def header(self, name: str, read: dict, keep) -> dict:
        """The entries named in ``keep`` of the header of the safetensors file ``name``,
        every entry checked: a known dtype, a shape and the bytes they take, inside the
        file, no two overlapping. ``read``: those of the files read so far by (device,
        inode): each real file is read once however many names (links, hard links) lead
        to it, as the script reads them."""
        path = self.path(name)

        def refuse(why: str):
            return Refused("file", f"{reading.shown(path)}: cannot read it as safetensors ({why})")

        try:
            data, st = reading.read_bytes(path, 8, 0, 8)
            if (st.st_dev, st.st_ino) in read:
                return read[st.st_dev, st.st_ino]
            n = int.from_bytes(data, "little") if len(data) == 8 else 0
            if not 0 < n <= min(MAX_HEADER, st.st_size - 8):
                raise refuse(f"{st.st_size} bytes, with a header of {n}")
            if n > self.budget:
                raise refuse(f"the headers of the checkpoint's files are more than {MAX_HEADERS // 2**20} MiB")
            self.budget -= n
            data, st = reading.read_bytes(path, n, 8, n)
            header = reading.parse_json(data) if len(data) == n else None
        except reading.NotAFile as e:
            raise Refused("file", f"{reading.shown(path)}: not a regular file ({e.kind})") from None
        except OSError as e:
            raise refuse(e.strerror) from None
        except ValueError as e:
            raise refuse(str(e)) from None
        if not isinstance(header, dict):
            raise refuse("the header is not a JSON object")
        header.pop("__metadata__", None)
        spans = []
        for key, entry in header.items():
            span = _span(entry, 8 + n, st.st_size)
            if span is None:
                raise refuse(f"the entry of {key!r} is not a known dtype, a shape and their bytes in the file")
            spans.append((span, key))
        spans.sort()
        for ((_, end), a), ((begin, _), b) in zip(spans, spans[1:]):
            if begin < end:
                raise refuse(f"the bytes of {a!r} and {b!r} overlap")
        read[st.st_dev, st.st_ino] = {k: e for k, e in header.items() if k in keep}
        return read[st.st_dev, st.st_ino]


def _span(entry: object, start: int, size: int) -> tuple[int, int] | None:
    """The [begin, end) of a header's entry in the data, which starts at byte ``start`` of
    a file of ``size`` bytes; None unless it is a known dtype, a shape of at most MAX_DIMS
    dims and data_offsets of as many bytes as they take, within the file."""
    def counts(x: object) -> bool:
        return isinstance(x, list) and len(x) <= MAX_DIMS and all(type(v) is int and v >= 0 for v in x)

    entry = entry if isinstance(entry, dict) else {}
    shape, span = entry.get("shape"), entry.get("data_offsets")
    bits = DTYPE_BITS.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
    if bits and counts(shape) and counts(span) and len(span) == 2 and start + span[1] <= size:
        if 8 * (span[1] - span[0]) == prod(shape) * bits:
            return span[0], span[1]
    return None


def lookup(config: dict, key: str) -> object:
    """``config[a][b]`` for the key "a.b"; None when absent."""
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config
