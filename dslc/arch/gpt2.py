"""GPT-2 (Radford et al. 2019): pre-LayerNorm blocks with biases, learned positions, a
GELU MLP of 4h, and the head tied to the token embedding."""

from .base import Arch, HFFormat, HFName

# GPT2LMHeadModel: Conv1D weights are [in, out]; c_attn is q, k, v along the outputs
HF = HFFormat("GPT2LMHeadModel", "gpt2", (
    HFName("wte", "transformer.wte"),
    HFName("wpe", "transformer.wpe"),
    HFName("blocks.{i}.attn_norm", "transformer.h.{i}.ln_1"),
    HFName("blocks.{i}.attn.q_proj", "transformer.h.{i}.attn.c_attn", conv1d=True, piece=(0, 3)),
    HFName("blocks.{i}.attn.k_proj", "transformer.h.{i}.attn.c_attn", conv1d=True, piece=(1, 3)),
    HFName("blocks.{i}.attn.v_proj", "transformer.h.{i}.attn.c_attn", conv1d=True, piece=(2, 3)),
    HFName("blocks.{i}.attn.o_proj", "transformer.h.{i}.attn.c_proj", conv1d=True),
    HFName("blocks.{i}.mlp_norm", "transformer.h.{i}.ln_2"),
    HFName("blocks.{i}.mlp.up_proj", "transformer.h.{i}.mlp.c_fc", conv1d=True),
    HFName("blocks.{i}.mlp.down_proj", "transformer.h.{i}.mlp.c_proj", conv1d=True),
    HFName("norm", "transformer.ln_f"),
    HFName("lm_head", "lm_head.weight"),
))

ARCH = Arch(
    name="gpt2",
    title="GPT-2 (LayerNorm, learned positions, GELU MLP)",
    norm="LayerNorm",
    bias=True,
    positions="learned",
    mlp="gelu",
    tie_embeddings=True,
    moe=False,
    hf=HF,
)
