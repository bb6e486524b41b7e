"""Llama (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, rotary positions
(Su et al. 2021), a SwiGLU MLP (Shazeer 2020), grouped-query attention, no biases and
an untied head."""

from .base import Arch

ARCH = Arch(
    name="llama",
    title="Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention)",
    norm="RMSNorm",
    bias=False,
    positions="rope",
    mlp="swiglu",
    tie_embeddings=False,
    moe=False,
)
