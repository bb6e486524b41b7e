"""Llama (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, rotary positions
(Su et al. 2021), a SwiGLU MLP (Shazeer 2020), grouped-query attention, no biases and
an untied head."""

from .base import Arch, HFFormat, HFName

# LlamaForCausalLM: the same matrices under other names (HF's RoPE rotates halves, as ours)
HF = HFFormat("LlamaForCausalLM", "llama", (
    HFName("wte", "model.embed_tokens"),
    HFName("blocks.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    HFName("blocks.{i}.attn", "model.layers.{i}.self_attn"),  # q_proj, k_proj, v_proj, o_proj
    HFName("blocks.{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm"),
    HFName("blocks.{i}.mlp", "model.layers.{i}.mlp"),  # gate_proj, up_proj, down_proj
    HFName("norm", "model.norm"),
    HFName("lm_head", "lm_head.weight"),
))

ARCH = Arch(
    name="llama",
    title="Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention)",
    norm="RMSNorm",
    bias=False,
    positions="rope",
    mlp="swiglu",
    tie_embeddings=False,
    moe=False,
    hf=HF,
)
