"""Mixtral (Jiang et al. 2024): Llama blocks whose MLP is a sparse mixture of SwiGLU
experts behind a bias-free router that sends each token to its top-k experts."""

from .base import Arch, HFFormat, HFName

# MixtralForCausalLM, the Hub's format: one tensor per expert, w1 = gate, w3 = up, w2 = down
MOE = "model.layers.{i}.block_sparse_moe."
HF = HFFormat("MixtralForCausalLM", "mixtral", (
    HFName("wte", "model.embed_tokens"),
    HFName("blocks.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    HFName("blocks.{i}.attn", "model.layers.{i}.self_attn"),  # q_proj, k_proj, v_proj, o_proj
    HFName("blocks.{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm"),
    HFName("blocks.{i}.mlp.router", MOE + "gate.weight"),
    HFName("blocks.{i}.mlp.gate_proj", MOE + "experts.{e}.w1.weight"),
    HFName("blocks.{i}.mlp.up_proj", MOE + "experts.{e}.w3.weight"),
    HFName("blocks.{i}.mlp.down_proj", MOE + "experts.{e}.w2.weight"),
    HFName("norm", "model.norm"),
    HFName("lm_head", "lm_head.weight"),
))

ARCH = Arch(
    name="mixtral",
    title="Mixtral (Llama attention, a router and SwiGLU experts)",
    norm="RMSNorm",
    bias=False,
    positions="rope",
    mlp="swiglu",
    tie_embeddings=False,
    moe=True,
    hf=HF,
)
