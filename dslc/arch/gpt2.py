"""GPT-2 (Radford et al. 2019): pre-LayerNorm blocks with biases, learned positions, a
GELU MLP of 4h, and the head tied to the token embedding."""

from .base import Arch

ARCH = Arch(
    name="gpt2",
    title="GPT-2 (LayerNorm, learned positions, GELU MLP)",
    norm="LayerNorm",
    bias=True,
    positions="learned",
    mlp="gelu",
    tie_embeddings=True,
    moe=False,
)
