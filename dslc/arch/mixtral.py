"""Mixtral (Jiang et al. 2024): Llama blocks whose MLP is a sparse mixture of SwiGLU
experts behind a bias-free router that sends each token to its top-k experts."""

from .base import Arch

ARCH = Arch(
    name="mixtral",
    title="Mixtral (Llama attention, a router and SwiGLU experts)",
    norm="RMSNorm",
    bias=False,
    positions="rope",
    mlp="swiglu",
    tie_embeddings=False,
    moe=True,
    cp_methods=(),
    cp_why="its router's load-balancing loss is computed over whole sequences, which cp splits",
)
